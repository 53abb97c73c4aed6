"""What the stall check knows of the step in progress besides its silence. Pure: the disk is read by
``guardian.sources.footprint``, the clock is passed in.

verl logs a step only after saving and validating, so ``StepSchedule`` says which steps save or validate and
``LifeSigns`` remembers when the step's ``global_step_N/`` folder or validation dump last changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guardian.core import Footprint


@dataclass(frozen=True, slots=True)
class LifeSigns:
    """The step in progress (``step``: the newest logged step + 1) as the looks at disk saw it: the last look, and
    when its checkpoint folder (``saved_at``) or validation dump (``dumped_at``) was last seen to change (None: not
    since the step began)."""

    step: int | None = None
    seen: Footprint = field(default_factory=Footprint)
    saved_at: float | None = None
    dumped_at: float | None = None

    def latest_at(self, step: int) -> float | None:
        """When step ``step`` last showed life on disk; None when it did not (or these signs are of another step)."""
        if step != self.step:
            return None
        times = [t for t in (self.saved_at, self.dumped_at) if t is not None]
        return max(times) if times else None


def note_footprint(previous: LifeSigns, step: int, seen: Footprint, now: float) -> LifeSigns:
    """The life signs after a look at disk at ``now``. A change from the previous look at the same step is a sign of
    life; the first look at a step only sets what later ones compare with, so a folder left by an abandoned branch,
    which nothing writes to, is not taken for a save in progress."""
    if previous.step != step:
        return LifeSigns(step, seen)
    saved = now if seen.checkpoint is not None and seen.checkpoint != previous.seen.checkpoint else previous.saved_at
    dumped = now if seen.dump is not None and seen.dump != previous.seen.dump else previous.dumped_at
    return LifeSigns(step, seen, saved, dumped)


def startup_allowance(floor_s: float, first_startup_s: float | None, factor: float) -> float:
    """Seconds a launch may take to its first step: ``factor`` × the first launch's (``first_startup_s``; None:
    not known yet), never less than ``floor_s``."""
    return floor_s if first_startup_s is None else max(floor_s, factor * first_startup_s)
