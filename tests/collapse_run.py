"""The demo's entropy collapse as a command and a guardian config paced for it, shared by the tests that run it
under ``guardian run`` (tests/e2e) and those that are refused before it starts."""

from __future__ import annotations

import sys
from pathlib import Path

from guardian.config import GuardianConfig

LR_KEY = "actor_rollout_ref.actor.optim.lr"
ENTROPY_KEY = "actor_rollout_ref.actor.entropy_coeff"


def collapse_command(ckpt: Path) -> list[str]:
    """The demo's entropy collapse (a wrong-signed entropy bonus), paced so the guardian meets a live
    trainer: entropy runs out while the reward stalls near 0.3, the first checkpoints are still healthy."""
    return [
        sys.executable,
        "-m",
        "guardian.demo.trainer",
        "trainer.total_training_steps=110",
        "trainer.total_epochs=1000",
        "trainer.save_freq=10",
        f"trainer.default_local_dir={ckpt}",
        f"{LR_KEY}=2e-5",
        f"{ENTROPY_KEY}=-0.3",
        "+trainer.seed=1",
        "+trainer.fault.slow_steps=0.02",
    ]


def config_for(home: Path) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "sources": {"poll_interval_s": 0.05},
            "intervention": {"probation_steps": 15, "stop_sigint_s": 5, "stop_sigterm_s": 5, "stop_sigkill_s": 5},
        }
    )
