"""Replays of the real verl 0.9.1 runs the GPU harness guarded (gpu/README.md).

``tests/fixtures/verl-0.9.1-run/twins-guarded``: twins of five settings, each run under ``guardian run`` in enforce mode
beside an unguarded twin on one H200 - two wrong-signed entropy bonuses (rescued), the sane control, a high LR and a
high temperature (no intervention). The live decisions are in each run's guardian.log and store.json; here the
guardian replays the files those runs wrote and must reach them again.

``tests/fixtures/verl-0.9.1-run/harness``: the earlier call (``collapse``, ``collapse-kill`` with the guardian
SIGKILLed and re-attached, ``healthy``, ``unguarded``), recorded under the judgment before the decision policy; its
stop, quarantine, GPU-release and re-attach evidence is judged by the harness's own verdict.
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
from guardian.checkpoints.target import choose_rollback_target
from guardian.config import ChecksConfig, RemediationConfig
from guardian.core import Severity
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import ReplayResult, replay_file
from guardian.rescue.outcome import measure_outcome
from guardian.sources.jsonl import read_all

HARNESS = fixture_path("verl-0.9.1-run", "harness")
TWINS = fixture_path("verl-0.9.1-run", "twins-guarded")
TWIN_LABELS = fixture_path("verl-twins", "labels.json")
GUARDED = [f"{s}.guarded" for s in ("entropy-neg-mild", "entropy-neg-strong", "sane", "lr-high", "temp-high")]
RESCUED = GUARDED[:2]


def run_dir(name: str) -> Path:
    return TWINS / name / "runs" / f"gpu-{name}"


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
    rollouts = folder / "rollouts"
    return replay_file(folder / "metrics.jsonl", ChecksConfig(), rollouts=rollouts if rollouts.is_dir() else None)


def store(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((TWINS / name / "store.json").read_text())
    return loaded


def labelled_onset(name: str) -> int:
    """The onset the unguarded twin of the same setting shows (tests/fixtures/verl-twins/labels.json)."""
    labels = json.loads(TWIN_LABELS.read_text())
    (entry,) = [e for e in labels if e["file"] == name.replace(".guarded", ".jsonl")]
    return int(entry["onset_step"])


@pytest.mark.parametrize("name", GUARDED)
def test_a_replay_of_attempt_1_reaches_every_live_decision(name: str) -> None:
    result = replay_attempt(name, 1)
    replayed = [
        (t.finding.check, t.change.value, t.finding.severity.label, t.finding.step)
        for t in result.transitions
        if t.finding.check != "stall"
    ]
    assert replayed == live_findings_of_attempt_1(name)


@pytest.mark.parametrize("name", RESCUED)
def test_the_collapse_is_called_within_ten_steps_and_the_rollback_keeps_the_progress(name: str) -> None:
    result = replay_attempt(name, 1)
    first = result.first_critical
    assert first is not None and first.check == "entropy_collapse" and first.severity is Severity.CRITICAL
    assert first.step is not None and 0 <= first.step - labelled_onset(name) <= 10
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


@pytest.mark.parametrize("name", RESCUED)
def test_the_resumed_branch_is_judged_against_the_abandoned_one_as_it_was_live(name: str) -> None:
    (incident,) = store(name)["shown"]
    (intervention,) = incident["interventions"]
    (resolved,) = [e["detail"]["outcome"] for e in intervention["events"] if e["state"] == "RESOLVED"]
    history = RunHistory()
    for attempt in (1, 2):
        for record in read_all(run_dir(name) / f"attempt-{attempt}" / "metrics.jsonl")[0]:
            if attempt == 1 or record.step <= resolved["newest_step"]:
                history.add(record)
    outcome = measure_outcome(
        history, target_step=intervention["target_step"], own=None, own_check="entropy_collapse", checks=ChecksConfig()
    )
    assert outcome.proven and outcome.reward_vs_abandoned is not None, outcome.describe()
    for comparison in ("reward_vs_abandoned", "signal_vs_abandoned"):
        assert outcome.to_json()[comparison] == resolved[comparison]
    assert intervention["state"] == "RESOLVED" and incident["status"] == "resolved"


@pytest.mark.parametrize("name", GUARDED[2:])
def test_the_settings_that_did_not_collapse_got_no_intervention_and_replay_without_a_critical(name: str) -> None:
    assert store(name)["incidents"] == []
    assert replay_attempt(name, 1).first_critical is None


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


def test_a_step_quarantined_twice_is_checked_against_each_save_of_it(tmp_path: Path) -> None:
    """A second intervention that rolls back past a step saved again after the first lays that folder beside the first
    as global_step_N.dup1 (a real verl call of 2026-12-02 did): it is the trainer's second save of global_step_N."""
    shutil.copytree(HARNESS / "collapse", tmp_path / "collapse")
    samples = tmp_path / "samples.jsonl"
    shutil.copy(HARNESS / "collapse-call.samples.jsonl", samples)
    quarantine = tmp_path / "collapse" / "quarantine.json"
    manifests = json.loads(quarantine.read_text())
    folder, files = next(iter(manifests.items()))
    manifests[f"{folder}.dup1"] = files
    quarantine.write_text(json.dumps(manifests))
    assert _judge_collapse(tmp_path, samples)["quarantined_checkpoints_intact"]

    manifests[f"{folder}.dup1"] = {**files, "data.pt": 1}  # not a save the trainer made
    quarantine.write_text(json.dumps(manifests))
    assert not _judge_collapse(tmp_path, samples)["quarantined_checkpoints_intact"]
