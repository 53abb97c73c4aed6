"""The run's checkpoints at one moment: one scan of the checkpoint dir, and the stored verdicts when asked for.

``read_checkpoints`` is the one disk read of a tick (``guardian run``: the supervisor's; ``guardian watch``: the
guard loop's); the verdicts, the rescue snapshot, the pin pass and ``guardian checkpoints`` read the frozen view it
returns. ``pinned`` is the disk's (a pin renamed into place and not recorded yet is a pin all the same).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from guardian.checkpoints.pinning import pinned_steps
from guardian.checkpoints.scan import CheckpointDir, resumable, scan_checkpoints
from guardian.store import CheckpointView


@dataclass(frozen=True, slots=True)
class CheckpointsView:
    folders: tuple[CheckpointDir, ...] = ()  # the global_step_N folders, by step
    resumable: frozenset[int] = frozenset()  # steps verl can resume from as they are (their actor/ is there)
    pinned: frozenset[int] = frozenset()  # steps with a pinned copy in place
    verdicts: tuple[CheckpointView, ...] = ()  # the stored verdicts (empty unless read with them)

    @property
    def available(self) -> frozenset[int]:
        """The steps a rollback can land on: on disk as they are, or restored from their pin."""
        return self.resumable | self.pinned

    def restores(self, step: int) -> bool:
        """Whether a rollback to ``step`` first restores its pinned copy (verl's retention emptied the folder)."""
        return step in self.pinned and step not in self.resumable

    def where(self, step: int) -> Literal["present", "emptied", "moved"]:
        """Whether verl can resume from the step's folder as it is; emptied: retention deleted its actor/."""
        if step in self.resumable:
            return "present"
        return "emptied" if any(f.step == step for f in self.folders) else "moved"


def read_checkpoints(root: Path, verdicts: Iterable[CheckpointView] = ()) -> CheckpointsView:
    """One scan of ``root`` (nothing there: an empty view) with ``verdicts`` as the store holds them."""
    folders = tuple(scan_checkpoints(root))
    return CheckpointsView(
        folders=folders,
        resumable=frozenset(c.step for c in folders if resumable(c.path)),
        pinned=frozenset(pinned_steps(root)),
        verdicts=tuple(verdicts),
    )
