"""The ``hf`` rollout backend for verl 0.9.1, loaded in every verl process through ``VERL_USE_EXTERNAL_MODULES``.

verl 0.9.1 knows only vLLM / SGLang / TRT-LLM rollouts, in two registries that both have to name ``hf``:

* ``verl/workers/rollout/base.py:89`` ``_ROLLOUT_REGISTRY[(name, mode)]`` → dotted path of the ``BaseRollout``
  adapter that lives inside the trainer workers (``get_rollout_class``, called at
  ``verl/workers/engine_workers.py:667``);
* ``verl/workers/rollout/replica.py:312`` ``RolloutReplicaRegistry`` → the ``RolloutReplica`` that launches the
  generation servers (``get_rollout_replica_class``).

Importing this module registers both; ``verl/__init__.py:49`` imports every module named in
``VERL_USE_EXTERNAL_MODULES`` (comma-separated), and Ray workers inherit the driver's environment.

The pieces, in the order verl meets them:

* ``HFReplica.launch_servers`` (hybrid mode, one replica per ``tensor_model_parallel_size`` trainer ranks; TP=1
  here) starts one ``HFServer`` Ray actor per replica on the node and GPU of its first trainer worker.
* ``HFServer.generate`` is what verl's agent loop calls (``verl/workers/rollout/llm_server.py:150``): one request,
  one sampled response through ``gpu.hf_generate`` (processed log-probs, ``top_k=-1`` → HF ``top_k=0``).
  Requests that arrive together (the agent loop sends a whole batch at once) run as one batched ``generate()``.
* ``HFServerAdapter.update_weights`` runs in every trainer rank after each step (the V1 sync trainer forces
  ``checkpoint_engine.backend=naive``, ``verl/trainer/ppo/v1/trainer_base.py:382``; ``engine_workers.py:728``):
  it drains the ``(name, tensor)`` generator (the FSDP all-gathers run inside it, so every rank must drain it) and
  the replica's leader rank sends the state dict to its server.
* ``sleep`` / ``wake_up`` / ``*_kv_cache`` keep the model where it is (an HF model has no KV cache between
  requests, and the harness's model is small); ``abort_all_requests`` closes the gate for new requests until
  ``resume_generation`` (or fails them when ``reject_request``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import ray
import ray.util.scheduling_strategies
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from gpu.hf_generate import Generated, generate_batch

NAME = "hf"
MODE = "async"
SERVER_PREFIX = "hf_"
BATCH_WINDOW_S = 0.01
"""how long the server lets concurrent requests gather before it generates them together"""
MAX_BATCH = 512
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")

log = logging.getLogger(__name__)


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    """The Ray actor name of a replica's server (the adapter finds its server by it)."""
    return f"{SERVER_PREFIX}server_{replica_rank}_{node_rank}"


class RequestRejected(RuntimeError):
    """A request arrived after ``abort_all_requests(reject_request=True)``."""


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    max_new_tokens: int
    future: asyncio.Future[Generated]

    @property
    def stop(self) -> tuple[str, ...]:
        value = self.sampling_params.get("stop") or ()
        return (value,) if isinstance(value, str) else tuple(value)

    @property
    def key(self) -> tuple[Any, ...]:
        """Requests with the same key can share one ``generate()`` call (each keeps its own token budget)."""
        return (self.stop, *(self.sampling_params.get(k) for k in SAMPLING_KEYS))


class HFServer:
    """One replica's generation server: a transformers causal LM on the replica's GPU (CPU when there is none)."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        max_new_tokens: int,
        replica_rank: int,
        cuda_visible_devices: str | None,
    ) -> None:
        if cuda_visible_devices is not None:
            # before the first CUDA call of this process: the server sees exactly its replica's GPU
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        self.replica_rank = replica_rank
        self.max_new_tokens = max_new_tokens
        self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(self.device)
        self.model.eval()
        self.model_path = model_path
        self._tokenizer: Any = None  # loaded on the first request with stop strings
        config = AutoConfig.from_pretrained(model_path)
        try:
            generation = GenerationConfig.from_pretrained(model_path)
        except OSError:
            generation = GenerationConfig()
        eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
        self.eos_token_id = int(eos[0] if isinstance(eos, list) else eos)
        pad = generation.pad_token_id if generation.pad_token_id is not None else config.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
        self.global_steps: int | None = None
        self.weight_version = 0
        self._lock = asyncio.Lock()  # one generate() or weight load at a time
        self._open = asyncio.Event()
        self._open.set()
        self._reject = False
        self._queue: list[_Request] = []
        self._arrived = asyncio.Event()
        self._batcher: asyncio.Task[None] | None = None
        self.requests_served = 0
        self.batches_run = 0

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError(f"hf rollout request {request_id}: text only (image/video data given)")
        if not self._open.is_set():
            if self._reject:
                raise RequestRejected(f"hf rollout request {request_id}: generation is aborted")
            await self._open.wait()
        max_new_tokens = int(sampling_params.get("max_tokens", sampling_params.get("max_new_tokens", 0)) or 0)
        max_new_tokens = min(max_new_tokens or self.max_new_tokens, self.max_new_tokens)
        future: asyncio.Future[Generated] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(prompt_ids), dict(sampling_params), max_new_tokens, future))
        self._arrived.set()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        out = await future
        return TokenOutput(
            token_ids=out.token_ids,
            log_probs=out.log_probs,
            stop_reason=out.stop_reason,
            extra_fields={"global_steps": self.global_steps},
        )

    async def _run_batches(self) -> None:
        while True:
            await self._arrived.wait()
            await asyncio.sleep(BATCH_WINDOW_S)  # the rest of the agent loop's batch is on its way
            self._arrived.clear()
            while self._queue:
                key = self._queue[0].key
                batch = [r for r in self._queue if r.key == key][:MAX_BATCH]
                self._queue = [r for r in self._queue if r not in batch]
                async with self._lock:
                    try:
                        results = await asyncio.to_thread(
                            generate_batch,
                            self.model,
                            [r.prompt_ids for r in batch],
                            batch[0].sampling_params,
                            max_new_tokens=[r.max_new_tokens for r in batch],
                            eos_token_id=self.eos_token_id,
                            pad_token_id=self.pad_token_id,
                            stop=batch[0].stop,
                            tokenizer=self.tokenizer() if batch[0].stop else None,
                        )
                    except Exception as exc:  # every request of the batch gets the error, the server goes on
                        for r in batch:
                            if not r.future.done():
                                r.future.set_exception(exc)
                        continue
                self.batches_run += 1
                self.requests_served += len(batch)
                for r, result in zip(batch, results, strict=True):
                    if not r.future.done():
                        r.future.set_result(result)

    def tokenizer(self) -> Any:
        """The model folder's tokenizer (HF's stop-string criterion needs it)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def served(self) -> tuple[int, int]:
        """(requests, batches) served so far."""
        return self.requests_served, self.batches_run

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's full (HF-named) state dict; returns how many tensors were loaded."""
        async with self._lock:
            result = self.model.load_state_dict(state_dict, strict=False)
            missing = [k for k in result.missing_keys if not k.endswith("lm_head.weight")]
            if missing or result.unexpected_keys:
                raise KeyError(
                    f"hf rollout server {self.replica_rank}: weight sync does not match the model "
                    f"(missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})"
                )
            if self.model.config.tie_word_embeddings:
                self.model.tie_weights()
            self.weight_version += 1
            if global_steps is not None:
                self.global_steps = global_steps
        return len(state_dict)

    def weights_fingerprint(self) -> float:
        """Sum of every parameter: lets tests see a weight sync arrive."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        self._reject = reject_request
        self._open.clear()
        return {}

    async def resume_generation(self) -> None:
        self._reject = False
        self._open.set()

    async def wake_up(self) -> None:
        """The model stays resident between steps: nothing to restore."""

    async def sleep(self) -> None:
        """The model stays resident between steps: nothing to free."""

    async def clear_kv_cache(self) -> None:
        """HF ``generate()`` keeps no KV cache between requests."""

    async def release_kv_cache(self) -> None:
        """HF ``generate()`` keeps no KV cache between requests."""

    async def resume_kv_cache(self) -> None:
        """HF ``generate()`` keeps no KV cache between requests."""

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling is not offered by this backend."""

    async def stop_profile(self) -> None:
        """Profiling is not offered by this backend."""


def _cpu_state_dict(
    weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The full tensors on CPU; floating ones in the server's ``dtype`` (cast on the GPU first: a bf16 server of
    2 B parameters gets 4 GB through Ray's object store a step instead of the actor's 8 GB of fp32)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        if dtype is not None and full.is_floating_point() and full.dtype != dtype:
            full = full.to(dtype)
        state[name] = full.detach().to("cpu", copy=True)
    return state


class HFServerAdapter(BaseRollout):
    """Inside each trainer worker: pushes the actor's weights to the replica's ``hf`` server after each step."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        if rollout_world_size != 1:
            raise ValueError(
                f"hf rollout: tensor/data/pipeline parallel size {rollout_world_size} per replica; only 1 is supported"
            )
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // rollout_world_size
        self.is_leader_rank = rank % rollout_world_size == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Weights and KV cache never leave the server (``HFServer.sleep`` keeps them)."""

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout: weight wire format {wire_format!r}; only 'named_tensors' is supported")
        if kwargs.get("peft_config") is not None:
            raise ValueError("hf rollout: LoRA adapter sync is not supported (use model.lora.merge=True)")
        dtype = getattr(torch, str(self.config.dtype), None) if self.config.dtype else None
        # every rank drains: the FSDP all-gathers run inside the generator
        state = _cpu_state_dict(weights, dtype if isinstance(dtype, torch.dtype) else None)
        if self.is_leader_rank:
            await self._server_handle().update_weights.remote(state, kwargs.get("global_steps"))

    async def release(self) -> None:
        """Weights and KV cache never leave the server (``HFServer.sleep`` keeps them)."""


class HFReplica(RolloutReplica):
    """Starts one ``HFServer`` actor per replica on the node and GPU of the replica's trainer worker."""

    async def launch_servers(self) -> None:
        if self.world_size != 1 or self.nnodes != 1:
            raise ValueError(f"hf rollout: replica world size {self.world_size} over {self.nnodes} nodes; only 1")
        if len(self.workers) != 1:
            raise ValueError(f"hf rollout replica {self.replica_rank}: {len(self.workers)} workers, expected 1")
        node_id, devices = await self.workers[0].__ray_call__.remote(_node_and_devices)
        name = server_name(self.replica_rank)
        server = (
            ray.remote(HFServer)
            .options(
                name=name,
                num_cpus=0,
                num_gpus=0,
                max_concurrency=self.max_concurrency,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id, soft=False),
                runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
            )
            .remote(
                model_path=_model_path(self.model_config),
                dtype=self.config.dtype,
                max_new_tokens=self.config.response_length,
                replica_rank=self.replica_rank,
                cuda_visible_devices=devices,
            )
        )
        await server.served.remote()  # raises here, with the server's error, if loading the model failed
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{name}:0"  # a unique key for verl's load balancer; nothing listens on it


def _model_path(model_config: Any) -> str:
    """The local model folder: ``local_path`` where verl filled it in (a DictConfig in struct mode may lack it)."""
    get = model_config.get if hasattr(model_config, "get") else lambda key: getattr(model_config, key, None)
    local = get("local_path")
    return str(local or model_config.path)


def _node_and_devices(worker: Any) -> tuple[str, str | None]:
    context = ray.get_runtime_context()
    gpus = context.get_accelerator_ids().get("GPU") or []
    return context.get_node_id(), (",".join(str(g) for g in gpus) if gpus else None)


def _load_replica() -> type[RolloutReplica]:
    return HFReplica


def register() -> None:
    """Name ``hf`` in both registries (idempotent)."""
    rollout_base._ROLLOUT_REGISTRY[(NAME, MODE)] = f"{__name__}.{HFServerAdapter.__name__}"
    RolloutReplicaRegistry.register(NAME, _load_replica)


register()
