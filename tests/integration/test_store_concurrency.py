"""Two guardians, two processes, one database: each writes its own run - steps, findings, incidents, checkpoints,
interventions - one transaction per tick, as the guard loop does, for a while, and at the same time (both open a
new database at once too: its schema is created once).

PostgreSQL: the two write at once - their transactions overlap in time (row locks on different runs do not meet),
neither waits for the other, neither fails (no deadlock, no lock timeout). SQLite: the same rows, all of them, but
one writer at a time - ``BEGIN IMMEDIATE`` takes the file's write lock, so the other's transaction waits (within the
busy timeout) and their transactions never overlap. The figures (time in transactions, overlap, the slowest tick)
are printed (``pytest -s``); what is asserted is every row, the bound on the time, and the overlap or its absence.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

from postgres_server import backend, rows

from guardian.core import Finding, Severity, StepRecord
from guardian.states import State
from guardian.store import Store

TICKS = 120
STEPS_PER_TICK = 5
KEYS = [f"actor/metric_{k:02d}" for k in range(60)]
INCIDENT_EVERY = 10  # ticks: an incident opened, escalated, intervened on and closed per 10 ticks
BOUND_S = 120.0  # both guardians finish well within this (each takes a few seconds on its own)
T0 = 1_795_000_000.0


def _value(guardian: int, step: int, k: int) -> float:
    return guardian * 1e6 + step + k / 100.0


def _tick(store: Store, guardian: int, run_id: str, attempt_id: int, tick: int) -> None:
    """One guard-loop tick's writes in the caller's transaction."""
    now = T0 + tick
    first = tick * STEPS_PER_TICK + 1
    records = [
        StepRecord(step, {key: _value(guardian, step, k) for k, key in enumerate(KEYS)})
        for step in range(first, first + STEPS_PER_TICK)
    ]
    store.write_steps(run_id, attempt_id, 0, records, now)
    phase = tick % INCIDENT_EVERY
    finding = Finding("entropy_collapse", Severity.CRITICAL if phase else Severity.WARN, first, f"{run_id} {tick}")
    incident = store.open_incident_for(run_id, "entropy_collapse")
    if incident is None:
        incident = store.open_incident(run_id, finding, now)
    else:
        store.escalate_incident(incident.id, finding, now)
    store.add_finding(run_id, attempt_id, finding, now, incident_id=incident.id)
    if phase == 1:
        path = f"/ckpt/{run_id}/global_step_{first}"
        store.record_checkpoint(run_id, step=first, path=path, verdict="healthy", now=now)
        intervention = store.create_intervention(
            run_id, incident.id, kind="remediate", rung=0, from_attempt_id=attempt_id, now=now
        )
        for state in (State.STOPPING, State.STOPPED, State.ROLLED_BACK):
            store.advance(intervention.id, state, now=now, target_step=first)
    if phase == INCIDENT_EVERY - 1:
        active = store.active_intervention(run_id)
        assert active is not None
        store.advance(active.id, State.RESOLVED, now=now)
        store.close_incident(incident.id, status="resolved", now=now, step=first)


@dataclass(frozen=True)
class Report:
    run_id: str
    seconds: float
    spans: list[tuple[float, float]]  # each tick inside its transaction: BEGIN done to COMMIT asked (monotonic)
    slowest_s: float  # the longest tick, from asking for its transaction to its commit done (waits included)
    error: str | None


def guard(url: str, guardian: int, start: Any, results: Any) -> None:
    """A guardian process: open the store (at the same moment as the other), then ``TICKS`` ticks on its own run."""
    run_id = f"run-{guardian}"
    spans: list[tuple[float, float]] = []
    slowest, error = 0.0, None
    began = time.monotonic()
    try:
        start.wait(60)
        began = time.monotonic()
        with Store.open(url) as store:
            store.ensure_run(
                run_id, name=run_id, metrics_path="m", rollouts_dir="r", checkpoints_dir=None, mode="enforce", now=T0
            )
            attempt = store.start_attempt(run_id, metrics_path="m", now=T0)
            for tick in range(TICKS):
                asked = time.monotonic()
                with store.transaction() as unit:
                    begun = time.monotonic()  # SQLite: the write lock is held from here to the commit
                    _tick(unit, guardian, run_id, attempt.id, tick)
                    spans.append((begun, time.monotonic()))
                slowest = max(slowest, time.monotonic() - asked)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.put(Report(run_id, time.monotonic() - began, spans, slowest, error))


def overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """How long both had a transaction open at once."""
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += max(0.0, min(end, b[k][1]) - max(start, b[k][0]))
            k += 1
    return total


def assert_every_row(url: str, store: Store, guardian: int) -> None:
    run_id = f"run-{guardian}"
    steps = TICKS * STEPS_PER_TICK
    assert store.count_steps(run_id) == steps
    series = store.step_series(run_id, [KEYS[0], KEYS[-1]])
    assert series[KEYS[0]] == [(s, _value(guardian, s, 0)) for s in range(1, steps + 1)], "its own values only"
    assert series[KEYS[-1]][-1] == (steps, _value(guardian, steps, len(KEYS) - 1))
    incidents = store.list_incidents(run_id)
    assert len(incidents) == TICKS // INCIDENT_EVERY and all(i.status == "resolved" for i in incidents)
    interventions = store.interventions(run_id)
    assert [i.number for i in interventions] == list(range(1, TICKS // INCIDENT_EVERY + 1))
    assert all(i.state is State.RESOLVED for i in interventions)
    timelines = store.run_timelines(run_id)
    assert all(len(events) == 5 for events in timelines.values()), "DETECTED, 3 steps, RESOLVED: none lost"
    assert len(store.checkpoints(run_id)) == TICKS // INCIDENT_EVERY
    (findings,) = rows(url, "SELECT count(*) FROM findings WHERE run_id = :r", r=run_id)
    assert findings == (TICKS,)


def test_two_guardians_write_their_runs_to_one_database_at_once(db_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=guard, args=(db_url, g, start, results)) for g in (1, 2)]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    try:
        reports = {report.run_id: report for report in (results.get(timeout=BOUND_S) for _ in workers)}
        for worker in workers:
            worker.join(10)
    finally:
        for worker in workers:
            if worker.is_alive():  # a guardian blocked past the bound
                worker.terminate()
                worker.join(10)
    elapsed = time.monotonic() - began
    assert {run_id: r.error for run_id, r in reports.items()} == {"run-1": None, "run-2": None}
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert elapsed < BOUND_S

    with Store.open(db_url) as store:
        assert store.schema_version() and len(rows(db_url, "SELECT * FROM alembic_version")) == 1
        for guardian in (1, 2):
            assert_every_row(db_url, store, guardian)

    one, two = reports["run-1"].spans, reports["run-2"].spans
    both = overlap_s(one, two)
    busy = [sum(end - start for start, end in spans) for spans in (one, two)]
    slowest = max(r.slowest_s for r in reports.values())
    print(  # the figures the module docstring describes
        f"\n{backend(db_url)}: {TICKS} ticks each in {reports['run-1'].seconds:.2f} s / {reports['run-2'].seconds:.2f}"
        f" s; in transactions {busy[0]:.2f} s / {busy[1]:.2f} s; both at once {both:.2f} s; slowest tick"
        f" {1000 * slowest:.0f} ms"
    )
    if backend(db_url) == "postgresql":
        assert both > 0.1 * min(busy), "the two wrote at the same time, neither waiting for the other"
    else:
        assert both == 0.0, "one writer at a time (the write lock)"


def test_many_first_opens_of_a_new_database_wait_for_the_one_that_migrates(tmp_path: Any) -> None:
    """Sixteen opens at once (a fleet's runs, guardians started together) of a new SQLite file: the first creates the
    schema inside one write transaction, which may outlast the busy timeout; the others wait for it, none fails."""
    import threading

    url = f"sqlite:///{tmp_path / 'new.db'}"
    failures: list[str] = []

    def open_once() -> None:
        try:
            Store.open(url, busy_timeout_s=0.01).close()  # far shorter than the migration takes
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=open_once) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
