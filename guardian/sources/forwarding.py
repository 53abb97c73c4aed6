"""Whether a launch passed the guardian's arguments on to the trainer (``bash train.sh …`` must end in ``"$@"``).

Decided from two facts (``dropped_arguments``): stdout shows ``step:N`` while the metrics file stays empty.
``ForwardingWatch`` gathers them, reading stdout only until its first step line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from guardian.core import StepRecord
from guardian.overrides import parse_command
from guardian.sources.console import ConsoleFile
from guardian.verl_keys import PatchError


def dropped_arguments(*, console_step_at: float | None, metrics_bytes: int, now: float, grace_s: float) -> bool:
    """True when the console showed a step ``grace_s`` ago or more and the metrics file is still empty."""
    return console_step_at is not None and metrics_bytes == 0 and now - console_step_at >= grace_s


@dataclass(frozen=True, slots=True)
class Dropped:
    """The evidence: the first step verl's console printed, and the metrics file that stayed empty."""

    step: int
    stdout: Path
    metrics: Path


@dataclass
class ForwardingWatch:
    """One attempt's check, polled every tick; answers ``Dropped`` once at most, then nothing."""

    stdout: Path
    metrics: Path
    grace_s: float
    clock: Callable[[], float]
    max_line_bytes: int
    done: bool = False
    _step: int | None = None
    _seen_at: float | None = None
    _console: ConsoleFile | None = field(default=None, repr=False)

    def poll(self) -> Dropped | None:
        if self.done:
            return None
        if _size(self.metrics) > 0:
            return self._finish(None)
        if self._seen_at is None:
            self._read_console()
            return None
        now = self.clock()
        if dropped_arguments(console_step_at=self._seen_at, metrics_bytes=0, now=now, grace_s=self.grace_s):
            return self._finish(Dropped(self._step or 0, self.stdout, self.metrics))
        return None

    def _read_console(self) -> None:
        if self._console is None:
            self._console = ConsoleFile(self.stdout, max_line_bytes=self.max_line_bytes)
        batch = self._console.poll()
        step = next((r.step for r in batch.items if isinstance(r, StepRecord)), None)
        if step is not None:
            self._step, self._seen_at = step, self.clock()
            self._close()

    def _finish(self, answer: Dropped | None) -> Dropped | None:
        self.done = True
        self._close()
        return answer

    def _close(self) -> None:
        if self._console is not None:
            self._console.close()
            self._console = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def dropped_fields(run_id: str, command: Sequence[str], dropped: Dropped) -> dict[str, object]:
    """What ``event=arguments_not_forwarded`` says: what was seen, what it means, what to do."""
    try:
        script = parse_command(command)
    except PatchError:
        script = None
    seen = f"the trainer printed step {dropped.step} but wrote nothing to the metrics file the guardian told it to use"
    fields: dict[str, object] = {
        "run": run_id,
        "step": dropped.step,
        "metrics": dropped.metrics,
        "stdout": dropped.stdout,
    }
    stop = f"stop this run (guardian stop {run_id}) and start it again"
    if script is not None and script.script:
        launch = f"the python command in {script.entry}"
        return fields | {
            "message": f"{seen}: {launch} does not pass on the arguments the guardian appended (file logger, rollout "
            "dumps, resume path, patches), so the guardian sees no metrics and a rollback or patch would not reach "
            "the trainer",
            "fix": f'end {launch} with "$@" (python3 -m verl.trainer.main_ppo ... "$@"), {stop}',
        }
    return fields | {
        "message": f"{seen}: the trainer writes it where this machine cannot read it (a TaskRunner on another Ray "
        "node, the attempt folder not shared with it) or a wrapper drops the arguments the guardian appended",
        "fix": f"put the guardian home on a filesystem every node shares (or use --ray-address), check the command "
        f"with guardian run --dry-run, {stop}",
    }
