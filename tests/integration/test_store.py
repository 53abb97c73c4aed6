"""The SQL store on real SQLite files and a real PostgreSQL (``db_url``: each test on both): migrations, step blobs,
timelines, incidents, concurrency, errors; and what only one of the two has (SQLite's WAL file, in-memory, paths)."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from postgres_server import HeldLock, database_at, rows
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import OperationalError

from guardian.core import Finding, Severity, StepRecord
from guardian.states import PinMode, RunStatus, State
from guardian.store import (
    NotFoundError,
    Store,
    StoredPlan,
    StoreError,
    head_revision,
    mask_url,
)
from guardian.store.models import Base

T0 = 1_795_000_000.0  # 2026-11-18, any fixed instant


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "guardian.db"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.open(db_url) as opened:
        yield opened


def _run(store: Store, run_id: str = "run-20261130-0142-ab12") -> str:
    store.ensure_run(
        run_id,
        name="gsm8k-grpo",
        metrics_path="/runs/a/metrics.jsonl",
        rollouts_dir="/runs/a/rollouts",
        checkpoints_dir="/ckpt/a",
        mode="observe",
        now=T0,
    )
    return run_id


def _finding(
    severity: Severity = Severity.WARN, step: int = 10, check: str = "entropy", onset: int | None = 8
) -> Finding:
    return Finding(
        check=check,
        severity=severity,
        step=step,
        message=f"entropy collapsing at {step}",
        onset_step=onset,
        evidence={"entropy": 0.01, "baseline": 0.6, "ratio": math.nan, "key": "actor/entropy"},
    )


# ------------------------------------------------------------------------------------ schema


def test_open_creates_the_schema_at_head(db_url: str, store: Store) -> None:
    assert store.schema_version() == head_revision() == "0006"
    engine = create_engine(db_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"runs", "attempts", "steps", "checkpoints", "findings", "incidents", "alembic_version"} <= tables
    assert {"interventions", "intervention_events", "deliveries", "evaluations", "pins"} <= tables


def test_sqlite_is_a_file_in_wal_mode(db_path: Path) -> None:
    with Store.open(_url(db_path)):
        assert db_path.exists()
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_reopening_is_a_no_op_upgrade_that_keeps_history(db_url: str) -> None:
    with Store.open(db_url) as first:
        run_id = _run(first)
        first.add_finding(run_id, None, _finding(), now=T0)
    with Store.open(db_url) as second:
        assert second.schema_version() == head_revision()
        assert [r.id for r in second.list_runs()] == [run_id]
    assert rows(db_url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert rows(db_url, "SELECT count(*) FROM findings") == [(1,)]


def test_hand_written_migration_matches_the_models(db_url: str) -> None:
    database_at(db_url, "head", [])  # the migrations, as an older store is upgraded (a new one is created directly)
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            diffs = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert diffs == []


def _schema(url: str) -> dict[str, object]:
    """Every table's columns, keys, indexes and constraints, as the database reports them."""
    engine = create_engine(url)
    try:
        seen = inspect(engine)
        return {
            table: {
                "columns": sorted(
                    (c["name"], str(c["type"]), c["nullable"], str(c.get("default"))) for c in seen.get_columns(table)
                ),
                "primary_key": seen.get_pk_constraint(table)["constrained_columns"],
                "foreign_keys": sorted(
                    (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                    for f in seen.get_foreign_keys(table)
                ),
                "indexes": sorted((i["name"], tuple(i["column_names"]), i["unique"]) for i in seen.get_indexes(table)),
                "unique": sorted((u["name"], tuple(u["column_names"])) for u in seen.get_unique_constraints(table)),
            }
            for table in sorted(seen.get_table_names())
        }
    finally:
        engine.dispose()


def test_a_new_store_gets_the_schema_the_migrations_build(request: pytest.FixtureRequest, db_url: str) -> None:
    """A new store is created from the models and stamped at head, without Alembic (which would stay in the
    guardian's memory): the same tables, keys and indexes as an older store upgraded through every migration."""
    if db_url.startswith("sqlite"):
        migrated = f"sqlite:///{Path(db_url.removeprefix('sqlite:///')).parent / 'migrated.db'}"
    else:
        migrated = request.getfixturevalue("postgres").database()
    database_at(migrated, "head", [])
    with Store.open(db_url) as created:
        assert created.schema_version() == head_revision()
    assert _schema(db_url) == _schema(migrated)


def test_in_memory_sqlite_works_across_threads() -> None:
    with Store.open("sqlite://") as memory:
        run_id = _run(memory)
        seen: list[int] = []
        thread = threading.Thread(target=lambda: seen.append(len(memory.list_runs())))
        thread.start()
        thread.join()
        assert seen == [1]
        assert memory.get_run(run_id) is not None


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "postgresql"])
def test_an_unreachable_server_raises_store_error_without_the_password(scheme: str) -> None:
    with pytest.raises(StoreError) as caught:
        Store.open(f"{scheme}://u:secret@127.0.0.1:1/db")
    message = str(caught.value)
    assert "secret" not in message
    assert f"cannot open store at {scheme}://u:***@127.0.0.1:1/db: OperationalError:" in message
    assert "Connection refused" in message, "psycopg is the driver of a plain postgresql:// too"


def test_unwritable_sqlite_location_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(StoreError, match="not-a-dir"):
        Store.open(_url(blocker / "sub" / "guardian.db"))


def test_unparseable_url_is_masked_too() -> None:
    with pytest.raises(StoreError) as caught:
        Store.open("postgresql://u:secret@host:notaport/db")
    assert "secret" not in str(caught.value)
    assert mask_url("nonsense://u:secret@x") == "nonsense://u:***@x"


def test_invalid_values_are_refused(store: Store) -> None:
    run_id = _run(store)
    with pytest.raises(ValueError, match="mode"):
        store.ensure_run("other", name="n", metrics_path="m", rollouts_dir="r", checkpoints_dir=None, mode="x", now=T0)
    with pytest.raises(ValueError, match="verdict"):
        store.record_checkpoint(run_id, step=1, path="/c/1", verdict="great", now=T0)
    with pytest.raises(NotFoundError):
        store.start_attempt("no-such-run", metrics_path="m", now=T0)
    with pytest.raises(NotFoundError):
        store.close_incident(999, status="resolved", now=T0)


# ------------------------------------------------------------------------------ runs, attempts


def test_runs_and_attempts(store: Store) -> None:
    run_id = _run(store)
    again = store.ensure_run(
        run_id, name="renamed", metrics_path="x", rollouts_dir="y", checkpoints_dir=None, mode="enforce", now=T0
    )
    assert again.name == "gsm8k-grpo" and again.mode == "observe"
    assert again.created_at == datetime.fromtimestamp(T0, tz=UTC)
    assert store.latest_attempt(run_id) is None

    first = store.start_attempt(run_id, metrics_path="/a1/metrics.jsonl", now=T0, command=["python", "-m", "x"])
    store.end_attempt(first.id, exit_code=1, now=T0 + 60)
    second = store.start_attempt(run_id, metrics_path="/a2/metrics.jsonl", now=T0 + 70, pid=4242)
    assert (first.number, second.number) == (1, 2)
    latest = store.latest_attempt(run_id)
    assert latest is not None and latest.id == second.id and latest.pid == 4242
    assert store.end_attempt(first.id, exit_code=1, now=T0 + 60).ended_at == datetime.fromtimestamp(T0 + 60, tz=UTC)
    assert first.to_json()["command"] == ["python", "-m", "x"]
    assert store.set_run_status(run_id, RunStatus.GAVE_UP).status is RunStatus.GAVE_UP
    with pytest.raises(ValueError, match="status must be one of"):
        store.set_run_status(run_id, "stopped")  # type: ignore[arg-type]
    json.dumps([r.to_json() for r in store.list_runs()])


# --------------------------------------------------------------------------------------- steps

N_STEPS = 2_000
N_KEYS = 300
KEYS = [f"actor/metric_{i:03d}" for i in range(N_KEYS)]


def _value(step: int, k: int) -> float:
    if k == 7 and step % 100 == 0:
        return math.nan
    if k == 8 and step % 250 == 0:
        return math.inf
    return step + k / 1000.0


def test_bulk_write_of_2000_steps_by_300_keys_reads_back(store: Store) -> None:
    run_id = _run(store)
    attempt = store.start_attempt(run_id, metrics_path="m", now=T0)
    batch = 250
    for start in range(1, N_STEPS + 1, batch):
        records = [
            StepRecord(step, {key: _value(step, k) for k, key in enumerate(KEYS)})
            for step in range(start, min(start + batch, N_STEPS + 1))
        ]
        store.write_steps(run_id, attempt.id, 0, records, now=T0 + start)

    assert store.count_steps(run_id) == N_STEPS
    series = store.step_series(run_id, [KEYS[0], KEYS[7], KEYS[8], "absent/key"])
    assert series["absent/key"] == []
    assert series[KEYS[0]] == [(step, float(step)) for step in range(1, N_STEPS + 1)]
    nan_points = dict(series[KEYS[7]])
    assert nan_points[100] is None and nan_points[101] == pytest.approx(101.007)
    inf_points = dict(series[KEYS[8]])
    assert inf_points[250] is None and inf_points[251] == pytest.approx(251.008)
    latest = store.latest_step(run_id)
    assert latest is not None
    step, values = latest
    assert step == N_STEPS and len(values) == N_KEYS and values[KEYS[299]] == pytest.approx(N_STEPS + 0.299)


def test_lines_for_one_step_merge_later_values_winning(store: Store) -> None:
    run_id = _run(store)
    attempt = store.start_attempt(run_id, metrics_path="m", now=T0)
    store.write_steps(
        run_id,
        attempt.id,
        0,
        [StepRecord(5, {"val/score": 0.3, "a": 1.0}), StepRecord(5, {"a": 2.0, "b": 3.0})],
        now=T0,
    )
    store.write_steps(run_id, attempt.id, 0, [StepRecord(5, {"b": math.nan, "c": 4.0})], now=T0 + 1)
    store.merge_step_values(run_id, attempt.id, 0, 5, {"guardian/rollout/effective_group_ratio": 0.5}, T0 + 2)
    store.merge_step_values(run_id, attempt.id, 0, 6, {"guardian/rollout/effective_group_ratio": 0.4}, T0 + 3)

    assert store.count_steps(run_id) == 2
    series = store.step_series(run_id, ["val/score", "a", "b", "c", "guardian/rollout/effective_group_ratio"])
    assert series["val/score"] == [(5, 0.3)]
    assert series["a"] == [(5, 2.0)]
    assert series["b"] == [(5, None)]
    assert series["c"] == [(5, 4.0)]
    assert series["guardian/rollout/effective_group_ratio"] == [(5, 0.5), (6, 0.4)]


def test_branches_and_attempts_form_the_active_timeline(store: Store) -> None:
    run_id = _run(store)
    first = store.start_attempt(run_id, metrics_path="m1", now=T0)
    store.write_steps(run_id, first.id, 0, [StepRecord(s, {"x": float(s)}) for s in range(1, 11)], T0)
    # rollback inside the attempt: steps 6.. re-run on branch 1, abandoned at 8
    store.write_steps(run_id, first.id, 1, [StepRecord(s, {"x": 100.0 + s}) for s in range(6, 9)], T0)

    expected_x = [(s, float(s)) for s in range(1, 6)] + [(s, 100.0 + s) for s in range(6, 9)]
    assert store.step_series(run_id, ["x"])["x"] == expected_x
    assert store.count_steps(run_id) == 8
    assert store.latest_step(run_id) == (8, {"x": 108.0})

    # the same step on another branch does not merge into the old one
    store.merge_step_values(run_id, first.id, 0, 7, {"y": 1.0}, T0)
    assert store.step_series(run_id, ["y"])["y"] == []

    # a new attempt resumes from an older checkpoint
    second = store.start_attempt(run_id, metrics_path="m2", now=T0 + 100)
    store.write_steps(run_id, second.id, 0, [StepRecord(s, {"x": 200.0 + s}) for s in (4, 5)], T0 + 100)
    assert store.step_series(run_id, ["x"])["x"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 204.0), (5, 205.0)]
    assert store.latest_step(run_id) == (5, {"x": 205.0})

    # runs do not see each other's steps
    other = _run(store, "run-other")
    assert store.count_steps(other) == 0 and store.latest_step(other) is None


def test_step_lines_keep_every_branch_and_mark_what_a_newer_line_took_over(store: Store) -> None:
    """The abandoned steps are there too; each line's kept part is exactly its share of the active timeline."""
    run_id = _run(store)
    first = store.start_attempt(run_id, metrics_path="m1", now=T0)
    store.write_steps(run_id, first.id, 0, [StepRecord(s, {"x": float(s)}) for s in range(1, 11)], T0)
    store.write_steps(run_id, first.id, 1, [StepRecord(s, {"x": 100.0 + s}) for s in range(6, 9)], T0)
    second = store.start_attempt(run_id, metrics_path="m2", now=T0 + 100)
    values = {"y": math.inf, "val/a": 1.0, "other": 2.0}
    store.write_steps(run_id, second.id, 0, [StepRecord(s, {"x": 200.0 + s, **values}) for s in (4, 5)], T0)

    lines = store.step_lines(run_id, ["x", "y"], prefixes=["val/"])
    assert [(line.attempt_number, line.branch, line.cut_at) for line in lines] == [(1, 0, 4), (1, 1, 4), (2, 0, None)]
    assert [step for step, _ in lines[0].steps] == list(range(1, 11))  # abandoned steps 4-10 kept in the store
    assert lines[2].steps == ((4, {"x": 204.0, "y": None, "val/a": 1.0}), (5, {"x": 205.0, "y": None, "val/a": 1.0}))
    assert store.step_lines(run_id, [])[2].steps == ((4, {}), (5, {}))  # the steps without the values
    kept = sorted((step, values["x"]) for line in lines for step, values in line.steps if line.kept(step))
    assert kept == store.step_series(run_id, ["x"])["x"]
    assert store.step_lines("run-other", ["x"]) == []


# --------------------------------------------------------------------------------- checkpoints


def test_checkpoints_upsert_on_path(store: Store) -> None:
    run_id = _run(store)
    store.record_checkpoint(run_id, step=20, path="/ckpt/a/global_step_20", verdict="unknown", now=T0)
    store.record_checkpoint(run_id, step=10, path="/ckpt/a/global_step_10", verdict="healthy", now=T0)
    updated = store.record_checkpoint(
        run_id, step=20, path="/ckpt/a/global_step_20", verdict="unhealthy", now=T0 + 5, note="entropy"
    )
    assert updated.found_at == datetime.fromtimestamp(T0, tz=UTC)
    listed = store.checkpoints(run_id)
    assert [(c.step, c.verdict, c.note) for c in listed] == [(10, "healthy", None), (20, "unhealthy", "entropy")]
    json.dumps([c.to_json() for c in listed])


def test_pins_are_recorded_released_once_and_listed_live(store: Store) -> None:
    run_id = _run(store)
    big = 3 << 40  # a copied 3 TiB checkpoint: beyond 32-bit integers
    kept = store.record_pin(
        run_id,
        step=20,
        source_path="/c/global_step_20",
        pinned_path="/c/.guardian-pinned/global_step_20",
        mode=PinMode.COPY,
        bytes_added=big,
        now=T0,
    )
    gone = store.record_pin(
        run_id,
        step=10,
        source_path="/c/global_step_10",
        pinned_path="/c/.guardian-pinned/global_step_10",
        mode=PinMode.LINK,
        bytes_added=0,
        now=T0,
    )
    released = store.release_pin(gone.id, now=T0 + 9, note="3 newer healthy pins")
    again = store.release_pin(gone.id, now=T0 + 99, note="later")
    assert again.released_at == released.released_at == datetime.fromtimestamp(T0 + 9, tz=UTC)
    assert again.note == "3 newer healthy pins" and not again.live
    assert [p.step for p in store.pins(run_id)] == [10, 20]
    (live,) = store.pins(run_id, live=True)
    assert live == kept and live.mode is PinMode.COPY and live.bytes_added == big
    json.dumps([p.to_json() for p in store.pins(run_id)])
    with pytest.raises(NotFoundError):
        store.release_pin(999, now=T0, note="x")


# ---------------------------------------------------------------------------------- incidents


def test_incident_lifecycle_with_findings(store: Store) -> None:
    run_id = _run(store)
    attempt = store.start_attempt(run_id, metrics_path="m", now=T0)
    assert store.open_incident_for(run_id, "entropy") is None

    warn = _finding(Severity.WARN, step=10, onset=8)
    incident = store.open_incident(run_id, warn, now=T0 + 10)
    store.add_finding(run_id, attempt.id, warn, now=T0 + 10, incident_id=incident.id)
    assert incident.status == "open" and incident.is_open and incident.severity is Severity.WARN
    assert incident.evidence["ratio"] is None
    found = store.open_incident_for(run_id, "entropy")
    assert found is not None and found.id == incident.id

    critical = _finding(Severity.CRITICAL, step=12, onset=6)
    escalated = store.escalate_incident(incident.id, critical, now=T0 + 12)
    store.add_finding(run_id, attempt.id, critical, now=T0 + 12, incident_id=incident.id)
    assert escalated.severity is Severity.CRITICAL and escalated.onset_step == 6
    calmer = store.escalate_incident(incident.id, _finding(Severity.WARN, step=13, onset=9), now=T0 + 13)
    assert calmer.severity is Severity.CRITICAL and calmer.onset_step == 6 and calmer.opened_step == 10

    assert store.open_incident_for(run_id, "entropy") is not None
    closed = store.close_incident(incident.id, status="resolved", now=T0 + 50, step=40, note="probation passed")
    assert closed.closed_step == 40 and closed.closed_at == datetime.fromtimestamp(T0 + 50, tz=UTC)
    assert not closed.is_open and store.open_incident_for(run_id, "entropy") is None

    later = store.open_incident(run_id, _finding(check="kl", step=60), now=T0 + 60)
    other_run = _run(store, "run-other")
    store.open_incident(other_run, _finding(check="kl", step=1), now=T0 + 70)
    assert [i.id for i in store.list_incidents(run_id)] == [later.id, incident.id]
    assert len(store.list_incidents()) == 3 and len(store.list_incidents(limit=1)) == 1

    detail = store.get_incident(incident.id)
    assert detail is not None
    assert [f.severity for f in detail.findings] == [Severity.WARN, Severity.CRITICAL]
    assert detail.findings[0].evidence == {"entropy": 0.01, "baseline": 0.6, "ratio": None, "key": "actor/entropy"}
    as_json = detail.to_json()
    assert as_json["severity"] == "critical" and as_json["note"] == "probation passed"
    assert json.loads(json.dumps(as_json))["findings"][1]["step"] == 12
    assert store.get_incident(12345) is None
    with pytest.raises(ValueError, match="status"):
        store.close_incident(incident.id, status="open", now=T0)


def test_evaluations_keep_full_precision_in_order(store: Store) -> None:
    run_id = _run(store)
    store.record_evaluations(run_id, {"gsm8k/acc": 0.1234567890123456, "math/acc": 1e-300}, step=40, now=T0)
    store.record_evaluations(run_id, {"gsm8k/acc": 0.7}, step=None, now=T0 + 1)
    stored = [(e.name, e.value, e.step, e.recorded_at) for e in store.evaluations(run_id)]
    assert stored == [
        ("gsm8k/acc", 0.1234567890123456, 40, datetime.fromtimestamp(T0, tz=UTC)),
        ("math/acc", 1e-300, 40, datetime.fromtimestamp(T0, tz=UTC)),
        ("gsm8k/acc", 0.7, None, datetime.fromtimestamp(T0 + 1, tz=UTC)),
    ], "a double on both backends"
    with pytest.raises(NotFoundError):
        store.record_evaluations("no-such-run", {"x": 1.0}, step=None, now=T0)


def test_a_nul_in_free_text_is_stored_as_a_replacement_character(store: Store) -> None:
    """A crashed trainer's last line may hold NUL, which PostgreSQL's text refuses: both backends keep U+FFFD."""
    run_id = _run(store)
    crash = Finding("crash", Severity.CRITICAL, 3, "trainer ended: exit 1: \x00\x00garbage", 3, {"output": "a\x00b"})
    incident = store.open_incident(run_id, crash, now=T0)
    store.add_finding(run_id, None, crash, now=T0, incident_id=incident.id)
    store.close_incident(incident.id, status="resolved", now=T0, note="\x00")
    detail = store.get_incident(incident.id)
    assert detail is not None
    assert detail.incident.message == detail.findings[0].message == "trainer ended: exit 1: \ufffd\ufffdgarbage"
    assert detail.incident.evidence == {"output": "a\x00b"}, "JSON escapes it: kept as it was"
    assert detail.incident.note == "\ufffd"


# -------------------------------------------------------------------------------- concurrency


def test_reader_sees_commits_while_writers_write(db_url: str) -> None:
    """A reader never waits for the writers and sees every committed batch (SQLite: WAL); two writers never fail
    (SQLite: they queue on BEGIN IMMEDIATE instead of failing with 'database is locked'; PostgreSQL: they write
    different runs' rows at once)."""
    batches, per_batch = 30, 40
    with Store.open(db_url) as setup:
        runs = [_run(setup, "run-a"), _run(setup, "run-b")]
        attempts = [setup.start_attempt(r, metrics_path="m", now=T0).id for r in runs]
    committed = [0, 0]
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            with Store.open(db_url) as writer:
                for b in range(batches):
                    records = [
                        StepRecord(b * per_batch + i, {key: 1.0 for key in KEYS}) for i in range(1, per_batch + 1)
                    ]
                    writer.write_steps(runs[index], attempts[index], 0, records, now=T0)
                    committed[index] = (b + 1) * per_batch
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    seen: list[int] = []
    with Store.open(db_url) as reader:
        for thread in writers:
            thread.start()
        while any(thread.is_alive() for thread in writers):
            floor = committed[0]
            count = reader.count_steps(runs[0])
            assert count >= floor
            assert not seen or count >= seen[-1]
            seen.append(count)
            reader.step_series(runs[1], [KEYS[0]])
        for thread in writers:
            thread.join()
        assert errors == []
        assert [reader.count_steps(r) for r in runs] == [batches * per_batch] * 2
    assert len(seen) > 1


def test_history_written_by_the_first_schema_survives_the_upgrade(db_url: str) -> None:
    """A database created by the first release (revision 0001) keeps its incidents when a newer
    guardian opens it and migrates it to head."""
    database_at(
        db_url,
        "0001",
        (
            "INSERT INTO runs (id, name, created_at, metrics_path, rollouts_dir, mode, status) "
            "VALUES ('old', 'old', '2026-11-01 00:00:00', 'm.jsonl', '', 'observe', 'active')",
            'INSERT INTO incidents (run_id, "check", severity, status, opened_at, opened_step, updated_at, '
            "message, evidence_json) VALUES ('old', 'kl_drift', 'critical', 'open', '2026-11-01 00:00:00', 7, "
            "'2026-11-01 00:00:00', 'KL 5x', '{}')",
        ),
    )
    with Store.open(db_url) as store:
        assert store.schema_version() == head_revision() != "0001"
        (incident,) = store.list_incidents("old")
        assert incident.check == "kl_drift" and incident.opened_step == 7


def test_intervention_states_and_timeline_are_committed(store: Store) -> None:
    run_id = _run(store)
    incident = store.open_incident(run_id, _finding(), now=T0)
    first = store.create_intervention(run_id, incident.id, kind="remediate", rung=0, from_attempt_id=None, now=T0)
    assert first.number == 1 and first.state == "DETECTED" and not first.finished
    assert store.active_intervention(run_id) == first
    store.advance(first.id, "STOPPING", now=T0 + 1)
    rolled = store.advance(
        first.id, "ROLLED_BACK", now=T0 + 2, target_step=40, target_path="/c/global_step_40", detail={"moved": [50]}
    )
    assert rolled.target_step == 40
    patched = store.advance(first.id, State.PATCHED, now=T0 + 3, plan=StoredPlan(argv=("python", "x=1")))
    assert patched.plan == StoredPlan(argv=("python", "x=1")) and patched.target_step == 40
    done = store.advance(first.id, "RESOLVED", now=T0 + 4)
    assert done.finished and store.active_intervention(run_id) is None
    events = store.intervention_events(first.id)
    assert [e.state for e in events] == ["DETECTED", "STOPPING", "ROLLED_BACK", "PATCHED", "RESOLVED"]
    assert events[2].detail == {"moved": [50]}
    second = store.create_intervention(run_id, incident.id, kind="remediate", rung=1, from_attempt_id=None, now=T0)
    assert second.number == 2
    assert [i.id for i in store.interventions(incident_id=incident.id)] == [first.id, second.id]
    # the whole run's timelines in one query: the same views, by intervention
    assert store.run_timelines(run_id) == {first.id: events, second.id: store.intervention_events(second.id)}
    assert store.run_timelines("no-such-run") == {}


def test_a_write_waits_the_busy_timeout_for_a_held_lock_then_fails(db_url: str) -> None:
    """A second session's write lock (SQLite: ``BEGIN EXCLUSIVE``; PostgreSQL: the tables locked ``IN EXCLUSIVE
    MODE``) refuses the store's writes after ``busy_timeout_s`` (PostgreSQL: its ``lock_timeout``); reads go on, and
    ``probe_write`` reports the refusal the same way until the lock is gone."""
    with Store.open(db_url, busy_timeout_s=0.2) as store:
        run_id = _run(store)
        holder = HeldLock(db_url)
        holder.take()
        started = time.monotonic()
        with pytest.raises(OperationalError, match=holder.refusal):
            store.set_run_status(run_id, RunStatus.FINISHED)
        assert 0.15 < time.monotonic() - started < 3
        with pytest.raises(OperationalError, match=holder.refusal):
            store.probe_write()
        assert store.get_run(run_id) is not None
        holder.release()
        store.probe_write()
        assert store.set_run_status(run_id, RunStatus.FINISHED).status == "finished"
