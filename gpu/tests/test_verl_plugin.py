"""Registration of the ``hf`` rollout in real verl 0.9.1 (needs verl and its import chain: see gpu/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# verl imports Ray's state API from its old place; the warning is Ray's, not the harness's
pytestmark = pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning")


def test_verl_own_hook_registers_hf_in_both_registries() -> None:
    """In a fresh interpreter, VERL_USE_EXTERNAL_MODULES alone makes verl resolve rollout name `hf`."""
    probe = (
        "import verl\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "print(get_rollout_class('hf', 'async').__qualname__, get_rollout_replica_class('hf').__qualname__)\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "gpu.verl_plugin", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["HFServerAdapter", "HFReplica"]


def test_without_the_hook_verl_does_not_know_hf() -> None:
    probe = "from verl.workers.rollout.base import get_rollout_class\nget_rollout_class('hf', 'async')\n"
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "Rollout hf with mode async not found" in out.stderr


@pytest.fixture(scope="module")
def ray_local() -> Any:
    import ray

    env = {"env_vars": {"PYTHONPATH": str(REPO), "VERL_USE_EXTERNAL_MODULES": "gpu.verl_plugin"}}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=env, log_to_driver=False)
    yield ray
    ray.shutdown()


class _TrainerWorker:
    """Stands in for a verl trainer worker: only its node and accelerators are asked for."""


def _replica(tiny_root: Path, ray_local: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.workers.config import HFModelConfig

    from gpu.verl_plugin import HFReplica

    rollout = OmegaConf.load(Path(__import__("verl").__file__).parent / "trainer/config/rollout/rollout.yaml")
    overrides = {
        "name": "hf",
        "dtype": "float32",
        "response_length": 8,
        "prompt_length": 32,
        "tensor_model_parallel_size": 1,
    }
    config = OmegaConf.merge(rollout, overrides)
    config.pop("defaults", None)
    model = HFModelConfig(path=str(tiny_root / "model"))
    replica = HFReplica(replica_rank=0, config=config, model_config=model, gpus_per_node=1)
    replica.workers = [ray_local.remote(_TrainerWorker).remote()]
    return replica


def test_replica_serves_generate_and_the_adapter_syncs_weights(tiny_root: Path, ray_local: Any) -> None:
    """The real replica, server and adapter, on a local Ray on CPU: generate, abort/resume, a weight sync."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from gpu.verl_plugin import HFServerAdapter

    replica = _replica(tiny_root, ray_local)
    asyncio.run(replica.launch_servers())
    server = replica.server_handle
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = ray_local.get(server.generate.remote("r1", prompt_ids=[5, 6, 7], sampling_params=params))
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    assert all(lp <= 0 for lp in out.log_probs) and out.stop_reason in {"completed", "length"}

    before = ray_local.get(server.weights_fingerprint.remote())
    trained = AutoModelForCausalLM.from_pretrained(tiny_root / "model", dtype=torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    os.environ["RANK"] = "0"
    adapter = HFServerAdapter(config=replica.config, model_config=replica.model_config, device_mesh=None)
    asyncio.run(adapter.update_weights(((n, t) for n, t in trained.state_dict().items()), global_steps=7))
    after = ray_local.get(server.weights_fingerprint.remote())
    expected = float(sum(p.detach().double().sum() for p in trained.parameters()))
    assert after != before and abs(after - expected) < 1e-3 * max(1.0, abs(expected))
    out = ray_local.get(server.generate.remote("r2", prompt_ids=[5, 6, 7], sampling_params=params))
    assert out.extra_fields["global_steps"] == 7

    concurrent = [
        server.generate.remote(f"c{i}", prompt_ids=[5] * (1 + i % 3), sampling_params=params) for i in range(8)
    ]
    outs = ray_local.get(concurrent)
    assert all(o.token_ids and len(o.log_probs) == len(o.token_ids) for o in outs)
    requests, batches = ray_local.get(server.served.remote())
    assert requests == 10 and batches < requests  # the 8 concurrent requests shared generate() calls

    ray_local.get(server.abort_all_requests.remote(reject_request=True))
    with pytest.raises(ray_local.exceptions.RayTaskError, match="generation is aborted"):
        ray_local.get(server.generate.remote("r3", prompt_ids=[5], sampling_params=params))
    ray_local.get(server.resume_generation.remote())
    assert ray_local.get(server.generate.remote("r4", prompt_ids=[5], sampling_params=params)).token_ids
    ray_local.kill(server)
