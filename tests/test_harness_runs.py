"""Replays of the real verl 0.9.1 runs the GPU harness guarded (tests/fixtures/verl-0.9.1-run/harness, gpu/README.md).

Each scenario ran under ``guardian run`` in enforce mode on one H200: ``collapse`` (a wrong-signed entropy bonus),
``collapse-kill`` (the same, with the guardian SIGKILLed after it relaunched the patched trainer and re-attached),
``healthy`` (a sound config) and ``unguarded`` (the same config without the guardian). The live decisions are in
each run's guardian.log and store.json; here the guardian replays the files those runs wrote and must reach them
again, and the harness's own verdict on the recorded evidence must pass.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_path

from gpu import verdict
from gpu.scenarios import scenarios
from guardian.actions.checkpoints import choose_rollback_target
from guardian.checks.findings import Severity
from guardian.config import ChecksConfig, RemediationConfig
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import ReplayResult, replay_file
from guardian.rescue.outcome import measure_outcome
from guardian.sources.jsonl import read_all

HARNESS = fixture_path("verl-0.9.1-run", "harness")
GUARDED = ["collapse", "collapse-kill", "healthy"]


def run_dir(name: str) -> Path:
    return HARNESS / name / "runs" / f"gpu-{name}"


def live_findings_of_attempt_1(name: str) -> list[tuple[str, str, str, int]]:
    """(check, change, severity, step) of every finding the live guardian logged before attempt 2 started."""
    found = []
    for e in verdict.parse_log((run_dir(name) / "guardian.log").read_text()):
        if e.name == "attempt_launched" and e.fields.get("attempt") == "2":
            break
        if e.name == "finding":
            found.append((e.fields["check"], e.fields["change"], e.fields["severity"], int(e.fields["step"])))
    return found


def replay_attempt(name: str, attempt: int) -> ReplayResult:
    folder = run_dir(name) / f"attempt-{attempt}"
    return replay_file(folder / "metrics.jsonl", ChecksConfig(), rollouts=folder / "rollouts")


def store(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HARNESS / name / "store.json").read_text())
    return loaded


@pytest.mark.parametrize("name", GUARDED)
def test_a_replay_of_attempt_1_reaches_every_live_decision(name: str) -> None:
    result = replay_attempt(name, 1)
    replayed = [
        (t.finding.check, t.change.value, t.finding.severity.label, t.finding.step)
        for t in result.transitions
        if t.finding.check != "stall"
    ]
    assert replayed == live_findings_of_attempt_1(name)


@pytest.mark.parametrize("name", ["collapse", "collapse-kill"])
def test_the_collapse_is_called_within_six_steps_and_the_rollback_keeps_the_progress(name: str) -> None:
    result = replay_attempt(name, 1)
    first = result.first_critical
    assert first is not None and first.check == "entropy_collapse" and first.severity is Severity.CRITICAL
    collapse = verdict.collapse_step(verdict.read_metrics(run_dir(name) / "attempt-1" / "metrics.jsonl"))
    assert collapse is not None and first.step is not None and first.step - collapse <= 6
    (incident,) = store(name)["shown"]
    assert (incident["opened_step"], incident["onset_step"]) == (first.step, first.onset_step)

    @dataclass(frozen=True)
    class Seen:
        step: int
        verdict: str

    # the verdicts as they stood at the decision: a checkpoint at or after an open incident's onset is unhealthy
    # (daemon.py); the store's final list holds attempt 2's re-saves of the same steps, healthy again
    assert first.onset_step is not None
    saved = {c["step"] for c in store(name)["checkpoints"]["checkpoints"] if c["step"] <= first.step}
    seen = [Seen(step, "unhealthy" if step >= first.onset_step else "healthy") for step in sorted(saved)]
    target = choose_rollback_target(
        seen,
        onset_step=first.onset_step,
        detected_step=first.step,
        margin_steps=RemediationConfig().margin_steps,
        exclude_steps=(),
        available=saved,
    )
    (intervention,) = incident["interventions"]
    assert target is not None and target.step == intervention["target_step"]


@pytest.mark.parametrize("name", ["collapse", "collapse-kill"])
def test_the_resumed_branch_is_resolved_by_its_outcome_as_it_was_live(name: str) -> None:
    history = RunHistory()
    for attempt in (1, 2):
        for record in read_all(run_dir(name) / f"attempt-{attempt}" / "metrics.jsonl")[0]:
            history.add(record)
    (incident,) = store(name)["shown"]
    (intervention,) = incident["interventions"]
    target = intervention["target_step"]
    outcome = measure_outcome(history, target_step=target, own=None, own_check=None, checks=ChecksConfig())
    assert outcome.reward is not None and outcome.reward.recovered, outcome.describe()
    assert intervention["state"] == "RESOLVED" and incident["status"] == "resolved"


def test_the_healthy_control_got_no_intervention_and_replays_without_a_critical() -> None:
    assert store("healthy")["incidents"] == []
    assert replay_attempt("healthy", 1).first_critical is None


@pytest.mark.parametrize(
    ("call", "names"), [("collapse", ["collapse", "collapse-kill"]), ("healthy", ["healthy", "unguarded"])]
)
def test_the_harness_verdict_on_the_recorded_evidence_passes(call: str, names: list[str]) -> None:
    known = scenarios("verl", collapse_steps=28, healthy_steps=20)
    codes = {"collapse": [0], "collapse-kill": [-9, 0], "healthy": [0], "unguarded": [0]}
    judged = verdict.judge(
        HARNESS,
        {n: known[n] for n in names},
        {n: {"returncodes": codes[n]} for n in names},
        timed_out=False,
        samples_path=HARNESS / f"{call}-call.samples.jsonl",
    )
    failed = [(n, c) for n, v in judged["scenarios"].items() for c in v["checks"] if not c["passed"]]
    assert judged["passed"], failed


def _judge_collapse(root: Path, samples: Path) -> dict[str, Any]:
    known = scenarios("verl", collapse_steps=28, healthy_steps=20)
    judged = verdict.judge(
        root, {"collapse": known["collapse"]}, {"collapse": {"returncodes": [0]}}, timed_out=False, samples_path=samples
    )
    return {c["name"]: c["passed"] for c in judged["scenarios"]["collapse"]["checks"]}


def test_the_verdict_fails_a_quarantine_that_lost_a_file_and_gpu_memory_held_after_the_relaunch(
    tmp_path: Path,
) -> None:
    shutil.copytree(HARNESS / "collapse", tmp_path / "collapse")
    samples = tmp_path / "samples.jsonl"
    shutil.copy(HARNESS / "collapse-call.samples.jsonl", samples)
    assert all(_judge_collapse(tmp_path, samples).values())

    quarantine = tmp_path / "collapse" / "quarantine.json"
    manifests = json.loads(quarantine.read_text())
    folder = next(iter(manifests))
    manifests[folder].pop(next(iter(manifests[folder])))
    quarantine.write_text(json.dumps(manifests))
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    attempt_1_pid = next(
        pid
        for r in rows
        if r["kind"] == "procs"
        for path, procs in r["attempts"].items()
        if "gpu-collapse/attempt-1/" in path
        for pid in procs["pids"]
        if any(a["pid"] == pid for g in rows if g["kind"] == "gpu" for a in g["apps"])
    )
    held = {"pid": attempt_1_pid, "mib": 1416.0}  # an attempt-1 process still on the GPU at the end
    rows.append({"t": rows[-1]["t"] + 1, "kind": "gpu", "used_mib": [1416.0], "apps": [held]})
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    failed = {name for name, ok in _judge_collapse(tmp_path, samples).items() if not ok}
    assert failed == {"quarantined_checkpoints_intact", "gpu_memory_released"}
