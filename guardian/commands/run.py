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
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError

from guardian.actions.dirlock import DirLockedError, holding
from guardian.actions.launcher import holding_dumps
from guardian.actions.patch import AttemptFiles
from guardian.actions.preview import launch_preview
from guardian.actions.process import LocalProcessControl, read_runner_start
from guardian.commands.outlets import Outlets, outlets
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
from guardian.rescue.local import LocalTrainer
from guardian.rescue.ray_jobs import JobsClient, RayJobsError, connect
from guardian.rescue.ray_survivors import ClusterState, StateApi
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


# VERL_FILE_LOGGER_PATH: every attempt gets its own; GUARDIAN_DB_URL: the guardian's store, whose URL may hold a
# password the trainer has no use for
NOT_FOR_THE_TRAINER = frozenset({"VERL_FILE_LOGGER_PATH", "GUARDIAN_DB_URL"})


def local_supervisor(
    config: GuardianConfig,
    store: Store,
    *,
    run_id: str,
    command: Sequence[str],
    cwd: Path,
    after_commit: Callable[[str], None] = lambda state: None,
    jobs: JobsClient | None = None,
    cluster: ClusterState | None = None,
) -> Supervisor:
    """A supervisor for a trainer launched as a local process group, in this process's environment less
    ``NOT_FOR_THE_TRAINER``; or, given ``jobs``, submitted as Ray jobs (the cluster's environment, plus the
    attempt's own variables)."""
    return Supervisor(
        config=config,
        store=store,
        run_id=run_id,
        command=tuple(command),
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in NOT_FOR_THE_TRAINER},
        control=LocalProcessControl(),
        clock=time.time,
        after_commit=after_commit,
        jobs=jobs,
        cluster=cluster,
    )


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


def register_run(store: Store, supervisor: Supervisor, *, name: str, ray_address: str | None = None) -> None:
    """Record a new run with what a later ``guardian run --attach`` needs: its command, cwd and Ray address."""
    saved: dict[str, object] = {"command": list(supervisor.command), "cwd": str(supervisor.cwd)}
    if ray_address is not None:
        saved["ray_address"] = ray_address
    store.ensure_run(
        supervisor.run_id,
        name=name,
        metrics_path=str(supervisor.folder.root),
        rollouts_dir=str(supervisor.files.prepare(supervisor.command).rollout_dir),
        checkpoints_dir=str(supervisor.checkpoint_dir),
        mode=supervisor.config.mode,
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
    fleet = join_fleet is not None
    check_sinks(config, os.environ)  # a missing webhook URL or token refuses before anything is written
    with Store.open(
        config.database_url(),
        busy_timeout_s=config.store.busy_timeout_s,
        statement_timeout_s=config.store.statement_timeout_s,
    ) as store:
        known = store.get_run(request.run_id)
        command, cwd, ray_address = request.command, request.cwd, request.ray_address
        # --attach too: a run that finished, gave up or was stopped by `guardian stop` has no trainer to guard
        ended = recorded_end(store, known) if known is not None else None
        if ended is not None and not request.new:
            _say_already_over(request.run_id, ended, fleet=fleet)
            over(ended)
            return ended.code
        if known is not None and request.new and not request.attach:
            # asked for: a new run under a fresh id; the request's flags (--dry-run above all) stay as asked
            fresh = f"{request.run_id[: MAX_RUN_ID - 15]}-{time.strftime('%Y%m%d%H%M%S')}"
            request = replace(request, run_id=checked_run_id(fresh))
            known = None
        saved: dict[str, Any] | None = None  # what register_run stored of a known run
        if known is not None:
            saved = orjson.loads(known.config_json or "{}")
            command, cwd = tuple(saved.get("command") or command), Path(saved.get("cwd") or cwd)
        elif request.attach:
            log.error(event("error", {"message": f"no run {request.run_id!r} in {store.url}"}))
            return 1
        ray_address = ray_address_of(request.ray_address, saved, config)
        hook = _die_after(os.environ[DIE_AFTER_ENV]) if os.environ.get(DIE_AFTER_ENV) else (lambda s: None)
        timeout_s = config.ray.request_timeout_s
        try:
            jobs = connect(ray_address, timeout_s=timeout_s) if ray_address else None
        except RayJobsError as exc:
            log.error(event("ray_unavailable", {"run": request.run_id, "address": ray_address, "message": str(exc)}))
            return 1
        supervisor = local_supervisor(
            config,
            store,
            run_id=request.run_id,
            command=command,
            cwd=cwd,
            after_commit=hook,
            jobs=jobs,
            cluster=StateApi(ray_address, timeout_s) if ray_address else None,
        )
        if request.dry_run:
            files = supervisor.files.prepare(command)
            preview = launch_preview(command, files, cwd)
            sys.stdout.write(orjson.dumps(preview, option=orjson.OPT_INDENT_2).decode() + "\n")
            return 0
        with ExitStack() as held:
            try:  # one guardian per checkpoint dir, taken before the run is registered or anything starts
                held.enter_context(holding(Path(supervisor.checkpoint_dir), request.run_id, supervisor.folder.root))
            except DirLockedError as exc:
                log.error(event("checkpoint_dir_locked", {"run": request.run_id, "message": str(exc)}))
                return 1
            dumps = users_dump_dir(supervisor.files.prepare(command), Path(supervisor.checkpoint_dir))
            try:  # a dump folder the command names itself is one run's: a rollback quarantines what lies there
                if dumps is not None:
                    held.enter_context(holding_dumps(dumps, request.run_id, supervisor.folder.root))
            except DirLockedError as exc:
                log.error(event("rollout_dir_locked", {"run": request.run_id, "message": str(exc)}))
                return 1
            if known is None:
                register_run(store, supervisor, name=" ".join(command)[:200], ray_address=ray_address)
            # with the live view a person reads the terminal: warnings there, every line in the run's guardian.log
            log_file = held.enter_context(
                logging_to_file(
                    supervisor.folder.root / "guardian.log",
                    quiet_terminal=request.live,
                    only_run=request.run_id if fleet else None,
                )
            )
            if request.live:
                sys.stderr.write(f"guardian: every event line of run {request.run_id} goes to {log_file}\n")
            log.info(
                event(
                    "run",
                    {
                        "run": request.run_id,
                        "mode": config.mode,
                        "folder": supervisor.folder.root,
                        "checkpoints": supervisor.checkpoint_dir,
                        "db": store.url,
                        "log": log_file,
                    },
                )
            )
            # the outlets first: a bad webhook setting or a busy port fails before the trainer starts; a fleet's run
            # serves no exporter of its own (the fleet's serves its snapshots)
            without_exporter = config.model_copy(
                update={"exporter": config.exporter.model_copy(update={"enabled": False})}
            )
            with outlets(
                without_exporter if fleet else config,
                store,
                supervisor.incident_tick,
                time.time,
                stop,
                views_read_store=request.live or fleet,
            ) as out:
                if join_fleet is not None:
                    join_fleet(out)
                supervisor.announce = out.announce
                supervisor.start()
                code = guard_loop(
                    supervisor, stop, config.sources.poll_interval_s, live=request.live, snapshots=out.snapshots
                )
                if code is not None:  # before the outlets' linger: a guardian killed then still left its answer
                    _record_exit(store, request.run_id, code)
            if code is not None:
                return code
            log.warning(
                event(
                    "guardian_stopped",
                    {
                        "run": request.run_id,
                        "trainer": "left running",
                        "reattach": f"guardian run --attach {request.run_id}",
                    },
                )
            )
            return EXIT_INTERRUPTED
