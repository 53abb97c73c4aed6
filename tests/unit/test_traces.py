"""Replay every real trace in tests/fixtures/traces with the expected verdict (labels.json).

Calibration contract: no critical finding on any healthy trace; every long unhealthy trace (>= 20
records; the 4-6 record ones are spot checks too sparse for windowed checks) caught.

The 41 traces added for issue 23 (other codebases, never looked at when the rules were written) are held to
the same contract. Those the current rules do not meet it on are strict xfails (``NOT_MET_YET``): each flips
to a failure the moment the judgment is fixed for it, so the mark must then be removed.
"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, fixture_path

from guardian.config import ChecksConfig
from guardian.incidents.replay import replay_file
from guardian.keys import Signal

LONG = 20


# New traces (issue 23) whose verdict the current rules get wrong, and how (replayed with the default rules).
NOT_MET_YET: dict[str, str] = {
    "trl-rhogrpo-rho0.10-s43.jsonl": "unhealthy (truncation death, onset 50): first critical reward_collapse@115, "
    "65 steps late",
    "trl-rhogrpo-rho1.50-s42.jsonl": "borderline (author: 0% failure, eval 0.71) gets truncation@180 (every answer "
    "at the cap)",
    "trl-rhogrpo-rho1.50-s43.jsonl": "borderline (author: 0% failure, eval 0.64) gets reward_collapse@110",
}


def labels() -> list[dict[str, object]]:
    path = FIXTURES / "traces" / "labels.json"
    return json.loads(path.read_text())


def verdict_cases() -> list[object]:
    return [
        pytest.param(
            lab,
            id=str(lab["file"]),
            marks=[pytest.mark.xfail(strict=True, reason=f"issue 23: {NOT_MET_YET[str(lab['file'])]}")]
            if str(lab["file"]) in NOT_MET_YET
            else [],
        )
        for lab in labels()
    ]


def test_not_met_yet_names_labelled_traces() -> None:
    files = {str(lab["file"]) for lab in labels()}
    assert set(NOT_MET_YET) <= files


@pytest.mark.parametrize("label", verdict_cases())
def test_trace_verdict(label: dict[str, object]) -> None:
    path = fixture_path("traces", str(label["file"]))
    result = replay_file(path, ChecksConfig())
    assert result.steps == label["records"] or result.steps >= 1
    assert not result.bad_lines
    if label["label"] in ("healthy", "borderline"):
        assert result.first_critical is None, f"false critical: {result.first_critical}"
    elif label["label"] == "unhealthy" and int(str(label["records"])) >= LONG:
        first = result.first_critical
        assert first is not None, "long unhealthy trace not caught"
        onset = label["onset_step"]
        assert first.step is not None and isinstance(onset, int)
        assert 0 <= first.step - onset <= 25  # p95 target of the design (anchors §4.3)


def test_nan_trace_is_caught_within_one_step() -> None:
    result = replay_file(fixture_path("traces", "tinyzero-exp-nan-1.jsonl"), ChecksConfig())
    first = result.first_critical
    assert first is not None and first.check == "non_finite"
    assert first.step is not None and first.step - 90 <= 1
    assert first.onset_step == 90


def test_fixture_traces_exist() -> None:
    assert labels(), "labels.json missing or empty"
    for lab in labels():
        fixture_path("traces", str(lab["file"]))


def test_real_verl_091_run_with_rollouts_reports_egr() -> None:
    run = fixture_path("verl-0.9.1-run")
    result = replay_file(run / "metrics-10-steps.jsonl", ChecksConfig(), rollouts=run / "rollouts")
    assert result.signals["egr"] == "guardian/rollout/effective_group_ratio"
    assert result.signals["entropy"] == "actor/entropy"
    assert result.signals["log_ppl"] == "rollout_corr/training_log_ppl"
    assert result.steps == 10


def test_resume_trace_is_a_new_branch_not_an_error() -> None:
    run = fixture_path("verl-0.9.1-run")
    from guardian.history.timeline import RunHistory

    history = RunHistory()
    replay_file(run / "metrics-30-steps.jsonl", ChecksConfig(), history=history)
    result = replay_file(run / "metrics-resume-step20-lr-patched.jsonl", ChecksConfig(), history=history)
    assert result.rewinds == 1
    assert history.branch == 1
    # the resumed run logged steps 20 (validation) .. 25: the abandoned 26..30 leave the timeline
    assert history.steps == list(range(0, 26))
    lr = history.signal(Signal.LR)
    assert lr.steps[-1] == 25 and lr.values[-1] == pytest.approx(1e-3)  # the LR trap: patched 1e-5 ignored
