"""The harness's scenarios and the exact trainer command each one runs (pure: no process, no file).

A scenario is a training run with a role: ``collapse`` (a wrong-signed entropy bonus; the guardian must detect,
stop, roll back, patch, resume and prove the fix), ``healthy`` (a sound config: the guardian must not intervene),
``collapse-kill`` (the collapse, with the guardian SIGKILLed once the patched trainer is launched and re-attached)
and ``unguarded`` (the healthy config without the guardian: the baseline of the guardian's overhead on step time).

Two trainers build the command: ``verl`` (real verl 0.9.1 with the tiny Qwen2 of ``gpu.tiny`` and the ``hf``
rollout of ``gpu.verl_plugin``, on the GPU machine) and ``cpu`` (the guardian's own CPU trainer with verl's command
line, to rehearse the whole harness on a laptop). Settings are recorded here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

LR_KEY = "actor_rollout_ref.actor.optim.lr"
ENTROPY_KEY = "actor_rollout_ref.actor.entropy_coeff"
KILL_AFTER_EVENT = "event=attempt_launched attempt=2"
"""guardian.log line after which ``collapse-kill`` SIGKILLs its guardian: the patched trainer has just started."""
KILL_DELAY_S = 5.0
"""seconds between that line and the SIGKILL: the relaunched trainer is alive, its first step not yet logged"""


@dataclass(frozen=True)
class Scenario:
    name: str
    guarded: bool
    overrides: Mapping[str, str]
    kill_guardian: bool = False
    expect_intervention: bool = False
    total_steps: int = 0

    @property
    def run_id(self) -> str:
        return f"gpu-{self.name}"


@dataclass(frozen=True)
class TrainerSetup:
    """What every scenario of one trainer shares."""

    kind: str  # "verl" or "cpu"
    python: str = "python3"
    tiny: Path | None = None  # gpu.tiny output (verl only)
    extra: Mapping[str, str] = field(default_factory=dict)


# The broken setting of the earlier real runs (run-a: collapse ~step 15 with lr 1e-3 and entropy_coeff -0.1) and a
# sound one (verl's default entropy_coeff 0, lr 1e-4, a small KL loss).
VERL_COLLAPSE = {LR_KEY: "1e-3", ENTROPY_KEY: "-0.1", "actor_rollout_ref.actor.use_kl_loss": "False"}
VERL_HEALTHY = {
    LR_KEY: "1e-4",
    ENTROPY_KEY: "0",
    "actor_rollout_ref.actor.use_kl_loss": "True",
    "actor_rollout_ref.actor.kl_loss_coef": "0.001",
}
CPU_COLLAPSE = {LR_KEY: "2e-5", ENTROPY_KEY: "-0.3", "+trainer.seed": "1"}
CPU_HEALTHY = {LR_KEY: "2e-5", ENTROPY_KEY: "0", "+trainer.seed": "1"}


def scenarios(kind: str, *, collapse_steps: int, healthy_steps: int) -> dict[str, Scenario]:
    collapse, healthy = (VERL_COLLAPSE, VERL_HEALTHY) if kind == "verl" else (CPU_COLLAPSE, CPU_HEALTHY)
    return {
        s.name: s
        for s in (
            Scenario("collapse", True, collapse, expect_intervention=True, total_steps=collapse_steps),
            Scenario(
                "collapse-kill",
                True,
                collapse,
                kill_guardian=True,
                expect_intervention=True,
                total_steps=collapse_steps,
            ),
            Scenario("healthy", True, healthy, total_steps=healthy_steps),
            Scenario("unguarded", False, healthy, total_steps=healthy_steps),
        )
    }


def verl_overrides(tiny: Path, run_dir: Path, total_steps: int) -> dict[str, str]:
    """The tiny run's verl 0.9.1 overrides (../shared/docs/verl-on-gpu-notes.md says why each one matters)."""
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "False",
        "data.train_files": str(tiny / "data" / "train.parquet"),
        "data.val_files": str(tiny / "data" / "test.parquet"),
        "data.train_batch_size": "32",
        "data.max_prompt_length": "32",
        "data.max_response_length": "16",
        "data.dataloader_num_workers": "0",
        "actor_rollout_ref.model.path": str(tiny / "model"),
        "actor_rollout_ref.model.use_remove_padding": "False",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "False",
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.actor.use_torch_compile": "False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile": "False",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.n": "4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "16",
        "actor_rollout_ref.rollout.agent.num_workers": "2",
        "reward.custom_reward_function.path": str(tiny / "tiny_reward.py"),
        "reward.custom_reward_function.name": "compute_score",
        "reward.num_workers": "2",
        "trainer.logger": '["console","file"]',
        "trainer.project_name": "tiny_verl",
        "trainer.experiment_name": run_dir.name,
        "trainer.nnodes": "1",
        "trainer.n_gpus_per_node": "1",
        "trainer.total_epochs": "1000",
        "trainer.total_training_steps": str(total_steps),
        "trainer.val_before_train": "False",
        "trainer.test_freq": "-1",
        "trainer.save_freq": "3",
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(run_dir / "ckpt"),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": "2",
        "ray_kwargs.ray_init.num_cpus": "16",
    }


def cpu_overrides(run_dir: Path, total_steps: int) -> dict[str, str]:
    return {
        "trainer.total_training_steps": str(total_steps),
        "trainer.total_epochs": "1000",
        "trainer.save_freq": "10",
        "trainer.logger": '["console","file"]',
        "trainer.default_local_dir": str(run_dir / "ckpt"),
    }


def trainer_command(setup: TrainerSetup, scenario: Scenario, run_dir: Path) -> list[str]:
    """argv of the scenario's trainer (what ``guardian run --`` receives, or what runs bare when unguarded)."""
    if setup.kind == "verl":
        if setup.tiny is None:
            raise ValueError("gpu.scenarios: the verl trainer needs the tiny model folder (gpu.tiny --out)")
        base = verl_overrides(setup.tiny, run_dir, scenario.total_steps)
        module = "verl.trainer.main_ppo"
    elif setup.kind == "cpu":
        base = cpu_overrides(run_dir, scenario.total_steps)
        module = "guardian.demo.trainer"
    else:
        raise ValueError(f"gpu.scenarios: unknown trainer {setup.kind!r} (verl or cpu)")
    merged = {**base, **scenario.overrides, **setup.extra}
    return [setup.python, "-m", module, *(f"{k}={v}" for k, v in merged.items())]


def guardian_yaml(home: Path, kind: str) -> str:
    """The guardian's config for a scenario: real verl starts in ~150 s and steps every ~5 s."""
    if kind == "verl":
        return (
            f"home: {home}\n"
            "intervention: {probation_steps: 8, startup_seconds: 400, stop_sigint_s: 20, stop_sigterm_s: 10}\n"
            "checks: {stall: {startup_seconds: 600}}\n"
        )
    return f"home: {home}\nintervention: {{probation_steps: 8, stop_sigint_s: 5, stop_sigterm_s: 5}}\n"
