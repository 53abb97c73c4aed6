"""``guardian watch``: attach to a run it did not start, in observe mode, until the run ends."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from guardian.checks.policy import too_little_to_judge
from guardian.cli.common import AddCommand, dir_problem, file_problem, log, open_store, resolved_config
from guardian.commands.watch.end import EndReason
from guardian.commands.watch.summary import IncidentLine, Verdict, VerdictTracker, WatchSummary, summary_lines
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.config import GuardianConfig
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_TOO_LITTLE, EXIT_UNHEALTHY
from guardian.ids import MAX_RUN_ID, checked_run_id
from guardian.keys import CHECKED_KEYS, Signal, signals_present
from guardian.logs import event
from guardian.regular_files import regular_file_problem
from guardian.sources.hydra_config import config_beside, total_training_steps
from guardian.store import Store
from guardian.store.engine import reason as store_error_text

if TYPE_CHECKING:  # the guard loop's modules load when a watch starts, not with the CLI
    from guardian.incidents.tick import IncidentTick

EXIT_CODES = {
    Verdict.HEALTHY: EXIT_OK,
    Verdict.UNHEALTHY: EXIT_UNHEALTHY,
    Verdict.NOT_ENOUGH_DATA: EXIT_TOO_LITTLE,
    Verdict.NO_STEPS: EXIT_ERROR,
}
EPILOG = """\
when the watch ends:
  --no-follow            at the end of the file.
  following (default)    when the run is over: the process --pid names has exited (the file is read
                         to its end first), or the last step reached the run's total steps: --total-steps,
                         else trainer.total_training_steps of --run-config, else of .hydra/config.yaml in
                         the metrics file's folder (verl's default, null, leaves it unknown). Otherwise
                         it follows until Ctrl-C or SIGTERM. Every ending prints the summary.
verdict and exit code:
  0 HEALTHY      no check was critical at any step read (warnings do not count: a file that went
                 silent with no --pid to ask is a warning that the run may have finished, crashed or hung)
  3 UNHEALTHY    a check was critical at some step read, even if it cleared later; a stall is critical
                 only while the --pid process runs, so the verdict on a finished file does not depend on
                 how long it was watched
  1 error        the metrics file, --rollouts or --checkpoints cannot be read (a missing one is waited
                 for while following), no step was read (nothing to judge), or the watch gave up after
                 failed ticks (event=guardian_cannot_continue: the run is unguarded from then on)
  2 usage        bad arguments, an unreadable --config or --run-config
output: a live table on a terminal; otherwise (or --no-live) plain lines on stdout - "waiting for FILE",
  a line per finding raised or cleared, progress every 10 steps or 30 s - then the summary."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def register(add: AddCommand) -> None:
    p = add("watch", "Attach to a run in observe mode until it ends; print the verdict (exit 0 healthy, 3 not).")
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics", help="the run's file-logger JSONL (VERL_FILE_LOGGER_PATH)")
    source.add_argument("--console", help="the run's stdout log, parsed as verl console lines (fallback)")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir")
    p.add_argument("--checkpoints", help="trainer.default_local_dir (global_step_N folders)")
    p.add_argument("--run-id", help="run id in the store (default: derived from the metrics path)")
    p.add_argument("--no-follow", action="store_true", help="read to the end of the file, judge and exit")
    p.add_argument("--pid", type=_positive, help="the trainer's process id: the watch ends when it exits")
    p.add_argument("--total-steps", type=_positive, metavar="N", help="the run ends at step N")
    p.add_argument("--run-config", metavar="FILE", help="the run's Hydra config (.hydra/config.yaml): its length")
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live table")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument("--max-ticks", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_watch)


def derive_run_id(metrics: Path) -> str:
    """``<file stem>-<hash of its absolute path>``, the stem reduced to what a run id may hold (guardian.ids)."""
    digest = hashlib.sha1(str(metrics.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", metrics.stem).lstrip("._-")[: MAX_RUN_ID - 9] or "metrics"
    return f"{stem}-{digest}"


def readable_problem(path: Path, *, must_exist: bool) -> str | None:
    """Why ``path`` cannot be watched, or None (a missing file is waited for unless ``must_exist``)."""
    unusable = regular_file_problem(path)  # a symlink loop, a FIFO, a device: never waited for
    if unusable is not None:
        return f"metrics file {path} is {unusable}"
    if not path.exists() and not must_exist:
        return None
    problem = file_problem(path, "metrics file")
    if problem is not None:
        return problem
    try:
        with path.open("rb"):
            return None
    except OSError as exc:
        return f"cannot read metrics file {path}: {exc.strerror or exc}"


def folder_problem(option: str, value: str | None, *, must_exist: bool) -> str | None:
    """Why the folder ``option`` names cannot be read, or None (a missing one is waited for unless ``must_exist``:
    verl creates its rollout and checkpoint folders when it first writes to them)."""
    if value is None or (not must_exist and not Path(value).exists()):
        return None
    return dir_problem(Path(value), option)


def run_length(args: argparse.Namespace, path: Path) -> int | None:
    """The run's total steps: ``--total-steps``, else its Hydra config's (``--run-config``, or beside the file)."""
    if args.total_steps is not None:
        return int(args.total_steps)
    config = Path(args.run_config) if args.run_config else config_beside(path)
    if config is None:
        return None
    steps = total_training_steps(config)
    log.info(event("watch_run_length", {"config": config, "total_training_steps": steps if steps else "unknown"}))
    return steps


def cmd_watch(args: argparse.Namespace) -> int:

    config = resolved_config(args)
    path = Path(args.metrics or args.console)
    problem = (
        readable_problem(path, must_exist=args.no_follow)
        or folder_problem("--rollouts", args.rollouts, must_exist=args.no_follow)
        or folder_problem("--checkpoints", args.checkpoints, must_exist=args.no_follow)
    )
    if problem is not None:
        log.error(event("watch_error", {"message": problem}))
        return EXIT_ERROR
    total_steps = None if args.no_follow else run_length(args, path)
    run_id = checked_run_id(args.run_id) if args.run_id else derive_run_id(path)
    waiting = {"metrics": path, "rollouts": args.rollouts, "checkpoints": args.checkpoints}
    for what, value in waiting.items():
        if value is not None and not Path(value).exists():
            log.info(event("watch_waiting", {what: value}))
    trainer = TrainerLiveness(args.pid)
    if args.pid is not None and not trainer.sample():
        log.warning(event("watch_trainer_gone", {"pid": args.pid, "message": "not running: reading to the end"}))
    stop = threading.Event()
    with open_store(config) as store, _stopped_by_signals(stop):
        summary = _watch(args, config, store, path, run_id, trainer, total_steps, stop)
    if summary.reason is EndReason.TICK_FAILURES:
        return EXIT_ERROR  # the guardian cannot continue
    if summary.reason is EndReason.UNREADABLE and summary.verdict is not Verdict.UNHEALTHY:
        return EXIT_ERROR
    return EXIT_CODES[summary.verdict]


def _watch(
    args: argparse.Namespace,
    config: GuardianConfig,
    store: Store,
    path: Path,
    run_id: str,
    trainer: TrainerLiveness,
    total_steps: int | None,
    stop: threading.Event,
) -> WatchSummary:
    from guardian.commands.outlets import outlets
    from guardian.commands.view import Header
    from guardian.commands.watch.display import Display, LiveView, PlainProgress
    from guardian.commands.watch.loop import FollowedFile, WatchLoop
    from guardian.incidents.tick import IncidentTick
    from guardian.sources.console import ConsoleFile
    from guardian.sources.jsonl import MetricsFile
    from guardian.sources.rollouts import RolloutDir

    limits = config.sources
    source = (
        # the keys the checks read, as a replay reads them: a 300-key line costs a third as much to take in
        MetricsFile(path, keys=CHECKED_KEYS, max_keys=limits.max_keys_per_step, max_line_bytes=limits.max_line_bytes)
        if args.metrics
        else ConsoleFile(path, max_line_bytes=limits.max_line_bytes)
    )
    followed = FollowedFile(source)
    store.ensure_run(
        run_id,
        name=run_id,
        metrics_path=str(path.resolve()),
        rollouts_dir=str(Path(args.rollouts).resolve()) if args.rollouts else "",
        checkpoints_dir=str(Path(args.checkpoints).resolve()) if args.checkpoints else None,
        mode="observe",
        now=time.time(),
    )
    tracker = VerdictTracker()
    guardian = IncidentTick(
        config=config,
        store=store,
        run_id=run_id,
        metrics=followed,
        clock=time.time,
        rollouts=RolloutDir(Path(args.rollouts), max_line_bytes=limits.max_line_bytes) if args.rollouts else None,
        checkpoints_dir=Path(args.checkpoints) if args.checkpoints else None,
        trainer_alive=trainer,
        tracker=tracker,
    )
    fields = {"run": run_id, "metrics": path, "db": store.url, "follow": not args.no_follow}
    log.info(event("watch", {**fields, "pid": args.pid, "total_steps": total_steps}))
    live = sys.stdout.isatty() and not args.no_live
    # the live view's header shows the attempt, which the store holds
    with outlets(config, store, guardian, time.time, stop, views_read_store=live) as out:
        header = Header("guardian watch", mode="observe", trainer_pid=args.pid, total_steps=total_steps)
        display: Display = (
            LiveView(guardian, out.snapshots.latest, header) if live else PlainProgress(guardian, _print, time.time)
        )
        loop = WatchLoop(
            guardian,
            followed,
            trainer,
            display,
            follow=not args.no_follow,
            total_steps=total_steps,
            wait=stop.wait,
            max_ticks=args.max_ticks,
            snapshots=out.snapshots,
            announce=out.announce,
        )
        view: AbstractContextManager[object] = display if isinstance(display, LiveView) else nullcontext()
        with view:
            reason = loop.run()
        summary = _summary(
            guardian, store, tracker, reason, guardian.steps_judged, pid=args.pid, total_steps=total_steps
        )
        for line in summary_lines(summary):
            _print(line)
        log.info(
            event(
                "watch_stopped",
                {
                    "run": run_id,
                    "reason": reason.value,
                    "verdict": summary.verdict.value,
                    "steps": summary.steps_read,
                    "last_step": summary.last_step,
                },
            )
        )
    return summary


def _summary(
    guardian: IncidentTick,
    store: Store,
    tracker: VerdictTracker,
    reason: EndReason,
    steps_read: int,
    *,
    pid: int | None,
    total_steps: int | None,
) -> WatchSummary:
    signals = tuple(s.value for s in signals_present(frozenset(guardian.history.keys_seen)))
    if guardian.history.has(Signal.VAL_SCORE):
        signals += (Signal.VAL_SCORE.value,)
    return WatchSummary(
        run_id=guardian.run_id,
        path=str(guardian.metrics.path),
        reason=reason,
        steps_read=steps_read,
        last_step=guardian.history.last_step,
        signals=signals,
        too_little=too_little_to_judge(len(guardian.history.steps), signals, guardian.config.checks.policy),
        bad_lines=guardian.bad_lines_total,
        incidents=_incidents(guardian, store),
        first_critical=tracker.first_critical,
        store_url=store.url,
        pid=pid,
        total_steps=total_steps,
    )


def _incidents(guardian: IncidentTick, store: Store) -> tuple[IncidentLine, ...]:
    """The run's incidents, oldest first, as the store holds them; what the store could not take is said."""
    if guardian.store_pending_writes:
        log.error(
            event(
                "watch_writes_lost",
                {
                    "run": guardian.run_id,
                    "pending": guardian.store_pending_writes,
                    "fix": "run the same guardian watch again once the store takes writes: it reads the file from "
                    "its start and stores what is missing",
                },
            )
        )
    try:
        stored = store.list_incidents(guardian.run_id)
    except DBAPIError as exc:
        log.error(event("watch_store_unreadable", {"run": guardian.run_id, "error": store_error_text(exc)}))
        return ()
    return tuple(IncidentLine(i.id, i.check, i.severity.label, i.status, i.onset_step) for i in reversed(stored))


def _print(line: str) -> None:
    try:
        print(line, flush=True)
    except BrokenPipeError:  # `guardian watch ... | head`: the reader left; the watch goes on, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM end the watch (with its summary), not the process."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
