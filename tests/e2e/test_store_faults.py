"""Faults in the store never leave a run unguarded: real databases refusing writes (a write lock held by a second
session on SQLite and PostgreSQL, a PostgreSQL server stopped, a full filesystem and a damaged page under SQLite)
while a real trainer process collapses under ``guardian run``'s supervisor, driven tick by tick with an injected
clock."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ManualClock, corrupt_table
from postgres_server import PASSWORD, USER, HeldLock, PostgresServer, backend, rows, running_postgres
from sqlalchemy import Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from guardian.actions.process import LocalProcessControl
from guardian.commands.compose import TrainerSite, supervisor
from guardian.commands.run import guard_loop, register_run
from guardian.config import GuardianConfig
from guardian.core import Severity, StepRecord
from guardian.faults import is_outage, unavailable
from guardian.incidents.tick import IncidentTick
from guardian.loop.outage import (
    STORE_WAIT_S,
    TICK_FAILURE_LIMIT,
    StoreWait,
    TickFailures,
    stop_while_store_down,
    trainer_fate,
)
from guardian.rescue.supervisor import Supervisor
from guardian.sources.jsonl import MetricsBatch, MetricsFile
from guardian.store import Store, StoreError
from guardian.store.writebehind import RETRY_MAX_S, WriteBehind

SCRIPTED = Path(__file__).parents[1] / "scripted_trainer.py"
TOTAL_STEPS = 200
RUN = "faults"
BUSY_S = 0.2  # the store's busy timeout here: a held lock refuses writes after this long


# ------------------------------------------------------------------------------------------ helpers


class Clock(ManualClock):
    """Real time plus a skew the test adds (to pass a backoff or a deadline at once)."""

    def __init__(self) -> None:
        super().__init__(time.time())
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew


def sqlite_url(db: Path) -> str:
    return f"sqlite:///{db}"


def config_for(home: Path, url: str) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "db_url": url,
            "sources": {"poll_interval_s": 0.05},
            "intervention": {"probation_steps": 10, "stop_sigint_s": 5, "stop_sigterm_s": 5, "stop_sigkill_s": 5},
        }
    )


def command(ckpt: Path) -> list[str]:
    """Learns for 15 steps, then entropy collapses (-25 % a step); patched, it holds and scores 0.6."""
    return [
        sys.executable,
        str(SCRIPTED),
        f"trainer.default_local_dir={ckpt}",
        f"trainer.total_training_steps={TOTAL_STEPS}",
        "trainer.save_freq=5",
        "actor_rollout_ref.actor.entropy_coeff=-0.1",
        "+script.fixed_reward=0.6",
    ]


def supervisor_for(
    tmp_path: Path, store: Store, url: str, after_commit: Callable[[str], None] = lambda s: None
) -> Supervisor:
    made = supervisor(
        config_for(tmp_path / "home", url),
        store,
        run_id=RUN,
        command=tuple(command(tmp_path / "ckpt")),
        cwd=tmp_path,
        site=TrainerSite({k: v for k, v in os.environ.items() if k != "VERL_FILE_LOGGER_PATH"}, LocalProcessControl()),
        clock=Clock(),
        after_commit=after_commit,
    )
    register_run(store, made.layout, mode=made.config.mode, name="faults")
    return made


def tick_until(supervisor: Supervisor, done: Callable[[], bool], timeout_s: float = 60.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = supervisor.tick()
        if done() or code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError("timed out driving the supervisor")


def stopped(supervisor: Supervisor) -> bool:
    return (
        supervisor.trainer.attempt is not None
        and supervisor.trainer.control.exit_status(supervisor.trainer.attempt.handle) is not None
    )  # type: ignore[arg-type]


def file_steps(home: Path, attempt: int) -> set[int]:
    path = home / "runs" / RUN / f"attempt-{attempt}" / "metrics.jsonl"
    return {orjson.loads(line)["step"] for line in path.read_bytes().splitlines() if line.strip()}


def stored_steps(url: str, attempt_id: int) -> set[int]:
    return {step for (step,) in rows(url, "SELECT step FROM steps WHERE attempt_id = :a", a=attempt_id)}


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"event={name} ")]


def first_critical_step(caplog: pytest.LogCaptureFixture) -> int:
    """The step at which the guardian first judged the run critical (from memory: also while the store is down)."""
    line = next(f for f in events(caplog, "finding") if "severity=critical" in f)
    return int(line.split(" step=", 1)[1].split(" ", 1)[0])


def assert_stopped_early(home: Path, detected: int | None) -> None:
    """The collapsing trainer was stopped after the guardian saw the collapse, not left to run to its end. Relative
    to the detection, not a fixed step: how many steps a 20 ms/step trainer logs between the tick that judged it
    and its stop is a race with the machine's load (the stop itself is proven by the callers: the trainer had
    exited while the store was still refusing writes)."""
    logged = file_steps(home, 1)
    assert detected is not None and detected in logged, "it was judged on a step the trainer logged"
    assert max(logged) < TOTAL_STEPS, f"stopped, not finished (detected at step {detected}, last {max(logged)})"


def assert_rescued_with_everything_stored(supervisor: Supervisor, store: Store, url: str, home: Path) -> None:
    """The rescue ran once to the end, on the stored evidence of every step, finding and state."""
    (attempt1, attempt2) = store.attempts(RUN)  # one relaunch: never two trainers
    assert file_steps(home, 1) <= stored_steps(url, attempt1.id), "every step the first trainer logged is stored"
    (iv,) = store.interventions(RUN)
    states = [e.state for e in store.intervention_events(iv.id)]
    assert [s for s in states if s != "STOPPED"] == [
        "DETECTED", "STOPPING", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION", "RESOLVED"
    ]  # fmt: skip
    assert iv.to_attempt_id == attempt2.id
    detail = store.get_incident(iv.incident_id)
    assert detail is not None and detail.incident.status == "resolved"
    assert_stopped_early(home, detail.incident.opened_step)
    raised = [(f.check, f.step, f.severity) for f in detail.findings]
    assert raised and len(raised) == len(set(raised)), "each finding stored exactly once"
    assert not [i for i in store.list_incidents(RUN) if i.check == "crash"], "the guardian's own stop is no crash"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="guardian")
    return caplog


# ------------------------------------------------------------------------------------- decisions


def test_the_guardian_waits_for_the_store_only_while_no_trainer_runs() -> None:
    wait = StoreWait(limit_s=10)
    assert not wait.update(needed=True, now=100) and not wait.update(needed=True, now=110)
    assert wait.update(needed=True, now=110.5) and wait.waited(110.5) == 10.5
    assert not wait.update(needed=False, now=111) and not wait.update(needed=True, now=120), (
        "a running trainer resets it"
    )


@pytest.mark.parametrize(
    ("mode", "running", "collapsing", "stop_now", "fate"),
    [
        ("enforce", True, True, True, "stop"),
        ("enforce", True, False, False, "leave"),
        ("observe", True, True, False, "leave"),
        ("advise", True, True, False, "leave"),
        ("enforce", False, True, False, "none"),
    ],
)
def test_what_becomes_of_the_trainer(mode: str, running: bool, collapsing: bool, stop_now: bool, fate: str) -> None:
    assert stop_while_store_down(mode=mode, running=running, collapsing=collapsing) is stop_now
    assert trainer_fate(mode=mode, running=running, collapsing=collapsing) == fate


def test_tick_failures_log_the_first_of_a_streak_and_give_up_at_the_limit() -> None:
    failures = TickFailures(limit=3)
    assert failures.failed() and not failures.failed() and not failures.exhausted
    assert failures.succeeded() == 2 and failures.failed(), "a new streak logs again"
    failures.failed()
    failures.failed()
    assert failures.exhausted


# ------------------------------------------------------------------------------------- write-behind


def _ensure(store: Store, run_id: str) -> None:
    store.ensure_run(
        run_id, name=run_id, metrics_path="m", rollouts_dir="r", checkpoints_dir=None, mode="observe", now=1.0
    )


def test_write_behind_queues_in_order_while_locked_and_replays_once_released(
    db_url: str, logs: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(1000.0)
    with Store.open(db_url, busy_timeout_s=BUSY_S) as store:
        _ensure(store, "r")
        attempt = store.start_attempt("r", metrics_path="m", now=1.0)
        writes = WriteBehind(store, lambda: clock.now)
        lock = HeldLock(db_url)
        lock.take()

        def steps(n: int) -> Callable[[Store], None]:
            return lambda s: s.write_steps("r", attempt.id, 0, [StepRecord(n, {"x": float(n)})], clock.now)

        writes.submit("tick", steps(1))
        writes.submit("tick", steps(2))  # queued behind the first without trying the database
        assert writes.degraded and writes.pending == 2
        (line,) = events(logs, "store_unavailable")
        fix = {"sqlite": "fuser", "postgresql": "pg_terminate_backend"}[backend(db_url)]
        assert lock.refusal in line and "fix=" in line and fix in line
        writes.retry()  # the backoff has not passed: nothing tried
        assert writes.pending == 2
        lock.release()
        clock.now += RETRY_MAX_S
        writes.retry()
        assert not writes.degraded and writes.pending == 0
        assert stored_steps(db_url, attempt.id) == {1, 2}
        (recovered,) = events(logs, "store_recovered")
        assert "replayed=2" in recovered


def test_write_behind_counts_and_says_what_a_full_queue_drops(db_url: str, logs: pytest.LogCaptureFixture) -> None:
    with Store.open(db_url, busy_timeout_s=BUSY_S) as store:
        _ensure(store, "r")
        writes = WriteBehind(store, time.time, limit=2)
        lock = HeldLock(db_url)
        lock.take()
        for n in range(4):
            writes.submit("tick", lambda s, n=n: _ensure(s, f"r{n}"))
        lock.release()
        assert (writes.pending, writes.dropped) == (2, 2)
        (line,) = events(logs, "store_writes_dropped")
        assert "limit=2" in line and "metrics files" in line


def test_a_unit_commits_whole_or_not_at_all(db_url: str) -> None:
    """A tick's steps and the findings they produced are one transaction: a failure keeps none of it."""
    with Store.open(db_url) as store:
        writes = WriteBehind(store, time.time)

        def half_then_bug(s: Store) -> None:
            _ensure(s, "half")
            raise ValueError("a bug, not an outage")

        with pytest.raises(ValueError, match="a bug"):
            writes.submit("tick", half_then_bug)
        assert store.get_run("half") is None and not writes.degraded


def stored_findings(url: str) -> list[tuple[Any, ...]]:
    return rows(url, 'SELECT "check", step, severity FROM findings ORDER BY id')


def test_a_refused_tick_keeps_nothing_half_and_a_restart_stores_each_step_and_finding_once(
    tmp_path: Path, db_url: str, logs: pytest.LogCaptureFixture
) -> None:
    """A tick's steps and the findings they produced commit together, so a guardian that dies with its queue
    (or after any commit) and re-reads the file neither loses a finding nor stores one twice."""
    metrics = tmp_path / "metrics.jsonl"
    trainer = [sys.executable, str(SCRIPTED), f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)}
    subprocess.run(
        [*trainer, "trainer.total_training_steps=40", "actor_rollout_ref.actor.entropy_coeff=-0.1"], env=env, check=True
    )
    config = GuardianConfig.model_validate({"home": str(tmp_path / "home")})
    clock = ManualClock(time.time())
    with Store.open(db_url, busy_timeout_s=BUSY_S) as store:
        _ensure(store, "r")
        attempt = store.start_attempt("r", metrics_path=str(metrics), now=clock.now)

        def guardian() -> IncidentTick:
            made = IncidentTick(
                config=config, store=store, run_id="r", metrics=MetricsFile(metrics), clock=lambda: clock.now
            )
            stored = store.latest_step_of_attempt(attempt.id)
            made.switch_attempt(attempt.id, MetricsFile(metrics), judged_through=stored)
            return made

        lock = HeldLock(db_url)
        lock.take()
        died = guardian()
        died.tick()
        lock.release()
        assert died.store_degraded and died.store_pending_writes == 1
        assert any(f.severity is Severity.CRITICAL for f in died.tracker.latest.values()), "judged from memory"
        assert stored_steps(db_url, attempt.id) == set() and stored_findings(db_url) == [], "nothing half-stored"
        guardian().tick()  # a restart after the first guardian died with its queue
        assert stored_steps(db_url, attempt.id) == set(range(1, 41))
        first = stored_findings(db_url)
        assert ("entropy_collapse", "critical") in {(check, severity) for check, _, severity in first}
        assert len(first) == len(set(first))
        guardian().tick()  # and a restart after everything was committed
        assert stored_findings(db_url) == first


# ------------------------------------------------------------------------------- a PostgreSQL server stopped


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of the test's own, to stop and start again."""
    with running_postgres() as server:
        yield server


def test_a_postgresql_server_stopped_mid_unit_is_an_outage_the_write_behind_outlasts(
    own_postgres: PostgresServer, logs: pytest.LogCaptureFixture
) -> None:
    """A fast shutdown ends the unit's session mid-transaction ('terminating connection due to administrator
    command'); while the server is down every connection is refused. Both are outages (``unavailable``): the units
    queue in order and are replayed once the server is back, none lost, none half-kept."""
    url = own_postgres.database()
    clock = ManualClock(1000.0)
    with Store.open(url, busy_timeout_s=BUSY_S) as store:
        _ensure(store, "r")
        attempt = store.start_attempt("r", metrics_path="m", now=1.0)
        writes = WriteBehind(store, lambda: clock.now)

        def step(s: Store, n: int) -> None:
            s.write_steps("r", attempt.id, 0, [StepRecord(n, {"x": float(n)})], clock.now)

        stops = [own_postgres.stop]

        def stopped_halfway(s: Store) -> None:  # the first time only: its replay goes through
            step(s, 1)
            while stops:
                stops.pop()()
            step(s, 2)

        writes.submit("tick", stopped_halfway)
        writes.submit("tick", lambda s: step(s, 3))
        assert writes.degraded and writes.pending == 2
        with pytest.raises(OperationalError) as refused:
            store.get_run("r")
        assert "Connection refused" in str(refused.value)
        assert unavailable(refused.value) and is_outage(refused.value)
        clock.now += RETRY_MAX_S
        writes.retry()  # still down: refused, kept
        assert writes.degraded and writes.pending == 2 and "Connection refused" in (writes.error or "")
        own_postgres.start()
        clock.now += RETRY_MAX_S
        writes.retry()
        assert not writes.degraded and writes.pending == 0 and writes.failed_units == 0
    assert stored_steps(url, attempt.id) == {1, 2, 3}
    (down,) = events(logs, "store_unavailable")
    assert "AdminShutdown: terminating connection due to administrator command" in down
    (recovered,) = events(logs, "store_recovered")
    assert "replayed=2" in recovered


HUNG_S = 1.0  # the store's statement timeout here (above BUSY_S, as the configuration requires)
CONNECT_S = 2  # the URL's connect_timeout here: a new connection to a stopped postmaster gives up after this
SLACK_S = 1.5  # a loaded 2-core machine: the wait's 0.1 s polling, closing the connection, SQLAlchemy's handling


def cluster_pids(server: PostgresServer) -> list[int]:
    """The postmaster and its children (backends, checkpointer, ...: each leads a session of its own, so they are not
    in the postmaster's process group), found by their parent in /proc."""
    assert server.process is not None
    postmaster = server.process.pid
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def stop_answering(server: PostgresServer) -> list[int]:
    """Every process of the cluster stopped (SIGSTOP): connected sockets stay open and the kernel still acknowledges
    what is sent, nothing answers; the postmaster accepts no connection. Returns the pids for ``answer_again``."""
    stopped = cluster_pids(server)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    return stopped


def answer_again(stopped: list[int]) -> None:
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)


def test_a_postgresql_server_that_stops_answering_mid_unit_is_an_outage_within_the_statement_timeout(
    own_postgres: PostgresServer, logs: pytest.LogCaptureFixture
) -> None:
    """The server's processes are stopped between two statements of a unit: the second gets no answer, and after
    ``statement_timeout_s`` it fails as an outage (not a hang of the guard loop); its connection is closed, the unit
    is queued whole. While the server stays stopped a direct call fails within the connect timeout. Once it runs
    again the queue is replayed: each step stored once, nothing of the cut-off transaction kept twice."""
    url = f"{own_postgres.database()}?connect_timeout={CONNECT_S}"
    clock = ManualClock(1000.0)
    took: dict[str, float] = {}
    with Store.open(url, busy_timeout_s=BUSY_S, statement_timeout_s=HUNG_S) as store:
        _ensure(store, "r")
        attempt = store.start_attempt("r", metrics_path="m", now=1.0)
        writes = WriteBehind(store, lambda: clock.now)

        def step(s: Store, n: int) -> None:
            s.write_steps("r", attempt.id, 0, [StepRecord(n, {"x": float(n)})], clock.now)

        stopped: list[int] = []

        def hung_halfway(s: Store) -> None:  # the first time only: its replay goes through
            step(s, 1)
            if not stopped:
                stopped.extend(stop_answering(own_postgres))
            started = time.monotonic()
            try:
                step(s, 2)
            finally:
                took.setdefault("statement", time.monotonic() - started)

        try:
            writes.submit("tick", hung_halfway)
            assert writes.degraded and writes.pending == 1
            assert "no answer within 1 s (store.statement_timeout_s)" in (writes.error or "")
            started = time.monotonic()
            with pytest.raises(OperationalError) as refused:
                store.get_run("r")  # a new connection: the postmaster is stopped too
            took["connect"] = time.monotonic() - started
            assert "connection timeout expired" in str(refused.value)
            assert unavailable(refused.value) and is_outage(refused.value)
        finally:
            answer_again(stopped)
        clock.now += RETRY_MAX_S
        writes.retry()
        assert not writes.degraded and writes.pending == 0 and writes.failed_units == 0
        assert store.get_run("r") is not None
    print(
        f"hung server: statement failed after {took['statement']:.2f} s, new connection after {took['connect']:.2f} s"
    )
    assert HUNG_S <= took["statement"] < HUNG_S + SLACK_S
    assert CONNECT_S <= took["connect"] < CONNECT_S + SLACK_S
    assert stored_steps(url, attempt.id) == {1, 2}
    (down,) = events(logs, "store_unavailable")
    assert "NoAnswer: the PostgreSQL server gave no answer within 1 s" in down
    (recovered,) = events(logs, "store_recovered")
    assert "replayed=1" in recovered


def test_the_password_reaches_no_log_line_error_or_row(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every logger at DEBUG (SQLAlchemy's engine and pool too) through an open, writes, an outage with its
    recovery, and opens that fail (no such database, an unknown option, a wrong password, a server down): the
    password is nowhere - no log line, no error or its traceback, no stored row - neither raw nor escaped."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")  # its own root logger is held at WARNING
    url = own_postgres.database()
    wrong = URL.create("postgresql+psycopg", USER, PASSWORD[::-1], "127.0.0.1", own_postgres.port, "postgres")
    errors: list[BaseException] = []

    def refused_open(target: str, says: str) -> None:
        with pytest.raises(StoreError, match=says) as refused:
            Store.open(target)
        errors.append(refused.value)

    refused_open(own_postgres.url("no_such_database"), 'database "no_such_database" does not exist')
    refused_open(f"{url}?bogus=1", 'invalid connection option "bogus"')
    refused_open(wrong.render_as_string(hide_password=False), "password authentication failed")
    clock = ManualClock(1000.0)
    with Store.open(url, busy_timeout_s=BUSY_S) as store:
        _ensure(store, "r")
        attempt = store.start_attempt("r", metrics_path="m", now=1.0)
        writes = WriteBehind(store, lambda: clock.now)
        own_postgres.stop()
        writes.submit("tick", lambda s: s.write_steps("r", attempt.id, 0, [StepRecord(1, {"x": 1.0})], clock.now))
        assert writes.degraded
        refused_open(url, "Connection refused")
        own_postgres.start()
        clock.now += RETRY_MAX_S
        writes.retry()
        assert not writes.degraded
    stored = [
        rows(url, f"SELECT * FROM {table}")
        for (table,) in rows(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    ]
    said = [caplog.text, *(str(e) for e in errors), *("".join(traceback.format_exception(e)) for e in errors)]
    assert "sqlalchemy.pool" in caplog.text and len(events(caplog, "store_unavailable")) == 1, "it did log"
    assert f"{USER}:***@127.0.0.1" in caplog.text, "the URL was logged, masked"
    for secret in (PASSWORD, urllib.parse.quote(PASSWORD, safe=""), PASSWORD[::-1]):
        assert not [text for text in said if secret in text]
        assert secret not in repr(stored)


# ----------------------------------------------------------------------------- the supervisor, faulted


@pytest.mark.slow
@pytest.mark.parametrize("lock_after", ["DETECTED", "STOPPED"])
def test_a_held_exclusive_lock_during_an_intervention(
    tmp_path: Path, db_url: str, logs: pytest.LogCaptureFixture, lock_after: str
) -> None:
    """DETECTED: the lock keeps the intervention from committing STOPPING, yet the guardian stops the collapsing
    trainer. STOPPED: the rollback cannot be committed; the stopped trainer waits. Either way, once the lock is
    released the rescue runs to the end with every step, finding, incident and state stored."""
    home = tmp_path / "home"
    lock = HeldLock(db_url)
    with Store.open(db_url, busy_timeout_s=BUSY_S) as store:
        supervisor = supervisor_for(tmp_path, store, db_url, lambda s: lock.take() if s == lock_after else None)
        try:
            supervisor.start()
            tick_until(supervisor, lambda: lock.connection is not None and supervisor.incident_tick.store_degraded)
            tick_until(supervisor, lambda: stopped(supervisor))
            assert supervisor.incident_tick.store_degraded, "stopped while the store was still locked"
            for _ in range(10):  # it holds: no relaunch while the store is down
                assert supervisor.tick() is None
            assert len(supervisor.store.attempts(RUN)) == 1
            lock.release()
            supervisor.clock.skew += RETRY_MAX_S  # type: ignore[attr-defined]
            code = tick_until(supervisor, lambda: False)
        finally:
            lock.release()
            if supervisor.trainer.attempt is not None and supervisor.trainer.attempt.handle is not None:
                supervisor.trainer.halt(reason="test over")
        assert code == 0
        assert_rescued_with_everything_stored(supervisor, store, db_url, home)
    assert len(events(logs, "store_unavailable")) == 1 and len(events(logs, "store_recovered")) == 1


@pytest.mark.slow
def test_a_postgresql_server_stopped_during_an_intervention(
    tmp_path: Path, own_postgres: PostgresServer, logs: pytest.LogCaptureFixture
) -> None:
    """The server stops (fast shutdown) right after DETECTED is committed: the guardian still stops the collapsing
    trainer, holds while the server is down, and once it is back the rescue runs to the end with every step,
    finding, incident and state stored."""
    url, home = own_postgres.database(), tmp_path / "home"
    with Store.open(url, busy_timeout_s=BUSY_S) as store:
        supervisor = supervisor_for(tmp_path, store, url, lambda s: own_postgres.stop() if s == "DETECTED" else None)
        try:
            supervisor.start()
            tick_until(supervisor, lambda: supervisor.incident_tick.store_degraded)
            tick_until(supervisor, lambda: stopped(supervisor))
            assert supervisor.incident_tick.store_degraded, "stopped while the server was still down"
            for _ in range(10):  # it holds: no relaunch while the store is down
                assert supervisor.tick() is None
            own_postgres.start()
            assert len(supervisor.store.attempts(RUN)) == 1
            supervisor.clock.skew += RETRY_MAX_S  # type: ignore[attr-defined]
            code = tick_until(supervisor, lambda: False)
        finally:
            if supervisor.trainer.attempt is not None and supervisor.trainer.attempt.handle is not None:
                supervisor.trainer.halt(reason="test over")
        assert code == 0
        assert_rescued_with_everything_stored(supervisor, store, url, home)
    assert len(events(logs, "store_unavailable")) == 1 and len(events(logs, "store_recovered")) == 1


class TmpfsDisk:
    """The database on a small tmpfs that a filler file fills up."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(root)], check=True, capture_output=True)
        self.root = root
        self.db = root / "guardian.db"
        self.filler = root / "filler"

    def fill(self, store: Store) -> None:
        with self.filler.open("wb", buffering=0) as out:
            for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
                try:
                    while True:
                        out.write(chunk)
                except OSError:
                    continue

    def free(self, store: Store) -> None:
        self.filler.unlink()

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)


class PageLimitDisk:
    """Unprivileged stand-in: every write the guardian's SQLite connections try fails with SQLite's own
    ``database or disk is full``. (A page cap alone is not enough: a write that fits in an existing page's slack,
    like a table's first row, still lands, so which writes failed depended on timing.)"""

    WRITES = ("insert", "update", "delete", "replace")

    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.db = root / "guardian.db"

    def _refuse_writes(self, cursor: sqlite3.Cursor, statement: str, parameters: object, context: object) -> None:
        if statement.lstrip().lower().startswith(self.WRITES):
            raise sqlite3.OperationalError("database or disk is full")

    def fill(self, store: Store) -> None:
        for name in ("do_execute", "do_executemany"):
            event.listen(Engine, name, self._refuse_writes)

    def free(self, store: Store) -> None:
        self.close()

    def close(self) -> None:
        for name in ("do_execute", "do_executemany"):
            if event.contains(Engine, name, self._refuse_writes):
                event.remove(Engine, name, self._refuse_writes)


@pytest.fixture(params=["tmpfs", "page_limit"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TmpfsDisk | PageLimitDisk]:
    """A filesystem that can fill up: tmpfs where mount is allowed, else (and always for ``page_limit``) the
    unprivileged stand-in - never a skip."""
    made: TmpfsDisk | PageLimitDisk
    try:
        made = TmpfsDisk(tmp_path / "fs") if request.param == "tmpfs" else PageLimitDisk(tmp_path / "fs")
    except (subprocess.CalledProcessError, OSError):
        made = PageLimitDisk(tmp_path / "fs-fallback")
    yield made
    made.close()


@pytest.mark.slow
def test_a_full_filesystem_while_the_run_collapses(
    tmp_path: Path, logs: pytest.LogCaptureFixture, disk: TmpfsDisk | PageLimitDisk
) -> None:
    """The disk fills before the collapse: the guardian judges from memory and stops the trainer; once space is
    freed the queued steps and findings are replayed and the rescue carries on from them."""
    home = tmp_path / "home"
    with Store.open(sqlite_url(disk.db), busy_timeout_s=BUSY_S) as store:
        supervisor = supervisor_for(tmp_path, store, sqlite_url(disk.db))
        try:
            supervisor.start()
            tick_until(supervisor, lambda: (supervisor.incident_tick.history.last_step or 0) >= 5)
            disk.fill(store)
            tick_until(supervisor, lambda: stopped(supervisor))
            assert supervisor.incident_tick.store_degraded and supervisor.incident_tick.store_pending_writes > 0
            assert "disk is full" in (supervisor.incident_tick.writes.error or "")
            assert store.interventions(RUN) == [], "no intervention can start without the store"
            disk.free(store)
            supervisor.clock.skew += RETRY_MAX_S  # type: ignore[attr-defined]
            code = tick_until(supervisor, lambda: False)
        finally:
            if supervisor.trainer.attempt is not None and supervisor.trainer.attempt.handle is not None:
                supervisor.trainer.halt(reason="test over")
        assert code == 0
        assert_rescued_with_everything_stored(supervisor, store, sqlite_url(disk.db), home)
    (line,) = events(logs, "store_unavailable")
    assert "free space" in line


@pytest.mark.slow
def test_a_corrupted_page_mid_run_stops_the_collapsing_trainer_and_says_so_in_one_line(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "guardian.db"
    with Store.open(sqlite_url(db), busy_timeout_s=BUSY_S) as store:
        supervisor = supervisor_for(tmp_path, store, sqlite_url(db))
        try:
            supervisor.start()
            tick_until(supervisor, lambda: (supervisor.incident_tick.history.last_step or 0) >= 5)
            corrupt_table(db)
            store.close()  # connections opened from here on read the damaged file
            tick_until(supervisor, lambda: stopped(supervisor))
            assert supervisor.incident_tick.store_degraded
            assert supervisor.tick() is None, "it waits for the store first"
            supervisor.clock.skew += STORE_WAIT_S + 1  # type: ignore[attr-defined]
            code = tick_until(supervisor, lambda: False, timeout_s=10)
        finally:
            if supervisor.trainer.attempt is not None and supervisor.trainer.attempt.handle is not None:
                supervisor.trainer.halt(reason="test over")
    assert code == 1
    (line,) = events(logs, "guardian_cannot_continue")
    assert "malformed" in line and ".recover" in line and 'trainer="not running"' in line
    assert f"guardian run --attach {RUN}" in line
    assert not [r for r in logs.records if r.exc_info], "no traceback"
    assert_stopped_early(tmp_path / "home", first_critical_step(logs))


# --------------------------------------------------------------------------------- failing ticks


class FailingMetrics:
    """A metrics source whose ``poll`` raises for its first ``failures`` calls, then reads the real file."""

    def __init__(self, real: object, failures: int) -> None:
        self.real, self.failures = real, failures

    @property
    def path(self) -> Path:
        return self.real.path  # type: ignore[attr-defined, no-any-return]

    def poll(self, *, final: bool = False) -> MetricsBatch:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("poll exploded")
        return self.real.poll(final=final)  # type: ignore[attr-defined, no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("failures", [2, 10_000])
def test_an_exception_in_a_tick_is_logged_once_and_only_a_repeat_gives_up(
    tmp_path: Path, logs: pytest.LogCaptureFixture, failures: int
) -> None:
    """Two failed ticks: logged once with the traceback, then the run is guarded on (its rescue resolves).
    Every tick failing: after the limit, one line says the guardian cannot continue and the trainer's fate."""
    url = sqlite_url(tmp_path / "guardian.db")
    with Store.open(url) as store:
        supervisor = supervisor_for(tmp_path, store, url)
        supervisor.start()
        supervisor.incident_tick.metrics = FailingMetrics(supervisor.incident_tick.metrics, failures)
        try:
            code = guard_loop(supervisor, threading.Event(), 0.05, live=False)
        finally:
            if supervisor.trainer.attempt is not None and supervisor.trainer.attempt.handle is not None:
                supervisor.trainer.halt(reason="test over")
    (failed,) = events(logs, "tick_failed")
    assert "poll exploded" in failed
    assert len([r for r in logs.records if r.exc_info]) == 1, "the traceback once"
    if failures == 2:
        assert code == 0 and "failed_ticks=2" in events(logs, "tick_recovered")[0]
    else:
        assert code == 1
        (line,) = events(logs, "guardian_cannot_continue")
        assert f"{TICK_FAILURE_LIMIT} ticks in a row failed: RuntimeError: poll exploded" in line
        assert "UNGUARDED" in line, "a healthy-looking trainer is left running, and the line says so"


def test_a_statement_timeout_not_above_the_lock_wait_is_refused_with_both_values() -> None:
    with pytest.raises(ValueError, match=r"statement_timeout_s \(5\) must be above busy_timeout_s \(5\)"):
        GuardianConfig.model_validate({"store": {"busy_timeout_s": 5, "statement_timeout_s": 5}})
    assert GuardianConfig().store.statement_timeout_s > GuardianConfig().store.busy_timeout_s
