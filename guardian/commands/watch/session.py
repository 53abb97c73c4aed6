"""One ``guardian watch``, from its request to its summary: register the run, build its tick (``commands.compose``),
open the outlets, follow the file with ``loop.WatchLoop`` and print the verdict.

The CLI only parses and checks the arguments; nothing here stops or patches a trainer."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import AbstractContextManager, nullcontext

from sqlalchemy.exc import DBAPIError

from guardian.checks.policy import too_little_to_judge
from guardian.commands.compose import watch_tick
from guardian.commands.outlets import outlets
from guardian.commands.view import Header
from guardian.commands.watch.display import Display, LiveView, PlainProgress
from guardian.commands.watch.end import EndReason
from guardian.commands.watch.loop import FollowedFile, WatchLoop
from guardian.commands.watch.request import WatchRequest
from guardian.commands.watch.summary import IncidentLine, VerdictTracker, WatchSummary, summary_lines
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.config import GuardianConfig
from guardian.incidents.tick import IncidentTick, MetricsSource
from guardian.keys import CHECKED_KEYS, Signal, signals_present
from guardian.logs import event, get_logger
from guardian.sources.console import ConsoleFile
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store
from guardian.store.engine import reason as store_error_text

log = get_logger("cli")


def run_watch(
    config: GuardianConfig, store: Store, request: WatchRequest, trainer: TrainerLiveness, stop: threading.Event
) -> WatchSummary:
    """Watch the run until it ends (or ``stop``), print its summary and return it."""
    followed = FollowedFile(_source(config, request))
    _register(store, request)
    tracker = VerdictTracker()
    tick = watch_tick(
        config,
        store,
        request.run_id,
        followed,
        rollouts=request.rollouts,
        checkpoints=request.checkpoints,
        tracker=tracker,
    )
    fields = {"run": request.run_id, "metrics": request.path, "db": store.url, "follow": request.follow}
    log.info(event("watch", {**fields, "pid": request.pid, "total_steps": request.total_steps}))
    # the live view's header shows the attempt, which the store holds
    with outlets(config, store, tick, time.time, stop, views_read_store=request.live) as out:
        header = Header("guardian watch", mode="observe", trainer_pid=request.pid, total_steps=request.total_steps)
        display: Display = (
            LiveView(tick, out.snapshots.latest, header) if request.live else PlainProgress(tick, _print, time.time)
        )
        loop = WatchLoop(
            tick,
            followed,
            trainer,
            display,
            follow=request.follow,
            total_steps=request.total_steps,
            wait=stop.wait,
            max_ticks=request.max_ticks,
            snapshots=out.snapshots,
            announce=out.announce,
        )
        view: AbstractContextManager[object] = display if isinstance(display, LiveView) else nullcontext()
        with view:
            reason = loop.run()
        summary = _summary(tick, store, tracker, reason, request)
        for line in summary_lines(summary):
            _print(line)
        stopped = {"reason": reason.value, "verdict": summary.verdict.value, "steps": summary.steps_read}
        log.info(event("watch_stopped", {"run": request.run_id, **stopped, "last_step": summary.last_step}))
    return summary


def _source(config: GuardianConfig, request: WatchRequest) -> MetricsSource:
    limits = config.sources
    if request.console:
        return ConsoleFile(request.path, max_line_bytes=limits.max_line_bytes)
    # the keys the checks read, as a replay reads them: a 300-key line costs a third as much to take in
    return MetricsFile(
        request.path, keys=CHECKED_KEYS, max_keys=limits.max_keys_per_step, max_line_bytes=limits.max_line_bytes
    )


def _register(store: Store, request: WatchRequest) -> None:
    store.ensure_run(
        request.run_id,
        name=request.run_id,
        metrics_path=str(request.path.resolve()),
        rollouts_dir=str(request.rollouts.resolve()) if request.rollouts else "",
        checkpoints_dir=str(request.checkpoints.resolve()) if request.checkpoints else None,
        mode="observe",
        now=time.time(),
    )


def _summary(
    tick: IncidentTick, store: Store, tracker: VerdictTracker, reason: EndReason, request: WatchRequest
) -> WatchSummary:
    history = tick.history
    signals = tuple(s.value for s in signals_present(frozenset(history.keys_seen)))
    if history.has(Signal.VAL_SCORE):
        signals += (Signal.VAL_SCORE.value,)
    return WatchSummary(
        run_id=tick.run_id,
        path=str(tick.metrics.path),
        reason=reason,
        steps_read=tick.steps_judged,
        last_step=history.last_step,
        signals=signals,
        too_little=too_little_to_judge(len(history.steps), signals, tick.config.checks.policy),
        bad_lines=tick.bad_lines_total,
        incidents=_incidents(tick, store),
        first_critical=tracker.first_critical,
        store_url=store.url,
        pid=request.pid,
        total_steps=request.total_steps,
    )


def _incidents(tick: IncidentTick, store: Store) -> tuple[IncidentLine, ...]:
    """The run's incidents, oldest first, as the store holds them; what the store could not take is said."""
    if tick.store_pending_writes:
        fix = (
            "run the same guardian watch again once the store takes writes: it reads the file from its start and "
            "stores what is missing"
        )
        log.error(event("watch_writes_lost", {"run": tick.run_id, "pending": tick.store_pending_writes, "fix": fix}))
    try:
        stored = store.list_incidents(tick.run_id)
    except DBAPIError as exc:
        log.error(event("watch_store_unreadable", {"run": tick.run_id, "error": store_error_text(exc)}))
        return ()
    return tuple(IncidentLine(i.id, i.check, i.severity.label, i.status, i.onset_step) for i in reversed(stored))


def _print(line: str) -> None:
    try:
        print(line, flush=True)
    except BrokenPipeError:  # `guardian watch ... | head`: the reader left; the watch goes on, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
