"""``guardian watch``: attach to a live run in observe mode."""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from guardian.cli.common import EXIT_OK, EXIT_UNHEALTHY, AddCommand, log, open_store, resolved_config
from guardian.findings import Severity
from guardian.logs import event


def register(add: AddCommand) -> None:
    p = add("watch", "Attach to a live run in observe mode: findings and incidents to the store.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics", help="the run's file-logger JSONL (VERL_FILE_LOGGER_PATH)")
    source.add_argument("--console", help="the run's stdout log, parsed as verl console lines (fallback)")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir")
    p.add_argument("--checkpoints", help="trainer.default_local_dir (global_step_N folders)")
    p.add_argument("--run-id", help="run id in the store (default: derived from the metrics path)")
    p.add_argument("--no-live", action="store_true", help="no live terminal view (logs only)")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument("--max-ticks", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_watch)


def derive_run_id(metrics: Path) -> str:
    digest = hashlib.sha1(str(metrics.resolve()).encode()).hexdigest()[:8]
    return f"{metrics.stem}-{digest}"


def cmd_watch(args: argparse.Namespace) -> int:
    from guardian.daemon import Guardian
    from guardian.notify.setup import notifying, sink_names
    from guardian.sinks.export import exporting
    from guardian.sources.console import ConsoleFile
    from guardian.sources.jsonl import MetricsFile
    from guardian.sources.rollouts import RolloutDir

    config = resolved_config(args)
    path = Path(args.metrics or args.console)
    source = MetricsFile(path) if args.metrics else ConsoleFile(path)
    run_id = args.run_id or derive_run_id(path)
    stop = threading.Event()
    with open_store(config) as store:
        store.ensure_run(
            run_id,
            name=run_id,
            metrics_path=str(path.resolve()),
            rollouts_dir=str(Path(args.rollouts).resolve()) if args.rollouts else "",
            checkpoints_dir=str(Path(args.checkpoints).resolve()) if args.checkpoints else None,
            mode="observe",
            now=time.time(),
        )
        guardian = Guardian(
            config=config,
            store=store,
            run_id=run_id,
            metrics=source,
            clock=time.time,
            rollouts=RolloutDir(Path(args.rollouts)) if args.rollouts else None,
            checkpoints_dir=Path(args.checkpoints) if args.checkpoints else None,
        )
        log.info(event("watch", {"run": run_id, "metrics": path, "db": store.url}))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        with (
            notifying(config, store, run_id, time.time, os.environ),
            exporting(guardian, store, config.exporter, time.time, stop, sink_names(config)) as polled,
        ):
            _watch_loop(
                guardian,
                stop,
                live=sys.stdout.isatty() and not args.no_live,
                max_ticks=args.max_ticks,
                after_tick=polled,
            )
        worst = guardian.tracker.worst()
        log.info(event("watch_stopped", {"run": run_id, "last_step": guardian.history.last_step}))
    return EXIT_UNHEALTHY if worst == Severity.CRITICAL else EXIT_OK


def _watch_loop(
    guardian: object,
    stop: threading.Event,
    *,
    live: bool,
    max_ticks: int | None,
    after_tick: Callable[[], None] = lambda: None,
) -> None:
    from rich.live import Live

    from guardian.daemon import Guardian
    from guardian.view import render

    assert isinstance(guardian, Guardian)
    ticks = 0

    def counted(_result: object) -> None:
        nonlocal ticks
        ticks += 1
        after_tick()
        if max_ticks is not None and ticks >= max_ticks:
            stop.set()

    if not live:
        guardian.run_forever(stop, on_tick=counted)
        return
    with Live(render(guardian.run_id, guardian.history, guardian.tracker, time.time()), refresh_per_second=4) as view:

        def redraw(result: object) -> None:
            counted(result)
            view.update(render(guardian.run_id, guardian.history, guardian.tracker, time.time()))

        guardian.run_forever(stop, on_tick=redraw)
