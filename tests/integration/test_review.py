"""guardian.review over a real store rebuilt from a real guarded verl 0.9.1 run (tests/fixtures/verl-0.9.1-run/
guarded/run-a: an entropy collapse stopped at step 25, rolled back to global_step_12, patched and resumed): the
attempts lineage, the steps each rollback threw away and what they cost, and the incident list's rows."""

from __future__ import annotations

import json
import statistics
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.config import CostConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.review.cost import run_cost
from guardian.review.incidents import incident_rows
from guardian.review.lineage import lineage
from guardian.sources.jsonl import read_all
from guardian.states import Kind, State
from guardian.store import RunView, Store, StoredPlan

RUN_A = fixture_path("verl-0.9.1-run", "guarded", "run-a")
TIMING = "timing_s/step"


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _argv(n: int) -> list[str]:
    argv: list[str] = json.loads((RUN_A / f"attempt-{n}.command.json").read_text())["argv"]
    return argv


def _records(n: int, *, drop: frozenset[str] = frozenset()) -> list[StepRecord]:
    records, bad = read_all(RUN_A / f"attempt-{n}.metrics.jsonl")
    assert not bad
    return [StepRecord(r.step, {k: v for k, v in r.data.items() if k not in drop}) for r in records]


def rebuilt_store(tmp_path: Path, *, drop: frozenset[str] = frozenset()) -> tuple[Store, dict[str, object]]:
    """run-a's store as the guardian wrote it: the run and its command, both attempts with their steps, the incident,
    and the intervention with every state and detail it committed (``incidents show 1 --json``), at their times."""
    shown = json.loads((RUN_A / "incident-1.json").read_text())
    stored = shown["interventions"][0]
    run_id, t0 = shown["run_id"], _at(shown["opened_at"])
    store = Store.open(f"sqlite:///{tmp_path / 'guardian.db'}")
    store.ensure_run(
        run_id,
        name=run_id,
        metrics_path=str(RUN_A / "attempt-1.metrics.jsonl"),
        rollouts_dir=str(RUN_A / "rollouts"),
        checkpoints_dir=None,
        mode="enforce",
        now=t0,
        config_json=json.dumps({"command": _argv(1)}),
    )
    first = store.start_attempt(run_id, metrics_path="attempt-1/metrics.jsonl", now=t0 - 300, command=_argv(1))
    store.write_steps(run_id, first.id, 0, _records(1, drop=drop), t0)
    finding = Finding(
        shown["check"],
        Severity.CRITICAL,
        shown["opened_step"],
        shown["message"],
        shown["onset_step"],
        shown["evidence"],
    )
    incident = store.open_incident(run_id, finding, t0)
    iv = store.create_intervention(
        run_id, incident.id, kind=Kind(stored["kind"]), rung=0, from_attempt_id=first.id, now=t0
    )
    for e in stored["events"][1:]:  # DETECTED came with the intervention
        at, fields = _at(e["at"]), {}
        if e["state"] == State.STOPPED and e["detail"].get("target"):
            fields = {"target_step": stored["target_step"], "target_path": stored["target_path"]}
        elif e["state"] == State.PATCHED:
            fields = {"plan": StoredPlan.from_json(stored["plan"])}
        elif e["state"] == State.RESUMING:
            store.end_attempt(first.id, exit_code=None, now=at)
            second = store.start_attempt(run_id, metrics_path="attempt-2/metrics.jsonl", now=at, command=_argv(2))
            fields = {"to_attempt_id": second.id}
        elif e["state"] == State.PROBATION:
            store.write_steps(run_id, second.id, 0, _records(2, drop=drop), at)
        store.advance(iv.id, State(e["state"]), now=at, detail=e["detail"], **fields)
    store.close_incident(incident.id, status="resolved", now=_at(stored["updated_at"]), step=shown["closed_step"])
    return store, shown


def _run(store: Store, shown: dict[str, object]) -> RunView:
    run = store.get_run(str(shown["run_id"]))
    assert run is not None
    return run


def _median_step_time() -> float:
    """The run's timeline from the files: attempt 2 whole, attempt 1 before attempt 2's first step."""
    second = _records(2)
    start = min(r.step for r in second)
    timeline = [r for r in _records(1) if r.step < start] + second
    return statistics.median(r.data[TIMING] for r in timeline if TIMING in r.data)


def test_lineage_says_which_attempt_resumed_from_where_with_what_patch(tmp_path: Path) -> None:
    store, shown = rebuilt_store(tmp_path)
    with store:
        first, second = lineage(store, str(shown["run_id"]))
    one, two = _records(1), _records(2)
    assert (first.number, first.launched_by, first.resumed_from_step, first.patch) == (1, None, None, ())
    assert first.summary == f"python3 -m verl.trainer.main_ppo + {len(_argv(1)) - 3} override(s)"
    assert (first.first_step, first.last_step) == (one[0].step, one[-1].step) == (1, 25)
    assert first.ended_at is not None

    assert second.launched_by is not None and second.launched_by.name == "intervention 1 of incident #1"
    assert (second.launched_by.rung_name, second.launched_by.from_attempt) == ("entropy-1", 1)
    assert (second.resumed_from_step, second.resumed_from_path) == (12, "<run-a>/ckpt/global_step_12")
    assert (second.first_step, second.last_step) == (two[0].step, two[-1].step) == (13, 40)
    assert second.summary.startswith(
        "resumed from step 12, patch actor_rollout_ref.actor.optim.lr: 0.001 -> 0.0001; "
        "actor_rollout_ref.actor.entropy_coeff: -0.1 -> 0.003"
    )
    assert "resume_from_path" not in second.summary  # the resume point is said first, not repeated as a setting
    assert second.to_json()["command"] == _argv(2)


def test_the_rollback_threw_away_the_steps_after_its_target_priced_at_the_runs_rate(tmp_path: Path) -> None:
    store, shown = rebuilt_store(tmp_path)
    with store:
        cost = run_cost(store, _run(store, shown), CostConfig())
    step_s = _median_step_time()
    (incident,) = cost.incidents
    assert incident.steps_lost == 13  # the fixture's README: detected at 25, resumed from 12
    assert [(d.target_step, d.first_step, d.last_step) for d in incident.discards] == [(12, 13, 25)]
    assert (cost.rate.gpus, cost.rate.gpus_source) == (1, "command")  # trainer.n_gpus_per_node=1 trainer.nnodes=1
    assert cost.rate.step_seconds == pytest.approx(step_s)
    assert incident.gpu_hours == pytest.approx(13 * step_s / 3600)
    assert incident.usd == pytest.approx(13 * step_s / 3600 * 12.25)
    assert (cost.manual_steps, cost.manual_gpu_hours) == (700, pytest.approx(700 * step_s / 3600))
    document = cost.to_json()
    assert document["manual"] == {
        "lag_steps": 700,
        "incidents": 1,
        "steps": 700,
        "gpu_hours": round(700 * step_s / 3600, 3),
        "usd": round(700 * step_s / 3600 * 12.25, 2),
    }


def test_a_relapse_and_a_restart_from_scratch_count_each_step_once(tmp_path: Path) -> None:
    """After run-a's rescue: a relapse rolls back further (to step 9, from attempt 2) and its relaunch dies before
    logging a step; then a restart from scratch. Each step lost is counted by the rollback that threw it away."""
    store, shown = rebuilt_store(tmp_path)
    run_id, now = str(shown["run_id"]), _at(str(shown["updated_at"])) + 600
    with store:
        second = store.latest_attempt(run_id)
        assert second is not None
        incident = store.open_incident(run_id, Finding("entropy_collapse", Severity.CRITICAL, 40, "again", 30), now)
        relapse = store.create_intervention(
            run_id, incident.id, kind=Kind.REMEDIATE, rung=1, from_attempt_id=second.id, now=now
        )
        store.advance(relapse.id, State.STOPPED, now=now, target_step=9, target_path="<run-a>/ckpt/global_step_9")
        store.advance(relapse.id, State.ROLLED_BACK, now=now, detail={"moved": [12, 15, 18]})
        third = store.start_attempt(run_id, metrics_path="attempt-3/metrics.jsonl", now=now, command=_argv(2))
        store.advance(relapse.id, State.RESUMING, now=now, to_attempt_id=third.id)
        store.end_attempt(third.id, exit_code=1, now=now + 5)  # crashed at once: no step
        restart = store.create_intervention(
            run_id, incident.id, kind=Kind.RESTART, rung=0, from_attempt_id=third.id, now=now + 9
        )
        store.advance(restart.id, State.ROLLED_BACK, now=now + 9, target_step=None, detail={"target": None})
        stopped_early = store.create_intervention(
            run_id, incident.id, kind=Kind.RESTART, rung=0, from_attempt_id=third.id, now=now + 9
        )
        store.advance(stopped_early.id, State.STOPPING, now=now + 9)  # never rolled back: threw nothing away
        cost = run_cost(store, _run(store, shown), CostConfig())
        links = lineage(store, run_id)
    first_incident, second_incident = cost.incidents
    assert first_incident.steps_lost == 13
    assert [
        (d.intervention_number, d.target_step, d.steps, d.first_step, d.last_step) for d in second_incident.discards
    ] == [
        (2, 9, 28 + 3, 10, 40),  # attempt 2's 13-40 and attempt 1's 10-12, still on the timeline until then
        (3, None, 9, 1, 9),  # from scratch: attempt 3 began after step 9 without logging; attempt 1's 1-9 were left
    ]
    assert cost.steps_lost == 13 + 31 + 9 and cost.rolled_back_incidents == 2 and cost.manual_steps == 1400
    assert links[2].first_step is None and links[2].exit_code == 1 and links[2].resumed_from_step == 9


def test_unknown_step_time_gives_no_figures_and_says_why(tmp_path: Path) -> None:
    store, shown = rebuilt_store(tmp_path, drop=frozenset({TIMING, "perf/time_per_step"}))
    with store:
        cost = run_cost(store, _run(store, shown), CostConfig())
        (row,) = incident_rows(store, None, None, CostConfig())
    assert cost.incidents[0].steps_lost == 13 and cost.incidents[0].gpu_hours is None and cost.gpu_hours_lost is None
    assert cost.rate.unknown == "the run logged no step time (timing_s/step)"
    assert cost.to_json()["usd_lost"] is None and cost.to_json()["manual"]["gpu_hours"] is None
    assert (row.steps_lost, row.gpu_hours_lost, row.gpu_hours_unknown) == (13, None, cost.rate.unknown)


@pytest.mark.parametrize(
    ("overrides", "gpus", "source", "unknown"),
    [
        ((), 8, "verl defaults", None),
        (("trainer.n_gpus_per_node=4", "trainer.nnodes=2"), 8, "command", None),
        (("+trainer.nnodes=3",), 24, "command", None),
        (("trainer.n_gpus_per_node=auto",), None, "command", "the command's trainer.n_gpus_per_node=auto is not"),
        (("trainer.nnodes=0",), None, "command", "the command names 0 GPUs"),
    ],
)
def test_gpus_come_from_the_stored_command(
    tmp_path: Path, overrides: tuple[str, ...], gpus: int | None, source: str, unknown: str | None
) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        command = [*_argv(1)[:3], *overrides]
        store.ensure_run(
            "r", name="r", metrics_path="m", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=0.0,
            config_json=json.dumps({"command": command}),
        )  # fmt: skip
        rate = run_cost(store, _run(store, {"run_id": "r"}), CostConfig()).rate
    assert (rate.gpus, rate.gpus_source) == (gpus, source)
    no_time = "the run logged no step time (timing_s/step)"  # no step stored: the step time is missing too
    assert rate.unknown is not None and rate.unknown.startswith(no_time)
    assert unknown is None or unknown in rate.unknown


def test_incident_rows_filter_by_run_and_since(tmp_path: Path) -> None:
    store, shown = rebuilt_store(tmp_path)
    opened = datetime.fromisoformat(str(shown["opened_at"]))
    with store:
        (row,) = incident_rows(store, str(shown["run_id"]), opened, CostConfig())
        assert incident_rows(store, "another-run", None, CostConfig()) == ()
        assert incident_rows(store, None, opened + timedelta(seconds=1), CostConfig()) == ()
        elsewhere = opened.astimezone(timezone(timedelta(hours=-5)))  # the same instant in another zone
        assert len(incident_rows(store, None, elsewhere, CostConfig())) == 1
    assert row.final_state == State.RESOLVED and row.action is not None and row.action.plan is not None
    assert row.to_json()["action"] == {
        "kind": "remediate",
        "rung": 0,
        "rung_name": "entropy-1",
        "intervention_number": 1,
        "state": "RESOLVED",
    }
    assert row.outcome is None  # this guardian (0edf527) recorded no figures yet; the demo's rows have them
    assert row.to_json()["id"] == 1 and row.to_json()["steps_lost"] == 13
