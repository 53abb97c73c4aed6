"""Values PostgreSQL would refuse where SQLite takes them (revision 0006), on both backends (``db_url``): free text and
paths of any length, step numbers past 2**31, checkpoints keyed by the digest of a path of 5000 characters; run ids
bounded at the store's door; and a database of revision 0005 with history in it upgraded without losing a row."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from postgres_server import database_at, rows

from guardian.checkpoints.scan import read_tracker, scan_checkpoints
from guardian.core import MAX_STEP, Finding, Severity, StepRecord
from guardian.ids import MAX_RUN_ID
from guardian.sources.console import ConsoleFile
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store, head_revision
from guardian.store.models import path_key

T0 = 1_795_000_000.0
BIG_STEP = 3_000_000_000  # past 2**31 - 1, PostgreSQL's integer


def long_text(chars: int, seed: int) -> str:
    """``chars`` characters that do not compress (PostgreSQL compresses a long index entry before it refuses it)."""
    pick = random.Random(seed)
    return "".join(pick.choice(string.ascii_letters + string.digits + "é/") for _ in range(chars))


def _run(store: Store, run_id: str = "r", name: str = "run") -> str:
    store.ensure_run(
        run_id, name=name, metrics_path="m.jsonl", rollouts_dir="", checkpoints_dir=None, mode="observe", now=T0
    )
    return run_id


def test_free_text_and_paths_of_5000_characters_round_trip(db_url: str) -> None:
    name, path, message, external = (long_text(5000, seed) for seed in range(4))
    path = "/ckpt/" + path + "/global_step_10"
    with Store.open(db_url) as store:
        run_id = _run(store, name=name)
        store.record_checkpoint(run_id, step=10, path=path, verdict="unknown", now=T0)
        store.record_checkpoint(run_id, step=10, path=path, verdict="healthy", now=T0 + 1, note=message)  # the same row
        store.record_checkpoint(run_id, step=10, path=path[:-1] + "1", verdict="unknown", now=T0)  # another one
        finding = Finding("entropy", Severity.CRITICAL, 10, message, evidence={"why": message})
        incident = store.open_incident(run_id, finding, now=T0)
        store.record_delivery(
            run_id,
            "webhook",
            f"incident:{incident.id}:opened",
            check="entropy",
            level=2,
            status="sent",
            now=T0,
            external_id=external,
        )
        run = store.get_run(run_id)
        assert run is not None and run.name == name
        listed = store.checkpoints(run_id)
        assert [(c.path, c.verdict, c.note) for c in listed] == [
            (path, "healthy", message),
            (path[:-1] + "1", "unknown", None),
        ]
        (stored,) = store.list_incidents(run_id)
        assert stored.message == message
        assert store.deliveries(run_id)[f"webhook/incident:{incident.id}:opened"].external_id == external
    assert rows(db_url, "SELECT path_key FROM checkpoints ORDER BY id")[0] == (path_key(path),)


def test_a_run_id_longer_than_the_column_is_refused_at_the_door(db_url: str) -> None:
    with Store.open(db_url) as store:
        _run(store, "r" * MAX_RUN_ID)
        with pytest.raises(ValueError, match=rf"run id of {MAX_RUN_ID + 1} characters: the store keeps ids of 1-128"):
            _run(store, "r" * (MAX_RUN_ID + 1))
        assert [r.id for r in store.list_runs()] == ["r" * MAX_RUN_ID]


def test_steps_past_two_to_the_31_are_kept_everywhere_a_step_is(db_url: str) -> None:
    with Store.open(db_url) as store:
        run_id = _run(store)
        attempt = store.start_attempt(run_id, metrics_path="m.jsonl", now=T0)
        store.write_steps(
            run_id, attempt.id, 0, [StepRecord(BIG_STEP, {"x": 1.0}), StepRecord(MAX_STEP, {"x": 2.0})], T0
        )
        store.record_checkpoint(run_id, step=BIG_STEP, path=f"/c/global_step_{BIG_STEP}", verdict="healthy", now=T0)
        finding = Finding("entropy", Severity.CRITICAL, BIG_STEP, "collapsed", onset_step=BIG_STEP - 1)
        store.add_finding(run_id, attempt.id, finding, now=T0)
        incident = store.open_incident(run_id, finding, now=T0)
        store.close_incident(incident.id, status="resolved", now=T0 + 1, step=MAX_STEP)
        intervention = store.create_intervention(
            run_id, incident.id, kind="remediate", rung=0, from_attempt_id=None, now=T0
        )
        store.advance(intervention.id, "ROLLED_BACK", now=T0 + 1, target_step=BIG_STEP, target_path="/c")
        store.record_evaluations(run_id, {"gsm8k": 0.5}, step=BIG_STEP, now=T0)
        assert store.latest_step(run_id) == (MAX_STEP, {"x": 2.0})
        assert [r.step for r in store.active_records(run_id)] == [BIG_STEP, MAX_STEP]
        assert [c.step for c in store.checkpoints(run_id)] == [BIG_STEP]
        (closed,) = store.list_incidents(run_id)
        assert (closed.opened_step, closed.onset_step, closed.closed_step) == (BIG_STEP, BIG_STEP - 1, MAX_STEP)
        active = store.active_intervention(run_id)
        assert active is not None and active.target_step == BIG_STEP
        assert [e.step for e in store.evaluations(run_id)] == [BIG_STEP]
    assert rows(db_url, "SELECT step, onset_step FROM findings") == [(BIG_STEP, BIG_STEP - 1)]
    assert rows(db_url, "SELECT target_step FROM interventions") == [(BIG_STEP,)]


# history of every kind, as revision 0005 wrote it
HISTORY_AT_0005 = (
    "INSERT INTO runs (id, name, created_at, metrics_path, rollouts_dir, mode, status) "
    "VALUES ('old', 'old run', '2026-11-01 00:00:00', 'm.jsonl', '', 'observe', 'active')",
    "INSERT INTO attempts (id, run_id, number, started_at, metrics_path) "
    "VALUES (1, 'old', 1, '2026-11-01 00:00:00', 'm.jsonl')",
    "INSERT INTO steps (run_id, attempt_id, branch, step, recorded_at, metrics) "
    "VALUES ('old', 1, 0, 7, '2026-11-01 00:00:00', '{\"x\":1.5}')",
    "INSERT INTO checkpoints (run_id, step, path, found_at, verdict) "
    "VALUES ('old', 5, '/ckpt/global_step_5', '2026-11-01 00:00:00', 'healthy')",
    'INSERT INTO incidents (id, run_id, "check", severity, status, opened_at, opened_step, updated_at, '
    "message, evidence_json) VALUES (1, 'old', 'kl_drift', 'critical', 'open', '2026-11-01 00:00:00', 7, "
    "'2026-11-01 00:00:00', 'KL 5x', '{}')",
    'INSERT INTO findings (run_id, attempt_id, "check", severity, step, message, evidence_json, '
    "created_at, incident_id) VALUES ('old', 1, 'kl_drift', 'critical', 7, 'KL 5x', '{}', "
    "'2026-11-01 00:00:00', 1)",
    "INSERT INTO interventions (id, run_id, incident_id, number, kind, rung, state, target_step, "
    "created_at, updated_at) VALUES (1, 'old', 1, 1, 'remediate', 0, 'ROLLED_BACK', 5, "
    "'2026-11-01 00:00:00', '2026-11-01 00:00:00')",
    "INSERT INTO intervention_events (intervention_id, state, at, detail_json) "
    "VALUES (1, 'ROLLED_BACK', '2026-11-01 00:00:00', '{}')",
    'INSERT INTO deliveries (run_id, sink, event_key, "check", level, status, attempts, updated_at, '
    "external_id) VALUES ('old', 'webhook', 'incident:1:opened', 'kl_drift', 2, 'sent', 1, "
    "'2026-11-01 00:00:00', 'ext-1')",
    "INSERT INTO evaluations (run_id, name, value, step, recorded_at) "
    "VALUES ('old', 'gsm8k', 0.25, 7, '2026-11-01 00:00:00')",
    "INSERT INTO pins (run_id, step, source_path, pinned_path, mode, bytes_added, pinned_at) "
    "VALUES ('old', 5, '/ckpt/global_step_5', '/ckpt/.guardian-pinned/global_step_5', 'hardlink', 0, "
    "'2026-11-01 00:00:00')",
)


TABLES = (
    "runs", "attempts", "steps", "checkpoints", "incidents", "findings", "interventions", "intervention_events",
    "deliveries", "evaluations", "pins",
)  # fmt: skip


def test_a_0005_database_with_history_upgrades_without_losing_a_row(db_url: str) -> None:
    database_at(db_url, "0005", HISTORY_AT_0005)
    before = {table: rows(db_url, f"SELECT * FROM {table} ORDER BY id") for table in TABLES}
    with Store.open(db_url) as store:
        assert store.schema_version() == head_revision() == "0006"
        (incident,) = store.list_incidents("old")
        assert incident.check == "kl_drift" and incident.opened_step == 7
        assert store.active_records("old") == [StepRecord(7, {"x": 1.5})]
        (checkpoint,) = store.checkpoints("old")
        assert (checkpoint.step, checkpoint.verdict) == (5, "healthy")
        # the old row is found by the digest the migration filled in: updated, not doubled
        store.record_checkpoint("old", step=5, path="/ckpt/global_step_5", verdict="unhealthy", now=T0)
        assert [(c.id, c.verdict) for c in store.checkpoints("old")] == [(checkpoint.id, "unhealthy")]
        attempt = store.latest_attempt("old")
        assert attempt is not None
        store.write_steps("old", attempt.id, 0, [StepRecord(BIG_STEP, {"x": 2.0})], T0)  # the widened column
    after = {table: rows(db_url, f"SELECT * FROM {table} ORDER BY id") for table in TABLES}
    assert len(after["steps"]) == 2 and after["steps"][0] == before["steps"][0]
    assert after["checkpoints"][0][:3] == before["checkpoints"][0][:3]
    for table in set(TABLES) - {"steps", "checkpoints"}:
        assert after[table] == before[table], table
    assert rows(db_url, "SELECT path_key FROM checkpoints") == [(path_key("/ckpt/global_step_5"),)]


@pytest.mark.parametrize("kind", ["jsonl", "console"])
def test_a_step_out_of_range_is_a_bad_line_of_its_file_and_3e9_reaches_the_store(
    kind: str, db_url: str, tmp_path: Path
) -> None:
    """Past 2**63 - 1 a step would overflow the store's 64-bit column (both backends): the source reports the line
    with its file and number and reads on; a step of 3,000,000,000 is kept."""
    lines = {
        "jsonl": [
            '{"step":3000000000,"data":{"x":1.0}}',
            '{"step":9223372036854775808,"data":{"x":2.0}}',
            '{"step":-5,"data":{"x":3.0}}',
            '{"step":3000000001,"data":{"x":4.0}}',
        ],
        "console": ["step:3000000000 - x:1.0", "step:9223372036854775808 - x:2.0", "noise", "step:3000000001 - x:4.0"],
    }[kind]
    path = tmp_path / f"metrics.{kind}"
    path.write_text("\n".join(lines) + "\n")
    source = ConsoleFile(path) if kind == "console" else MetricsFile(path)
    batch = source.poll(final=True)
    records = [item for item in batch.items if isinstance(item, StepRecord)]
    assert [r.step for r in records] == [BIG_STEP, BIG_STEP + 1]
    expected = {
        "jsonl": [
            f"{path}:2 (segment 0): 'step' must be between 0 and {MAX_STEP}, got 9223372036854775808",
            f"{path}:3 (segment 0): 'step' must be between 0 and {MAX_STEP}, got -5",
        ],
        "console": [f"{path}:2 (segment 0): step 9223372036854775808 is past {MAX_STEP}, the largest step kept"],
    }[kind]
    assert [str(report) for report in batch.bad_lines] == expected
    with Store.open(db_url) as store:
        run_id = _run(store)
        attempt = store.start_attempt(run_id, metrics_path=str(path), now=T0)
        store.write_steps(run_id, attempt.id, 0, records, T0)
        assert store.active_records(run_id) == records


def test_a_checkpoint_folder_or_tracker_past_the_largest_step_is_not_a_checkpoint(tmp_path: Path) -> None:
    for step in (BIG_STEP, MAX_STEP + 1):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(MAX_STEP + 1))
    assert [c.step for c in scan_checkpoints(tmp_path)] == [BIG_STEP]
    assert read_tracker(tmp_path) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("²")  # str.isdigit() says yes, int() says no
    assert read_tracker(tmp_path) is None
