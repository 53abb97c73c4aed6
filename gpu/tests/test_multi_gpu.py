"""The multi-GPU harness, rehearsed on CPU: nvidia-smi's answers for 2 and 8 GPUs (hand-written fixtures in the
driver's format), the per-GPU verdict on synthetic evidence of a 2-GPU collapse run, the scenarios' command lines for
N GPUs, the Qwen2.5-7B-shaped model's size, and the detached two-call runner. Nothing here ran on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu import verdict
from gpu.observe import gpu_memory, parse_apps, parse_gpus
from gpu.scenarios import NO_MULTICAST, TrainerSetup, recipe_command, scenarios, trainer_command

SMI = Path(__file__).parent / "fixtures" / "nvidia-smi"
ROOT = Path(__file__).resolve().parents[2]


def smi(kind: str) -> Any:
    answers = {
        "--query-gpu=index,uuid,memory.used,memory.total": (SMI / f"{kind}-query-gpu.csv").read_text(),
        "--query-compute-apps=gpu_uuid,pid,used_memory": (SMI / f"{kind}-compute-apps.csv").read_text(),
    }
    return lambda argv, **_: SimpleNamespace(stdout=answers[argv[1]])


# ------------------------------------------------------------------------------------------------ observe


def test_two_gpus_memory_by_index_and_every_process_on_its_gpu() -> None:
    seen = gpu_memory(smi("x2"), which=lambda name: "/usr/bin/nvidia-smi")
    assert seen is not None
    assert seen["used_mib"] == [2724.0, 2171.0] and seen["total_mib"] == [143771.0, 143771.0]
    by_gpu = {g: sorted(a["pid"] for a in seen["apps"] if a["gpu"] == g) for g in (0, 1)}
    assert by_gpu == {0: [4201, 4412, 4690], 1: [4413, 4693]}
    per_gpu = {g: sum(a["mib"] for a in seen["apps"] if a["gpu"] == g) for g in (0, 1)}
    assert per_gpu == {0: 2716.0, 1: 2162.0}


def test_eight_gpus_listed_out_of_order_and_an_unreadable_reading_kept_as_a_holder() -> None:
    seen = gpu_memory(smi("x8"), which=lambda name: "/usr/bin/nvidia-smi")
    assert seen is not None and len(seen["used_mib"]) == 8
    assert [len([a for a in seen["apps"] if a["gpu"] == g]) for g in range(8)] == [3, 2, 2, 2, 2, 2, 2, 2]
    assert {a["gpu"] for a in seen["apps"] if a["pid"] in (21052, 21051)} == {2, 1}  # by UUID, not by line order
    na = next(a for a in seen["apps"] if a["pid"] == 21405)
    assert na == {"pid": 21405, "mib": 0.0, "gpu": 5}


def test_unknown_uuids_and_noise_lines() -> None:
    gpus = parse_gpus("0, GPU-a, 10, 100\nNo devices were found\n1, GPU-b, [N/A], 100\n")
    assert [(g["index"], g["used"]) for g in gpus] == [(0, 10.0), (1, None)]
    apps = parse_apps("GPU-z, 12, 5\nGPU-a, [N/A], 0\n", {"GPU-a": 0})
    assert apps == [{"pid": 12, "mib": 5.0, "gpu": -1}]


# ------------------------------------------------------------------------------------------------ verdict

T0 = 1_800_000_000.0
WORKER, SERVER, DRIVER = {0: 4412, 1: 4413}, {0: 4690, 1: 4693}, 4201


def log_line(at: float, level: str, name: str, event: str, fields: str) -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return f"{stamp} {level} {name} event={event} {fields}"


def two_gpu_run(
    tmp: Path, *, freed_after: dict[int, float], survivor: int | None = None, one_gpu_only: bool = False
) -> dict[str, Any]:
    """Synthetic evidence of a 2-GPU collapse run: attempt 1 (pgid 561) holds a worker and a server on each GPU, is
    signalled at T0+100, gone at T0+104, attempt 2 launches at T0+105. ``freed_after``: seconds after the signal at
    which each GPU's processes of attempt 1 vanish from nvidia-smi; ``survivor``: a pid of attempt 1 still listed
    after the relaunch."""
    s = scenarios("verl", collapse_steps=28, healthy_steps=20, gpus=2)["collapse"]
    run = tmp / "collapse" / "runs" / s.run_id
    run.mkdir(parents=True)
    lines = [
        log_line(T0, "INFO", "guardian.launcher", "attempt_launched", f"attempt=1 pid=561 dir={run}/attempt-1"),
        log_line(T0 + 90, "WARNING", "guardian.daemon", "incident_opened", "id=1 step=18"),
        log_line(T0 + 100, "INFO", "guardian.process", "trainer_signal", "pgid=561 signal=SIGINT step=1/3"),
        log_line(
            T0 + 104,
            "INFO",
            "guardian.process",
            "trainer_stop",
            'pgid=561 signals=SIGINT seconds=3.9 result=gone exit="exit code 1"',
        ),
        log_line(T0 + 105, "INFO", "guardian.launcher", "attempt_launched", f"attempt=2 pid=5410 dir={run}/attempt-2"),
    ]
    (run / "guardian.log").write_text("\n".join(lines) + "\n")
    (tmp / "collapse" / "store.json").write_text("{}")
    pids_1 = [561, DRIVER, *WORKER.values(), *SERVER.values()]
    rows: list[dict[str, Any]] = []
    for t in range(0, 140):
        at = T0 + t
        alive = [p for p in pids_1 if t < 100 + max(freed_after.values())]
        if survivor is not None and survivor not in alive:
            alive.append(survivor)
        rows.append(
            {
                "t": at,
                "kind": "procs",
                "attempts": {
                    f"/w/collapse/.guardian/runs/{s.run_id}/attempt-1/metrics.jsonl": {
                        "pids": alive,
                        "drivers": [DRIVER] if DRIVER in alive else [],
                    }
                },
            }
        )
        apps = [
            {"pid": pid, "mib": mib, "gpu": 0 if one_gpu_only else g}
            for g in (0, 1)
            for pid, mib in ((WORKER[g], 1416.0), (SERVER[g], 746.0))
            if t < 100 + freed_after[g] or pid == survivor
        ]
        rows.append({"t": at + 0.5, "kind": "gpu", "used_mib": [0.0, 0.0], "apps": apps})
    (tmp / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    judged = verdict.judge(tmp, {"collapse": s}, {"collapse": {"returncodes": [0]}}, timed_out=False)
    return judged["scenarios"]["collapse"]


def gpu_checks(judged: dict[str, Any]) -> dict[str, bool]:
    names = ("every_gpu_held_by_the_attempt", "gpu_memory_released", "every_gpu_released_within_30s")
    return {c["name"]: c["passed"] for c in judged["checks"] if c["name"] in names}


def test_two_gpus_each_released_in_time_pass_and_the_figures_are_per_gpu(tmp_path: Path) -> None:
    judged = two_gpu_run(tmp_path, freed_after={0: 2.0, 1: 3.0})
    assert gpu_checks(judged) == dict.fromkeys(
        ("every_gpu_held_by_the_attempt", "gpu_memory_released", "every_gpu_released_within_30s"), True
    )
    (stop,) = judged["measures"]["stops"]
    assert stop["attempt"] == 1 and stop["stop_s"] == 3.9
    assert stop["mib_before"] == {0: 2162.0, 1: 2162.0} and stop["holders_before"] == {0: 2, 1: 2}
    assert stop["released_s"] == {0: 2.5, 1: 3.5}  # the first GPU sample (every second, +0.5 s) without them
    assert judged["measures"]["gpu_freed_s_after_stop_signal"] == 3.5


def test_a_rollout_server_left_on_gpu_1_fails_the_release(tmp_path: Path) -> None:
    judged = two_gpu_run(tmp_path, freed_after={0: 2.0, 1: 3.0}, survivor=SERVER[1])
    checks = gpu_checks(judged)
    assert checks == {
        "every_gpu_held_by_the_attempt": True,
        "gpu_memory_released": False,
        "every_gpu_released_within_30s": False,
    }
    (stop,) = judged["measures"]["stops"]
    assert stop["survivors_on_gpu"] == [SERVER[1]] and stop["released_s"][1] is None


def test_a_gpu_freed_only_after_45_s_is_late(tmp_path: Path) -> None:
    checks = gpu_checks(two_gpu_run(tmp_path, freed_after={0: 2.0, 1: 45.0}))
    assert checks == {
        "every_gpu_held_by_the_attempt": True,
        "gpu_memory_released": False,  # still held when attempt 2 launched (T0+105)
        "every_gpu_released_within_30s": False,
    }


def test_ranks_and_replicas_all_on_gpu_0_fail_the_spread(tmp_path: Path) -> None:
    checks = gpu_checks(two_gpu_run(tmp_path, freed_after={0: 2.0, 1: 2.0}, one_gpu_only=True))
    assert checks["every_gpu_held_by_the_attempt"] is False
    assert checks["gpu_memory_released"] and checks["every_gpu_released_within_30s"]


def test_stops_are_matched_to_attempts_by_process_group() -> None:
    lines = [
        log_line(T0, "INFO", "l", "attempt_launched", "attempt=1 pid=10"),
        log_line(T0 + 5, "INFO", "p", "trainer_signal", "pgid=10 signal=SIGINT"),
        log_line(T0 + 25, "INFO", "p", "trainer_signal", "pgid=10 signal=SIGTERM"),
        log_line(T0 + 26, "INFO", "p", "trainer_stop", "pgid=10 signals=SIGINT,SIGTERM seconds=21.0 result=gone"),
        log_line(T0 + 27, "INFO", "l", "attempt_launched", "attempt=2 pid=20"),
        log_line(T0 + 90, "INFO", "p", "trainer_stop", "pgid=20 result=already_gone"),
    ]
    (stop,) = verdict.stops(verdict.parse_log("\n".join(lines)))
    assert (stop.attempt, stop.signal_at - T0, stop.relaunch_at and stop.relaunch_at - T0) == (1, 5.0, 27.0)
    assert stop.stop is not None and stop.stop.fields["signals"] == "SIGINT,SIGTERM"


def test_throughput_from_verls_perf_keys() -> None:
    metrics = {
        step: {
            "timing_s/step": 20.0 + step,
            "perf/total_num_tokens": 180_000.0,
            "perf/throughput": 180_000.0 / (20.0 + step) / 8,
            "timing_s/gen": 8.0,
        }
        for step in range(1, 8)
    }
    got = verdict.throughput(metrics)
    assert got["step_time_s_median"] == 25.0 and got["gen_s_median"] == 8.0
    assert got["tokens_per_s_median"] == 7200.0 and got["tokens_per_s_per_gpu_median"] == 900.0


# ------------------------------------------------------------------------------------------------ scenarios


def overrides_of(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))


def test_the_two_gpu_collapse_command() -> None:
    setup = TrainerSetup("verl", tiny=Path("/tmp/tiny"))
    one = overrides_of(
        trainer_command(setup, scenarios("verl", collapse_steps=28, healthy_steps=20)["collapse"], Path("/r"))
    )
    two = overrides_of(
        trainer_command(setup, scenarios("verl", collapse_steps=28, healthy_steps=20, gpus=2)["collapse"], Path("/r"))
    )
    assert one["trainer.n_gpus_per_node"] == "1" and not any("NCCL" in k for k in one)  # the proven command
    changed = {k: v for k, v in two.items() if one.get(k) != v}
    assert changed == {
        "trainer.n_gpus_per_node": "2",
        **{f"++ray_kwargs.ray_init.runtime_env.env_vars.{k}": f"'{v}'" for k, v in NO_MULTICAST.items()},
    }  # 16 x 4 / 2 = 32 trajectories a rank per mini-batch: micro-batches of 16 still divide it


@pytest.mark.parametrize(("gpus", "micro"), [(4, "16"), (8, "8")])
def test_micro_batches_shrink_to_each_ranks_share(gpus: int, micro: str) -> None:
    s = scenarios("verl", collapse_steps=28, healthy_steps=20, gpus=gpus)["healthy"]
    o = overrides_of(trainer_command(TrainerSetup("verl", tiny=Path("/t")), s, Path("/r")))
    assert o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == micro
    assert o["ray_kwargs.ray_init.num_cpus"] == str(max(16, 3 * gpus + 10))


def shape_command() -> list[str]:
    s = scenarios("verl", collapse_steps=28, healthy_steps=20)["search-8gpu"]
    assert (s.gpus, s.total_steps, s.shape, s.recipe) == (8, 24, True, True)
    setup = TrainerSetup("verl", search_shape=Path("/tmp/shape-search"), search_corpus=Path("/tmp/c.jsonl"))
    return recipe_command(setup, s, Path("/tmp/harness/search-8gpu"))


def test_the_search_8gpu_command_is_the_recipe_on_eight_gpus_with_the_shape_model() -> None:
    argv = shape_command()
    assert argv[:4] == ["bash", str(ROOT / "recipe" / "run.sh"), "--config", "grpo_qwen7b"]
    assert "--mode observe --run-id gpu-search-8gpu" in argv[5]
    o = overrides_of(argv[7:])
    assert o["actor_rollout_ref.model.path"] == "/tmp/shape-search/model"
    assert o["trainer.n_gpus_per_node"] == "8" and o["actor_rollout_ref.rollout.dtype"] == "bfloat16"
    assert o["actor_rollout_ref.rollout.agent.num_workers"] == "8" and o["reward.num_workers"] == "8"
    assert o["++ray_kwargs.ray_init.runtime_env.env_vars.NCCL_NVLS_ENABLE"] == "'0'"
    # the recipe's own settings are not overridden: dynamic batch sizes, gradient checkpointing, the KL loss
    for key in ("use_dynamic_bsz", "enable_gradient_checkpointing", "use_kl_loss", "ppo_max_token_len_per_gpu"):
        assert not any(key in k for k in o), key


def test_the_commands_compose_and_pass_verls_own_validation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hydra composes each command line exactly as main_ppo would, and verl's validate_config accepts it (the
    batch and micro-batch divisibility rules over the GPU count), on CPU."""
    pytest.importorskip("hydra")
    verl_mod = pytest.importorskip("verl")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import validate_config

    verl_dir = Path(verl_mod.__file__).parent / "trainer" / "config"
    for name, value in {"RECIPE_ROOT": str(ROOT), "RECIPE_DATA": str(tmp_path), "RECIPE_OUT": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)

    def check(config_dir: Path, name: str, overrides: dict[str, str]) -> Any:
        args = [f"{k}={v}" for k, v in overrides.items() if not k.startswith("++ray_kwargs")]
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(name, overrides=[f"hydra.searchpath=[file://{verl_dir}]", *args])
        OmegaConf.resolve(cfg)
        validate_config(cfg, use_reference_policy=True, use_critic=False)
        return cfg

    setup = TrainerSetup("verl", tiny=Path("/tmp/tiny"))
    for gpus in (2, 8):
        s = scenarios("verl", collapse_steps=28, healthy_steps=20, gpus=gpus)["collapse"]
        cfg = check(verl_dir, "ppo_trainer", overrides_of(trainer_command(setup, s, tmp_path)))
        assert cfg.trainer.n_gpus_per_node == gpus
        rollout = cfg.actor_rollout_ref.rollout
        assert gpus // (rollout.tensor_model_parallel_size * rollout.data_parallel_size) == gpus  # one replica a GPU
    argv = shape_command()
    o = overrides_of(argv[7:])
    o["trainer.default_local_dir"] = str(tmp_path / "ckpt")
    cfg = check(ROOT / "recipe" / "configs", "grpo_qwen7b", o)
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.actor_rollout_ref.actor.use_dynamic_bsz
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n % 8 == 0


def test_the_shape_model_is_qwen25_7b_per_layer_with_four_layers() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Qwen2ForCausalLM

    from gpu import tiny

    config = tiny.shape_config("qwen2.5-7b", tiny.SHAPE_LAYERS)
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads) == (3584, 18944, 28)
    assert (config.num_key_value_heads, config.vocab_size, config.num_hidden_layers) == (4, 152064, 4)
    assert config.hidden_size // config.num_attention_heads == 128 and not config.tie_word_embeddings
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 2_022_229_504
    with torch.device("meta"):
        full = Qwen2ForCausalLM(tiny.shape_config("qwen2.5-7b", 28))
    assert sum(p.numel() for p in full.parameters()) == 7_615_616_512  # Qwen2.5-7B's published 7.61 B


# ------------------------------------------------------------------------------------------------ detached runs


def test_the_detached_runner_outlives_its_first_call_and_collect_brings_the_evidence(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "gpu").mkdir(parents=True)
    (repo / "gpu" / "device_detach.sh").write_text((ROOT / "gpu" / "device_detach.sh").read_text())
    (repo / "gpu" / "device.sh").write_text(
        'sleep 3; mkdir -p "$OUT/harness"; echo "$@" > "$OUT/harness/args"\n'
        'tar -C "$OUT" -czf "$OUT/harness.tar.gz" harness; exit 0\n'
    )
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir(), out2.mkdir()
    env = {**os.environ, "WAIT_S": "0", "DETACH_HOME": str(tmp_path / "detached")}
    first = subprocess.run(
        ["bash", "gpu/device_detach.sh", "start", "search-8gpu", "--shape-steps", "24"],
        cwd=repo,
        env={**env, "OUT": str(out1)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert first.returncode == 0 and "still running" in first.stdout, first.stdout + first.stderr
    begun = time.time()
    second = subprocess.run(
        ["bash", "gpu/device_detach.sh", "collect"],
        cwd=repo,
        env={**env, "OUT": str(out2), "WAIT_S": "30"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0 and "device.sh exit 0" in second.stdout, second.stdout + second.stderr
    assert (out2 / "harness.tar.gz").exists() and time.time() - begun < 30
