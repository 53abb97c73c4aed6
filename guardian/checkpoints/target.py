"""The rollback target: the newest healthy checkpoint a rollback can land on, and the path verl resumes from.

Pure: a function of the stored verdicts and the steps available on disk (or as pins). It never falls back to an
unhealthy checkpoint; None means nothing qualifies (the rescue then restarts from scratch once).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar

from guardian.checkpoints.scan import CheckpointError, step_of


class CheckpointLike(Protocol):
    """What rollback selection needs of a checkpoint (store.views.CheckpointView fits)."""

    @property
    def step(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def verdict(self) -> str: ...


C = TypeVar("C", bound=CheckpointLike)


def choose_rollback_target(
    checkpoints: Sequence[C],
    *,
    onset_step: int | None,
    detected_step: int,
    margin_steps: int,
    exclude_steps: Collection[int],
    available: Collection[int],
    skip_newest: int = 0,
) -> C | None:
    """The newest "healthy" checkpoint at or before (onset, else detection) − margin, not excluded, that a rollback
    can land on: ``available`` holds the steps verl can resume from as they are on disk, and those whose folder
    verl's retention emptied but the guardian pinned (the rollback restores them first; guardian.checkpoints.pinning).

    On a relapse the caller excludes the previous target, which moves one further back; ``skip_newest``
    skips that many more qualifying checkpoints (a rung's ``rollback_extra_checkpoints``), as far as there
    are any. None: nothing qualifies; the supervisor then restarts from scratch once
    (``trainer.resume_mode=disable``, the old branch quarantined), else gives up. It never falls back to an
    unhealthy checkpoint.
    """
    limit = (onset_step if onset_step is not None else detected_step) - margin_steps
    qualifying = sorted(
        (
            c
            for c in checkpoints
            if c.verdict == "healthy" and c.step <= limit and c.step not in exclude_steps and c.step in available
        ),
        key=lambda c: c.step,
        reverse=True,
    )
    # a rung's "further back" goes as far back as there are healthy checkpoints, never to none at all
    return qualifying[min(skip_newest, len(qualifying) - 1)] if qualifying else None


def resume_path_for(checkpoint_path: str | os.PathLike[str]) -> str:
    """Absolute ``…/global_step_N`` with no trailing slash: verl asserts 'global_step_' is in it and parses
    ``int(path.split('global_step_')[-1])``, so a trailing slash or another last component breaks resume."""
    text = os.path.abspath(os.path.expanduser(os.fspath(checkpoint_path)))
    if step_of(os.path.basename(text)) is None:
        raise CheckpointError(f"{checkpoint_path}: not a verl checkpoint folder (its name must be global_step_<N>)")
    return text
