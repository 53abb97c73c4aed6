"""The ``hf`` rollout backend for verl 0.9.1, loaded in every verl process through ``VERL_USE_EXTERNAL_MODULES``.

verl 0.9.1 knows only vLLM / SGLang / TRT-LLM rollouts, in two registries that both have to name ``hf``:

* ``verl/workers/rollout/base.py:89`` ``_ROLLOUT_REGISTRY[(name, mode)]`` → dotted path of the ``BaseRollout``
  adapter that lives inside the trainer workers (``get_rollout_class``, called at
  ``verl/workers/engine_workers.py:667`` and ``verl/checkpoint_engine/base.py:343``);
* ``verl/workers/rollout/replica.py:312`` ``RolloutReplicaRegistry`` → the ``RolloutReplica`` that launches the
  generation servers (``get_rollout_replica_class``).

Importing this module registers both; ``verl/__init__.py:49`` imports every module named in
``VERL_USE_EXTERNAL_MODULES`` (comma-separated), and Ray workers inherit the driver's environment.

SKELETON: registration is real and tested; the adapter's and replica's bodies are not written yet (they raise
``NotImplementedError`` naming what is missing). The generate contract they will serve is ``gpu.hf_generate``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

NAME = "hf"
MODE = "async"


class HFServerAdapter(BaseRollout):
    """Inside each trainer worker: pushes the actor's weights to the ``hf`` server after each step.

    verl's V1 sync trainer forces ``checkpoint_engine.backend=naive`` (``verl/trainer/ppo/v1/trainer_base.py:382``),
    so ``update_weights`` receives the ``(name, tensor)`` generator of the FSDP actor and must drain it on every rank
    (the FSDP all-gathers run inside it) before rank 0 sends the state dict to the server.
    """

    async def resume(self, tags: list[str]) -> None:
        raise NotImplementedError("gpu.verl_plugin.HFServerAdapter.resume: not written yet (issue 11)")

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        raise NotImplementedError("gpu.verl_plugin.HFServerAdapter.update_weights: not written yet (issue 11)")

    async def release(self) -> None:
        raise NotImplementedError("gpu.verl_plugin.HFServerAdapter.release: not written yet (issue 11)")


class HFReplica(RolloutReplica):
    """Starts one Ray actor per replica that serves ``generate`` through ``gpu.hf_generate`` (TP=1, text only)."""

    async def launch_servers(self) -> None:
        raise NotImplementedError("gpu.verl_plugin.HFReplica.launch_servers: not written yet (issue 11)")


def _load_replica() -> type[RolloutReplica]:
    return HFReplica


def register() -> None:
    """Name ``hf`` in both registries (idempotent)."""
    rollout_base._ROLLOUT_REGISTRY[(NAME, MODE)] = f"{__name__}.{HFServerAdapter.__name__}"
    RolloutReplicaRegistry.register(NAME, _load_replica)


register()
