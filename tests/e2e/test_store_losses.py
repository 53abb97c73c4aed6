"""What a write the store refuses can lose, and what it must not: real SQLite and PostgreSQL (``db_url``), faults
injected into one call of the guard loop's writes (a real constraint violation for a bug, a driver error for an
outage).

- a tick's writes lost to a bug do not lose its incidents: the tracker judges their checks afresh;
- the lines naming stored rows are logged once, after the commit, never for a rolled-back transaction;
- a relaunch's attempt and its RESUMING state commit together;
- ``dropped`` counts the full queue only, units lost to a bug are ``failed_units``;
- no SQL parameter (run data) reaches the log.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ManualClock
from postgres_server import HeldLock, backend
from rescue_world import RUN as RESCUE_RUN
from rescue_world import World
from sqlalchemy.exc import IntegrityError, OperationalError

from guardian.config import GuardianConfig
from guardian.core import Finding, Severity
from guardian.faults import failure_text
from guardian.incidents.tick import IncidentTick
from guardian.sources.jsonl import MetricsFile
from guardian.states import Kind, State
from guardian.store import InterventionView, Store, StoredPlan
from guardian.store.writebehind import RETRY_MAX_S, WriteBehind

SCRIPTED = Path(__file__).parents[1] / "scripted_trainer.py"
RUN = "losses"
SECRET = "s3cr3t-token-in-a-parameter"
BUSY_S = 0.2
FOREIGN_KEY_REFUSED = {"sqlite": "FOREIGN KEY constraint failed", "postgresql": "violates foreign key constraint"}


# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The metrics file of a finished scripted run whose entropy collapses (40 steps)."""
    root = tmp_path_factory.mktemp("collapsed")
    metrics = root / "metrics.jsonl"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPTED),
            f"trainer.default_local_dir={root / 'ckpt'}",
            "trainer.total_training_steps=40",
            "actor_rollout_ref.actor.entropy_coeff=-0.1",
        ],
        env={**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)},
        check=True,
    )
    return metrics


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="guardian")
    return caplog


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.open(db_url, busy_timeout_s=BUSY_S) as opened:
        opened.ensure_run(
            RUN, name=RUN, metrics_path="m", rollouts_dir="r", checkpoints_dir=None, mode="observe", now=1.0
        )
        yield opened


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"event={name} ")]


def guardian_on(store: Store, metrics: Path, clock: ManualClock, home: Path) -> IncidentTick:
    config = GuardianConfig.model_validate({"home": str(home)})
    attempt = store.start_attempt(RUN, metrics_path=str(metrics), now=clock.now)
    guardian = IncidentTick(config=config, store=store, run_id=RUN, metrics=MetricsFile(metrics), clock=clock)
    guardian.switch_attempt(attempt.id, MetricsFile(metrics))
    return guardian


def violate_a_constraint(store: Store) -> None:
    """A real IntegrityError whose parameters carry ``SECRET``: a finding of an attempt that does not exist."""
    store.add_finding(RUN, 10**9, Finding("bug", Severity.WARN, 1, SECRET), 1.0)


def an_outage() -> OperationalError:
    return OperationalError("INSERT INTO steps ...", {"v": SECRET}, sqlite3.OperationalError("disk I/O error"))


def refuse_first_steps(monkeypatch: pytest.MonkeyPatch, refuse: Callable[[Store], None]) -> None:
    """``Store.write_steps`` runs ``refuse`` in its first call (inside the tick's transaction, after the tick's
    findings and incidents were written in it), then behaves."""
    original = Store.write_steps
    left = [1]

    def write_steps(self: Store, *args: object, **kwargs: object) -> None:
        if left[0]:
            left[0] -= 1
            refuse(self)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "write_steps", write_steps)


def raise_outage(_store: Store) -> None:
    raise an_outage()


def entropy_incidents(store: Store) -> list[int]:
    return [i.id for i in store.list_incidents(RUN) if i.check == "entropy_collapse"]


# ------------------------------------------------------------------------ a tick's unit lost to a bug


@pytest.mark.parametrize("when", ["at once", "in a replay"])
def test_a_tick_refused_for_a_bug_still_opens_its_incident_the_next_tick(
    tmp_path: Path,
    collapsed: Path,
    db_url: str,
    store: Store,
    logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """The refused unit held the RAISED transition that opens the incident: the tracker forgets the check, so the
    next tick raises it again and the incident is opened then (enforce mode would rescue), counted as a failed unit,
    not as a full queue's drop."""
    clock = ManualClock(1000.0)
    guardian = guardian_on(store, collapsed, clock, tmp_path / "home")
    refuse_first_steps(monkeypatch, violate_a_constraint)
    if when == "at once":
        with pytest.raises(IntegrityError):
            guardian.tick()
    else:
        lock = HeldLock(db_url)
        lock.take()
        guardian.tick()  # queued behind the lock
        lock.release()
        assert guardian.store_degraded and guardian.store_pending_writes == 1
        clock.now += RETRY_MAX_S
    assert entropy_incidents(store) == [], "the refused (or queued) unit kept nothing yet"
    if when == "at once":
        assert "entropy_collapse" not in guardian.tracker.latest, "its checks are judged afresh"
    else:
        assert guardian.tracker.latest["entropy_collapse"].severity is Severity.CRITICAL, "judged from memory"

    guardian.tick()  # the replay (if queued) is refused, then this tick raises the collapse again

    (incident,) = entropy_incidents(store)
    assert store.get_incident(incident) is not None
    assert not guardian.store_degraded and guardian.store_pending_writes == 0
    assert (guardian.writes.failed_units, guardian.store_dropped_writes) == (1, 0), "a bug is not a full queue"
    (failed,) = events(logs, "store_write_failed")
    assert "unit=tick" in failed and FOREIGN_KEY_REFUSED[backend(db_url)] in failed and "failed_units=1" in failed
    assert [r.levelno for r in logs.records if r.getMessage() == failed] == [logging.CRITICAL]
    (again,) = events(logs, "checks_judged_again")
    assert "entropy_collapse" in again
    opened = [line for line in events(logs, "incident_opened") if "check=entropy_collapse" in line]
    assert len(opened) == 1 and f"incident={incident} " in opened[0], "opened once, with the stored id"
    if when == "in a replay":
        (recovered,) = events(logs, "store_recovered")
        assert "failed_units=1" in recovered and "dropped=0" in recovered
    assert SECRET not in logs.text


def test_the_write_behind_counts_units_lost_to_a_bug_apart_from_a_full_queue(store: Store) -> None:
    writes = WriteBehind(store, lambda: 0.0)
    lost: list[BaseException] = []
    committed: list[str] = []
    with pytest.raises(IntegrityError):
        writes.submit("tick", violate_a_constraint, committed=lambda: committed.append("bad"), refused=lost.append)
    writes.submit("tick", lambda s: None, committed=lambda: committed.append("good"), refused=lost.append)
    assert [type(e) for e in lost] == [IntegrityError] and committed == ["good"]
    assert (writes.failed_units, writes.dropped, writes.degraded) == (1, 0, False)


# ------------------------------------------------------------------------ lines about rows, after commit


def test_incident_opened_is_logged_once_after_its_commit_not_for_a_rolled_back_transaction(
    tmp_path: Path,
    collapsed: Path,
    store: Store,
    logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tick's unit opens the incident, then the database refuses the unit (an outage): nothing is said about
    the rolled-back incident; the replay commits it and says so once, naming the stored id."""
    clock = ManualClock(1000.0)
    guardian = guardian_on(store, collapsed, clock, tmp_path / "home")
    refuse_first_steps(monkeypatch, raise_outage)
    guardian.tick()
    assert guardian.store_degraded and entropy_incidents(store) == []
    assert events(logs, "incident_opened") == [], "no line for an incident that was rolled back"
    clock.now += RETRY_MAX_S
    guardian.tick()
    assert not guardian.store_degraded
    (incident,) = entropy_incidents(store)
    opened = [line for line in events(logs, "incident_opened") if "check=entropy_collapse" in line]
    assert len(opened) == 1 and f"incident={incident} " in opened[0]
    assert guardian.writes.failed_units == 0
    assert SECRET not in logs.text


# ------------------------------------------------------------------------ the relaunch, in one transaction


def test_a_relaunch_refused_between_its_attempt_and_resuming_keeps_neither(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(store, tmp_path / "run")
    incident = world.incident()
    created = store.create_intervention(
        RESCUE_RUN, incident.id, kind=Kind.REMEDIATE, rung=0, from_attempt_id=None, now=1.0
    )
    store.advance(created.id, State.PATCHED, now=1.0, plan=StoredPlan(argv=("python", "train.py")))
    original = Store.advance
    left = [1]

    def advance(self: Store, *args: object, **kwargs: object) -> InterventionView:
        if left[0] and args[1:2] == (State.RESUMING,):
            left[0] -= 1
            raise an_outage()
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "advance", advance)
    with pytest.raises(OperationalError):
        world.tick()
    assert len(store.attempts(RESCUE_RUN)) == 1, "the new attempt was rolled back with RESUMING"
    assert store.interventions(RESCUE_RUN)[0].state is State.PATCHED and world.calls == []

    world.tick()  # the next pass starts over from PATCHED

    _, attempt = store.attempts(RESCUE_RUN)
    resumed = store.interventions(RESCUE_RUN)[0]
    assert (resumed.state, resumed.to_attempt_id, attempt.number) == (State.RESUMING, attempt.id, 2)
    assert world.calls == ["launch attempt 2: python train.py"]


# ------------------------------------------------------------------------ no run data in the log


def test_a_refused_write_puts_neither_its_parameters_nor_a_password_in_the_log(
    db_url: str, store: Store, logs: pytest.LogCaptureFixture
) -> None:
    """The engine hides parameters from errors; the one-line texts keep the first line (no SQL) and mask passwords."""
    with pytest.raises(IntegrityError) as refused:
        violate_a_constraint(store)
    assert SECRET in repr(refused.value.params), "the secret was a parameter of the refused statement"
    log = logging.getLogger("guardian.test")
    log.error("event=tick_failed error=%s", failure_text(refused.value), exc_info=refused.value)  # as the loops do
    assert FOREIGN_KEY_REFUSED[backend(db_url)] in logs.text and SECRET not in logs.text
    assert SECRET not in "".join(traceback.format_exception(refused.value))
    assert "[SQL:" not in failure_text(refused.value)
    text = failure_text(RuntimeError("cannot reach postgresql://guardian:hunter2@db/g\n[SQL: SELECT 1]"))
    assert text == "RuntimeError: cannot reach postgresql://guardian:***@db/g"
    conninfo = failure_text(RuntimeError("dsn: host=db password=hunter2 user=g, PASSWORD = 'it\\'s \\\\ x' end"))
    assert conninfo == "RuntimeError: dsn: host=db password=*** user=g, PASSWORD = *** end", "libpq's key=value"
