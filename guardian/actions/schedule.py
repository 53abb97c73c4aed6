"""What a verl launch's effective config says about its saves and validation, and whether pins can keep up.

``read_saves`` reads ``save_freq``, ``test_freq``, ``total_training_steps``, ``max_actor_ckpt_to_keep`` and
``validation_data_dir`` (command line, config file, verl's defaults). ``retention_problem`` is pure: step N's save is
deleted by the save at N + save_freq × keep, and must be judged (N + ``healthy_window_steps``) before then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from guardian import verl_keys
from guardian.core import StepSchedule
from guardian.overrides import EffectiveConfig
from guardian.verl_keys import PatchError


@dataclass(frozen=True, slots=True)
class Saves:
    """A launch's saves and validation: which steps, how many checkpoints verl keeps, where validation dumps go."""

    schedule: StepSchedule
    keep: int | None  # trainer.max_actor_ckpt_to_keep (None: all)
    validation_dir: Path | None  # trainer.validation_data_dir, absolute against the launch cwd (None: no dumps)


def read_saves(argv: Sequence[str], cwd: Path) -> Saves:
    """The saves of launch ``argv`` as the trainer will see them; a value the guardian cannot read (an interpolation,
    a key it cannot find) counts as not set."""
    eff = EffectiveConfig.of(argv, verl_keys.defaults(), cwd)

    def number(key: str) -> int | None:
        try:
            value = eff.get(key)
        except PatchError:
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    try:
        dump = eff.get("trainer.validation_data_dir")
    except PatchError:
        dump = None
    schedule = StepSchedule(
        save_freq=number("trainer.save_freq") or 0,
        test_freq=number("trainer.test_freq") or 0,
        last_step=number("trainer.total_training_steps"),
    )
    folder = cwd / dump if isinstance(dump, str) and dump and "${" not in dump else None
    return Saves(schedule, number("trainer.max_actor_ckpt_to_keep"), folder)


def retention_problem(healthy_window_steps: int, save_freq: int, keep: int | None) -> str | None:
    """Why verl's retention deletes a checkpoint before the guardian can pin it; None when it cannot."""
    if save_freq <= 0 or keep is None or keep <= 0:
        return None
    lifetime = save_freq * keep
    if healthy_window_steps < lifetime:
        return None
    return (
        f"checkpoints.healthy_window_steps={healthy_window_steps} is not below trainer.save_freq={save_freq} x "
        f"trainer.max_actor_ckpt_to_keep={keep} = {lifetime}: verl deletes each checkpoint {lifetime} steps after "
        f"saving it, before the guardian has judged the {healthy_window_steps} steps after it, so no checkpoint is "
        f"ever pinned and a rollback may find none; set checkpoints.healthy_window_steps below {lifetime} or raise "
        "trainer.max_actor_ckpt_to_keep"
    )
