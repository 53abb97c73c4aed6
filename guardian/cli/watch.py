"""``guardian watch``: attach to a run it did not start, in observe mode, until the run ends."""

from __future__ import annotations

import argparse
import hashlib
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from guardian.cli.common import AddCommand, dir_problem, file_problem, log, open_store, resolved_config
from guardian.commands.watch.end import EndReason
from guardian.commands.watch.request import WatchRequest
from guardian.commands.watch.summary import Verdict, WatchSummary
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.config import GuardianConfig
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_TOO_LITTLE, EXIT_UNHEALTHY
from guardian.ids import MAX_RUN_ID, checked_run_id
from guardian.logs import event
from guardian.regular_files import regular_file_problem
from guardian.sources.hydra_config import config_beside, total_training_steps
from guardian.store import Store

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
    request = watch_request(args, path, run_id, total_steps)
    stop = threading.Event()
    with open_store(config) as store, _stopped_by_signals(stop):
        summary = _watch(config, store, request, trainer, stop)
    if summary.reason is EndReason.TICK_FAILURES:
        return EXIT_ERROR  # the guardian cannot continue
    if summary.reason is EndReason.UNREADABLE and summary.verdict is not Verdict.UNHEALTHY:
        return EXIT_ERROR
    return EXIT_CODES[summary.verdict]


def watch_request(args: argparse.Namespace, path: Path, run_id: str, total_steps: int | None) -> WatchRequest:
    return WatchRequest(
        path,
        run_id,
        console=not args.metrics,
        rollouts=Path(args.rollouts) if args.rollouts else None,
        checkpoints=Path(args.checkpoints) if args.checkpoints else None,
        follow=not args.no_follow,
        pid=args.pid,
        total_steps=total_steps,
        live=sys.stdout.isatty() and not args.no_live,
        max_ticks=args.max_ticks,
    )


def _watch(
    config: GuardianConfig, store: Store, request: WatchRequest, trainer: TrainerLiveness, stop: threading.Event
) -> WatchSummary:
    from guardian.commands.watch.session import run_watch  # the guard loop's modules load when a watch starts

    return run_watch(config, store, request, trainer, stop)


@contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM end the watch (with its summary), not the process."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
