"""Named demo runs: the override strings (and seed) that make each phenomenon happen, for tests and benchmarks.

Scenarios: ``healthy``, ``entropy_collapse`` (the demo's default), ``seed_settings``, ``kl_blowup``, ``nan``,
``hang``, ``crash``, ``length_explosion``. Every run is deterministic for its seed. What each run does, step by
step: docs/decisions/0012-demo-scenarios.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SEED = 1
REWARDS_FILE = str(Path(__file__).with_name("rewards.py"))
ACTOR = "actor_rollout_ref.actor"

# what rung entropy-1 of the default ladder sets on ``entropy_collapse``: the LR and optimizer state stay
ENTROPY_FIX: tuple[str, ...] = (f"{ACTOR}.entropy_coeff=0.003", f"{ACTOR}.clip_ratio_high=0.28")
# the seed tutorial's rescue of ``seed_settings``
RESCUE_PATCH: tuple[str, ...] = (
    f"{ACTOR}.optim.lr=1e-6",
    f"{ACTOR}.use_kl_loss=true",
    f"{ACTOR}.kl_loss_coef=0.01",
    f"{ACTOR}.entropy_coeff=0.005",
    # a fresh optimizer and scheduler, or the checkpoint's LR (5e-5) comes back (facts gotcha 4)
    f"{ACTOR}.checkpoint.load_contents=[model]",
)


@dataclass(frozen=True, slots=True)
class RunFiles:
    """Where a run launched by ``Scenario.command`` writes."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def console(self) -> Path:
        return self.root / "console.log"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named run: overrides on top of the common ones, its length and its seed."""

    name: str
    overrides: tuple[str, ...]
    steps: int
    seed: int = DEFAULT_SEED
    expected_exit_code: int = 0
    finishes: bool = True
    notes: str = ""
    extra: tuple[str, ...] = field(default=())

    def arguments(self, files: RunFiles) -> list[str]:
        """The full override list for a run writing under ``files.root``."""
        return [
            "trainer.logger=[console,file]",
            f"trainer.total_training_steps={self.steps}",
            "trainer.total_epochs=1000",
            f"+trainer.seed={self.seed}",
            f"trainer.rollout_data_dir={files.rollouts}",
            f"trainer.default_local_dir={files.checkpoints}",
            *self.overrides,
            *self.extra,
        ]

    def command(self, files: RunFiles) -> list[str]:
        return [sys.executable, "-m", "guardian.demo.trainer", *self.arguments(files)]

    def environment(self, files: RunFiles) -> dict[str, str]:
        """The current environment plus ``VERL_FILE_LOGGER_PATH`` pointing at ``files.metrics``."""
        return {**os.environ, "VERL_FILE_LOGGER_PATH": str(files.metrics)}

    def with_extra(self, *overrides: str) -> Scenario:
        return Scenario(
            self.name,
            self.overrides,
            self.steps,
            self.seed,
            self.expected_exit_code,
            self.finishes,
            self.notes,
            overrides,
        )

    def run(self, root: Path, *, timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run to completion (not for ``hang``), console output in ``console.log``."""
        files = RunFiles(Path(root))
        files.root.mkdir(parents=True, exist_ok=True)
        with open(files.console, "wb") as log:
            return subprocess.run(
                self.command(files),
                env=self.environment(files),
                cwd=files.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "healthy",
            ("trainer.save_freq=50",),
            steps=300,
            notes="verl's defaults: reward rises steadily, entropy eases, EGR stays above 0.5",
        ),
        Scenario(
            "entropy_collapse",
            (
                f"{ACTOR}.optim.lr=2e-5",
                # the bonus meant as +0.3 with its sign slipped: entropy is penalised (real verl run-a/run-b of
                # tests/fixtures used -0.1 and -0.03 the same way)
                f"{ACTOR}.entropy_coeff=-0.3",
                "trainer.save_freq=5",
            ),
            steps=300,
            notes="a wrong-signed entropy bonus (entropy_coeff=-0.3): entropy halves within ~10 steps while the "
            "reward stalls near 0.3 of a task the same LR solves to 0.9",
        ),
        Scenario(
            "seed_settings",
            (
                f"{ACTOR}.optim.lr=5e-5",
                "actor_rollout_ref.rollout.temperature=0.5",
                f"{ACTOR}.use_kl_loss=true",
                f"{ACTOR}.kl_loss_coef=1e-4",
                # the seed tutorial's YAML warms the LR up (warmup_steps: 100); here over 30 steps, so the
                # first checkpoints are still healthy when the collapse sets in
                f"{ACTOR}.optim.lr_warmup_steps=30",
                "trainer.save_freq=5",
            ),
            steps=300,
            notes="the seed tutorial's settings - LR x50 (warm-up 30 steps), KL 1e-4, temperature 0.5: KL to the "
            "reference grows fast while the reward stalls, then entropy runs out on a plateau near 0.8",
        ),
        Scenario(
            "kl_blowup",
            (
                f"{ACTOR}.optim.lr=2e-5",
                f"{ACTOR}.use_kl_loss=true",
                f"{ACTOR}.kl_loss_coef=1e-4",
                "trainer.save_freq=10",
            ),
            steps=100,
        ),
        Scenario(
            "nan",
            ("+trainer.fault.nan_at_step=20", "trainer.save_freq=10"),
            steps=40,
            notes="corrupt weights from step 20: null grad_norm/entropy, updates skipped, 'aaaa...' outputs",
        ),
        Scenario(
            "hang",
            ("+trainer.fault.hang_at_step=10", "trainer.save_freq=5"),
            steps=30,
            finishes=False,
            notes="the trainer stops making progress at step 10 (no line for step 10, never exits)",
        ),
        Scenario(
            "crash",
            ("+trainer.fault.crash_at_step=15", "+trainer.fault.exit_code=3", "trainer.save_freq=5"),
            steps=30,
            expected_exit_code=3,
            notes="the trainer dies with exit code 3 at step 15, after logging step 14",
        ),
        Scenario(
            "length_explosion",
            (
                "reward.reward_manager.name=dapo",
                "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
                "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=-1.0",
                "+reward.reward_kwargs.max_resp_len=20",
                f"{ACTOR}.optim.lr=2e-5",
            ),
            steps=100,
            notes="DAPO overlong shaping with a slipped sign: responses grow to the cap and end truncated",
        ),
    )
}


def get(name: str) -> Scenario:
    """The named scenario; ``KeyError`` lists the known names."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


def resume_overrides(checkpoint: Path | str, steps: int) -> tuple[str, ...]:
    """Resume a scenario from ``checkpoint`` (a ``global_step_N`` folder), run to ``steps``."""
    return (
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoint}",
        f"trainer.total_training_steps={steps}",
    )


def rescue_overrides(checkpoint: Path | str, steps: int, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Resume ``seed_settings`` from ``checkpoint`` with the seed tutorial's rescue patch."""
    return (*resume_overrides(checkpoint, steps), *RESCUE_PATCH, *extra)
