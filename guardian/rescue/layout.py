"""Where a guarded run lives, read from its command before anything starts: its folder under the guardian's home,
each attempt's metrics file and rollout dumps, the checkpoint dir verl saves to, and verl's save schedule.

Reading it launches nothing and writes nothing: ``guardian run --dry-run``, the directory locks and the run's
registration read it before the trainer starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from guardian.actions.launcher import RunFolder
from guardian.actions.patch import AttemptFiles, RunFiles
from guardian.actions.schedule import Saves, read_saves


@dataclass(frozen=True, slots=True)
class RunLayout:
    run_id: str
    command: tuple[str, ...]  # the user's command, as given
    cwd: Path
    folder: RunFolder
    files: RunFiles  # attempt 1's
    first: AttemptFiles  # attempt 1's command and files, as prepared from the user's command
    saves: Saves  # the steps verl saves and validates at, and its retention

    @property
    def checkpoint_dir(self) -> Path:
        return self.first.checkpoint_dir

    def run_files(self, number: int) -> RunFiles:
        """The files attempt ``number`` gets, whatever its command."""
        return RunFiles(self.folder.metrics(number), self.folder.rollouts(number), self.cwd, self.command)


def run_layout(home: Path, run_id: str, command: Sequence[str], cwd: Path) -> RunLayout:
    """The layout of run ``run_id`` under the guardian's ``home``. Raises ``PatchError`` on a command the guardian
    cannot read."""
    folder = RunFolder(home.resolve() / "runs" / run_id)
    command = tuple(command)
    files = RunFiles(folder.metrics(1), folder.rollouts(1), cwd, command)
    first = files.prepare(command)
    return RunLayout(run_id, command, cwd, folder, files, first, read_saves(first.argv, cwd))
