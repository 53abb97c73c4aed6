"""``guardian run``: open the store, start or re-attach the run, loop the supervisor until the run ends.

Ctrl-C (SIGINT) or SIGTERM stops the *guardian*, never the trainer: it keeps running in its own
session, and ``guardian run --attach RUN_ID`` (or the same ``guardian run`` command again) picks it up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError

from guardian.actions.dirlock import DirLockedError, holding
from guardian.actions.launcher import holding_dumps
from guardian.actions.patch import AttemptFiles
from guardian.actions.preview import launch_preview
from guardian.actions.process import read_runner_start
from guardian.commands.compose import TrainerSite, guarded_run, local_site
from guardian.commands.outlets import Outlets
from guardian.commands.screen import LiveScreen
from guardian.commands.view import Frame, Header, render, run_footer
from guardian.config import GuardianConfig
from guardian.exits import EXIT_GAVE_UP, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNHEALTHY
from guardian.fleet.outcome import meaning
from guardian.ids import MAX_RUN_ID, checked_run_id
from guardian.logs import event, get_logger, logging_to_file
from guardian.loop.guard import guard
from guardian.loop.pace import PollPace
from guardian.notify.setup import check_sinks
from guardian.overrides import effective_value
from guardian.rescue.layout import RunLayout, run_layout
from guardian.rescue.local import LocalTrainer
from guardian.rescue.ray_jobs import RayJobsError, connect
from guardian.rescue.ray_survivors import StateApi
from guardian.rescue.supervisor import Supervisor
from guardian.sinks.snapshot import GuardianSource, RunSnapshot
from guardian.states import IncidentStatus, RunStatus, State
from guardian.store import RunView, Store, StoreError
from guardian.verl_keys import PatchError

log = get_logger("run")
TOTAL_STEPS = "trainer.total_training_steps"
# Test hook for the chaos tests: the guardian SIGKILLs itself right after committing this state.
DIE_AFTER_ENV = "GUARDIAN_TEST_DIE_AFTER"


@dataclass(frozen=True, slots=True)
class RunRequest:
    command: tuple[str, ...]
    cwd: Path
    run_id: str
    attach: bool = False
    dry_run: bool = False
    live: bool = False
    ray_address: str | None = None  # submit each attempt to this Ray cluster's Jobs API (http://HEAD:8265)
    new: bool = False  # a run the store knows is started anew under a fresh id (never re-attached nor refused)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run the store records as over ended: its status (finished, gave_up) and its guardian's exit code."""

    status: str
    code: int


def recorded_end(store: Store, run: RunView) -> RunEnd | None:
    """The end of ``run`` as the store records it, or None while it is not over. The exit code is the one its
    guardian recorded; a run that gave up answers 93 (do not requeue); a finished run whose guardian died before
    recording its code answers as its end would have: 3 with an incident left open or a rescue left unproven,
    else 0."""
    if run.status not in (RunStatus.FINISHED, RunStatus.GAVE_UP):
        return None
    if run.status == RunStatus.GAVE_UP:
        return RunEnd(RunStatus.GAVE_UP.value, EXIT_GAVE_UP)
    saved = orjson.loads(run.config_json or "{}")
    code = saved.get("exit_code") if isinstance(saved, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        return RunEnd(RunStatus.FINISHED.value, code)
    unproven = any(iv.state is State.UNRESOLVED for iv in store.interventions(run.id))
    left_open = any(incident.status == IncidentStatus.OPEN for incident in store.list_incidents(run.id))
    return RunEnd(RunStatus.FINISHED.value, EXIT_UNHEALTHY if unproven or left_open else EXIT_OK)


def _die_after(state: str) -> Callable[[str], None]:
    def hook(committed: str) -> None:
        if committed == state:
            log.warning(event("test_die", {"after": committed}))
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def ray_address_of(asked: str | None, saved: Mapping[str, object] | None, config: GuardianConfig) -> str | None:
    """The Ray dashboard a run's attempts go to: ``--ray-address`` (a fleet run's own ``ray_address``) first; a run
    the store knows keeps the address it started with, and one started without stays local (its trainer is a
    local process group: a Ray job of its attempt would be a second trainer); a new run takes ``ray.address``."""
    if asked:
        return asked
    if saved is not None:
        stored = saved.get("ray_address")
        return stored if isinstance(stored, str) and stored else None
    return config.ray.address


def register_run(store: Store, layout: RunLayout, *, mode: str, name: str, ray_address: str | None = None) -> None:
    """Record a new run with what a later ``guardian run --attach`` needs: its command, cwd and Ray address."""
    saved: dict[str, object] = {"command": list(layout.command), "cwd": str(layout.cwd)}
    if ray_address is not None:
        saved["ray_address"] = ray_address
    store.ensure_run(
        layout.run_id,
        name=name,
        metrics_path=str(layout.folder.root),
        rollouts_dir=str(layout.first.rollout_dir),
        checkpoints_dir=str(layout.checkpoint_dir),
        mode=mode,
        now=time.time(),
        config_json=orjson.dumps(saved).decode(),
    )


def users_dump_dir(files: AttemptFiles, checkpoint_dir: Path) -> Path | None:
    """The rollout dump folder a run's own command names (``trainer.rollout_data_dir``), which every attempt shares
    and no other run may; None when the guardian gives each attempt its own, or when it is the checkpoint dir (whose
    lock already covers it)."""
    if not files.rollout_dir_is_users:
        return None
    folder = Path(os.path.abspath(files.rollout_dir))
    return None if folder == Path(os.path.abspath(checkpoint_dir)) else folder


def _say_already_over(run_id: str, ended: RunEnd, *, fleet: bool) -> None:
    """The one line that says a run is not launched again, and how a person starts it anew on purpose."""
    anew = (
        "give it a new run_id in the fleet file"
        if fleet
        else "run the same command with --new (a new run beside it) or with --run-id NEW_ID"
    )
    fields = {
        "run": run_id,
        "status": ended.status,
        "exit": ended.code,
        "meaning": meaning(ended.code),
        "launched": "no",
        "fix": f"the store records this run as over; to start it anew {anew}",
    }
    log.warning(event("run_already_over", fields))


def _record_exit(store: Store, run_id: str, code: int) -> None:
    """Keep the guardian's exit code with the run (see ``recorded_end``); a store that refuses it is no reason to
    lose the answer: a later start recomputes it."""
    try:
        store.record_run_exit(run_id, code)
    except (StoreError, SQLAlchemyError) as exc:
        log.warning(event("run_exit_unrecorded", {"run": run_id, "exit": code, "error": type(exc).__name__}))


def guard_loop(
    supervisor: Supervisor,
    stop: threading.Event,
    poll_s: float,
    *,
    live: bool,
    after_tick: Callable[[bool], None] = lambda ok: None,
    snapshots: GuardianSource | None = None,
) -> int | None:
    """``guardian run``'s loop (``guardian.loop.guard.guard`` over the supervisor): tick until the run is over (its
    exit code) or the guardian is told to stop (None); ``tick_failure_limit`` failed ticks in a row end it through
    ``Supervisor.cannot_continue``. After every tick ``snapshots`` (the run's outlets) publish its snapshot, then
    ``after_tick(ok)`` follows (the demo's narration); ``live`` draws the run's view from that snapshot."""
    if stop.is_set():  # told to stop before the first tick: nothing is ticked
        return None

    def record_poll(ok: bool, seconds: float, moved: bool) -> None:
        if snapshots is not None:
            snapshots(ok, seconds, moved)
        after_tick(ok)

    with ExitStack() as held:
        return guard(
            supervisor,
            pace=PollPace(poll_s, supervisor.config.sources.idle_poll_max_s),
            wait=stop.wait,
            failure_limit=supervisor.config.tick_failure_limit,
            outage_limit_s=supervisor.config.outage_limit_s,
            resume=f"guardian run --attach {supervisor.run_id}",
            record_poll=record_poll,
            show=_live_view(held, supervisor, snapshots) if live else lambda ok: None,
        )


def _live_view(held: ExitStack, supervisor: Supervisor, snapshots: GuardianSource | None) -> Callable[[bool], None]:
    """Start the run's live view, open while ``held`` is; returns what redraws it from each tick's snapshot."""
    if snapshots is None:
        raise ValueError("the live view draws the run's published snapshots: pass snapshots")
    total = run_total_steps(supervisor.trainer.argv(supervisor.command), supervisor.cwd)
    view = held.enter_context(LiveScreen(_render(supervisor, total)))
    return lambda ok: view.update(run_frame(supervisor, snapshots.latest, total))


def _render(supervisor: Supervisor, total_steps: int | None = None) -> Frame:
    """The live view's first frame: the run as ``start`` left it (a re-attach rebuilt its history), before the first
    tick publishes its snapshot."""
    return run_frame(
        supervisor, GuardianSource(supervisor.incident_tick, supervisor.store, time.time).latest, total_steps
    )


def run_frame(supervisor: Supervisor, snapshot: RunSnapshot, total_steps: int | None) -> Frame:
    """The run's view of ``snapshot``, drawn at the terminal's size: titled ``guardian run``, with the guardian's mode,
    the trainer's pid, an ETA when ``total_steps`` is known, and the intervention under way."""
    header = Header("guardian run", supervisor.config.mode, trainer_pid(supervisor), total_steps)
    footer = run_footer(snapshot)
    return Frame(lambda w, h: render(snapshot, header=header, footer=footer, width=w, height=h))


def trainer_pid(supervisor: Supervisor) -> int | None:
    """The local trainer's pid, as its wrapper recorded it (else the wrapper's: its process group's id)."""
    trainer = supervisor.trainer
    if not isinstance(trainer, LocalTrainer) or trainer.attempt is None or trainer.attempt.handle is None:
        return None
    started = read_runner_start(trainer.attempt.handle.exit_file)
    return started.pid if started is not None else trainer.attempt.handle.pid


def run_total_steps(argv: Sequence[str], cwd: Path) -> int | None:
    """``trainer.total_training_steps`` of the run's command (its overrides, else its config file); None when unset
    (verl then derives it from the data) or unreadable."""
    try:
        value = effective_value(argv, TOTAL_STEPS, defaults={TOTAL_STEPS: None}, cwd=cwd)
    except PatchError:
        return None
    try:
        steps = int(str(value))
    except ValueError:
        return None
    return steps if steps > 0 else None


def run_guarded(config: GuardianConfig, request: RunRequest, *, stop: threading.Event | None = None) -> int:
    """``guardian run``: guard one run in this (the main) thread; Ctrl-C or SIGTERM stop the guardian."""
    stop = stop or threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return guard_request(config, request, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True, slots=True)
class Target:
    """The run a request guards: its command and cwd (a known run's, as stored), its Ray dashboard, and whether the
    store knows it already."""

    request: RunRequest
    command: tuple[str, ...]
    cwd: Path
    ray_address: str | None
    known: bool


def guard_request(
    config: GuardianConfig,
    request: RunRequest,
    stop: threading.Event,
    *,
    join_fleet: Callable[[Outlets], None] | None = None,
    over: Callable[[RunEnd], None] = lambda end: None,
) -> int:
    """Open the store, start or re-attach the request's run and guard it until it ends (its exit code) or ``stop``
    is set (``EXIT_INTERRUPTED``, the trainer left running). ``join_fleet``: the run is one of several this process
    guards (``guardian fleet``, each in its own thread): it serves no exporter of its own but hands its outlets to
    the fleet's, which serves every run's snapshots, and its guardian.log takes its own lines only.

    A run the store records as over (finished, or given up: 93, do not requeue) is not launched again: one line
    says so, ``over`` hears how it ended and its recorded exit code is returned; ``request.new`` starts a new run
    under a fresh id instead."""
    check_sinks(config, os.environ)  # a missing webhook URL or token refuses before anything is written
    with Store.open(
        config.database_url(),
        busy_timeout_s=config.store.busy_timeout_s,
        statement_timeout_s=config.store.statement_timeout_s,
    ) as store:
        target = find_target(store, request, config, fleet=join_fleet is not None)
        if isinstance(target, RunEnd):
            over(target)
            return target.code
        if target is None:
            return 1
        return guard_target(config, store, target, stop, join_fleet)


def find_target(store: Store, request: RunRequest, config: GuardianConfig, *, fleet: bool) -> Target | RunEnd | None:
    """The run ``request`` guards; how it ended when the store records it as over (one line says so); None when
    ``--attach`` names a run the store does not know."""
    known = store.get_run(request.run_id)
    # --attach too: a run that finished, gave up or was stopped by `guardian stop` has no trainer to guard
    ended = recorded_end(store, known) if known is not None else None
    if ended is not None and not request.new:
        _say_already_over(request.run_id, ended, fleet=fleet)
        return ended
    if known is not None and request.new and not request.attach:
        # asked for: a new run under a fresh id; the request's flags (--dry-run above all) stay as asked
        fresh = f"{request.run_id[: MAX_RUN_ID - 15]}-{time.strftime('%Y%m%d%H%M%S')}"
        request = replace(request, run_id=checked_run_id(fresh))
        known = None
    if known is None and request.attach:
        log.error(event("error", {"message": f"no run {request.run_id!r} in {store.url}"}))
        return None
    saved: dict[str, Any] | None = orjson.loads(known.config_json or "{}") if known is not None else None
    command, cwd = request.command, request.cwd
    if saved is not None:  # what register_run stored of a known run
        command, cwd = tuple(saved.get("command") or command), Path(saved.get("cwd") or cwd)
    return Target(request, command, cwd, ray_address_of(request.ray_address, saved, config), known is not None)


def trainer_site(target: Target, config: GuardianConfig) -> TrainerSite | None:
    """Where the target's trainer runs: this machine, or its Ray cluster; None (one line says why) when the cluster
    does not answer."""
    address, timeout_s = target.ray_address, config.ray.request_timeout_s
    if not address:
        return local_site()
    try:
        jobs = connect(address, timeout_s=timeout_s)
    except RayJobsError as exc:
        log.error(event("ray_unavailable", {"run": target.request.run_id, "address": address, "message": str(exc)}))
        return None
    return local_site(jobs, StateApi(address, timeout_s))


def guard_target(
    config: GuardianConfig,
    store: Store,
    target: Target,
    stop: threading.Event,
    join_fleet: Callable[[Outlets], None] | None,
) -> int:
    """Lay the run out, hold its folders, register it and guard it (see ``guard_request``)."""
    request = target.request
    site = trainer_site(target, config)
    if site is None:
        return 1
    layout = run_layout(config.home, request.run_id, target.command, target.cwd)
    if request.dry_run:
        preview = launch_preview(target.command, layout.first, target.cwd)
        sys.stdout.write(orjson.dumps(preview, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    with ExitStack() as held:
        if not hold_folders(held, layout):
            return 1
        if not target.known:
            name = " ".join(target.command)[:200]
            register_run(store, layout, mode=config.mode, name=name, ray_address=target.ray_address)
        log_file = held.enter_context(_run_log(layout, request, fleet=join_fleet is not None))
        _say_run(config, store, layout, log_file)
        code = _guard_with_outlets(config, store, layout, site, stop, request, join_fleet)
    if code is not None:
        return code
    fields = {"run": request.run_id, "trainer": "left running", "reattach": f"guardian run --attach {request.run_id}"}
    log.warning(event("guardian_stopped", fields))
    return EXIT_INTERRUPTED


def hold_folders(held: ExitStack, layout: RunLayout) -> bool:
    """One guardian per checkpoint dir, and per dump folder the command names itself (a rollback quarantines what
    lies there), held while ``held`` is, before the run is registered or anything starts; False (one line says
    which) when another guardian holds one."""
    run_id, root = layout.run_id, layout.folder.root
    try:
        held.enter_context(holding(Path(layout.checkpoint_dir), run_id, root))
    except DirLockedError as exc:
        log.error(event("checkpoint_dir_locked", {"run": run_id, "message": str(exc)}))
        return False
    dumps = users_dump_dir(layout.first, Path(layout.checkpoint_dir))
    try:
        if dumps is not None:
            held.enter_context(holding_dumps(dumps, run_id, root))
    except DirLockedError as exc:
        log.error(event("rollout_dir_locked", {"run": run_id, "message": str(exc)}))
        return False
    return True


@contextmanager
def _run_log(layout: RunLayout, request: RunRequest, *, fleet: bool) -> Iterator[Path]:
    """The run's guardian.log; with the live view a person reads the terminal: warnings there, every line in the
    file; a fleet's run logs its own lines only."""
    with logging_to_file(
        layout.folder.root / "guardian.log", quiet_terminal=request.live, only_run=request.run_id if fleet else None
    ) as log_file:
        if request.live:
            sys.stderr.write(f"guardian: every event line of run {request.run_id} goes to {log_file}\n")
        yield log_file


def _say_run(config: GuardianConfig, store: Store, layout: RunLayout, log_file: Path) -> None:
    fields = {
        "run": layout.run_id,
        "mode": config.mode,
        "folder": layout.folder.root,
        "checkpoints": layout.checkpoint_dir,
        "db": store.url,
        "log": log_file,
    }
    log.info(event("run", fields))


def _guard_with_outlets(
    config: GuardianConfig,
    store: Store,
    layout: RunLayout,
    site: TrainerSite,
    stop: threading.Event,
    request: RunRequest,
    join_fleet: Callable[[Outlets], None] | None,
) -> int | None:
    """Start the run and guard it until it ends (its exit code, recorded) or ``stop`` (None). The outlets first: a
    bad webhook setting or a busy port fails before the trainer starts; a fleet's run serves no exporter of its own
    (the fleet's serves its snapshots)."""
    fleet = join_fleet is not None
    hook = _die_after(os.environ[DIE_AFTER_ENV]) if os.environ.get(DIE_AFTER_ENV) else (lambda s: None)
    run = guarded_run(
        config,
        store,
        layout,
        site,
        stop,
        after_commit=hook,
        serves_exporter=not fleet,
        views_read_store=request.live or fleet,
    )
    with run as (supervisor, out):
        if join_fleet is not None:
            join_fleet(out)
        supervisor.start()
        code = guard_loop(supervisor, stop, config.sources.poll_interval_s, live=request.live, snapshots=out.snapshots)
        if code is not None:  # before the outlets' linger: a guardian killed then still left its answer
            _record_exit(store, request.run_id, code)
    return code
