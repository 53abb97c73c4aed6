"""bench/detection.py's scoring: the catch window around the onset, per-group and held-out figures, several
trace folders, the tuning set every rule must declare, and rldoctor's prefix-by-prefix replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FIXTURES

from bench import detection as d
from guardian.checks import build_checks
from guardian.config import ChecksConfig
from guardian.core import Finding, Severity
from guardian.incidents.replay import ReplayResult
from guardian.incidents.tracker import Change, Transition


def replayed(name: str, critical_at: int | None, steps: int = 40) -> ReplayResult:
    result = ReplayResult(run=name, steps=steps)
    if critical_at is not None:
        finding = Finding("some_check", Severity.CRITICAL, critical_at, "bad")
        result.transitions.append(Transition(Change.RAISED, finding, Severity.OK))
    return result


def critical(step: int) -> Finding:
    return Finding("some_check", Severity.CRITICAL, step, "bad")


@pytest.mark.parametrize(
    ("first_step", "expected"),
    [(40, d.CAUGHT), (39, d.EARLY_ALARM), (50, d.CAUGHT), (60, d.CAUGHT), (61, d.LATE), (None, d.MISSED)],
)
def test_the_catch_window_is_ten_steps_either_side_of_the_onset(first_step: int | None, expected: str) -> None:
    first = critical(first_step) if first_step is not None else None
    assert d.verdict(d.UNHEALTHY, 50, first) == expected


def test_without_an_onset_any_critical_catches_and_healthy_runs_are_false_or_quiet() -> None:
    assert d.verdict(d.UNHEALTHY, None, critical(3)) == d.CAUGHT
    assert d.verdict(d.HEALTHY, None, critical(3)) == d.FALSE_CRITICAL
    assert d.verdict(d.HEALTHY, None, None) == d.QUIET
    assert d.verdict("borderline", 10, critical(3)) == d.UNSCORED


def test_score_takes_plain_tuples_and_counts_each_outcome_once() -> None:
    rows = [
        ("caught", d.UNHEALTHY, 50, replayed("caught", 55)),
        ("early", d.UNHEALTHY, 50, replayed("early", 20)),
        ("late", d.UNHEALTHY, 50, replayed("late", 75)),
        ("missed", d.UNHEALTHY, 50, replayed("missed", None)),
        ("short", d.UNHEALTHY, 5, replayed("short", 6, steps=4)),
        ("fine", d.HEALTHY, None, replayed("fine", None)),
        ("false", d.HEALTHY, None, replayed("false", 30)),
        ("edge", "borderline", None, replayed("edge", 12)),
    ]
    s = d.score(rows)
    assert (s.unhealthy, s.healthy) == (5, 2)
    assert s.caught == ["caught", "short"] and s.long_caught == ["caught"]
    assert s.early_alarm == ["early"] and s.late == ["late"] and s.missed == ["missed"]
    assert s.any_critical == ["caught", "early", "late", "short"]
    assert s.false_critical == ["false"]
    assert s.not_caught == 3 and s.false_alarms == 2
    assert s.first["early"] == "some_check@20" and s.unscored == {"edge": "some_check@12"}
    assert s.delays == {"caught": 5, "early": -30, "late": 25, "short": 1}
    assert json.dumps(s.to_json())


def test_per_group_figures_the_worst_group_and_held_out_against_in_sample() -> None:
    rows = [
        d.Row("a1", d.HEALTHY, None, replayed("a1", None), "A"),
        d.Row("a2", d.UNHEALTHY, 10, replayed("a2", 12), "A"),
        d.Row("b1", d.HEALTHY, None, replayed("b1", 40), "B"),
        d.Row("b2", d.HEALTHY, None, replayed("b2", None), "B"),
        d.Row("b3", d.UNHEALTHY, 10, replayed("b3", None), "B"),
        d.Row("c1", d.HEALTHY, None, replayed("c1", 7), "C"),
        d.Row("c2", d.HEALTHY, None, replayed("c2", 9), "C"),
        d.Row("c3", d.UNHEALTHY, 10, replayed("c3", 15), "C"),
    ]
    groups = d.score_groups(rows)
    assert list(groups) == ["A", "B", "C"]
    assert d.worst_group(groups) == "C"
    held = d.held_out_figures(rows, tuned={"A"})
    assert held.in_sample == ["A"] and held.held_out == ["B", "C"]
    assert held.in_sample_false_per_group == 0 and held.in_sample_not_caught_per_group == 0
    # B: one false critical and one miss, each within one run of A's 0; C: two false criticals
    assert held.within_one_run == {"B": True, "C": False}
    assert len(held.held_out_summary.false_critical) == 3


def write_folder(folder: Path, entries: list[dict[str, object]]) -> Path:
    folder.mkdir()
    for entry in entries:
        shutil.copy(FIXTURES / "traces" / "aopd-9.jsonl", folder / str(entry["file"]))
    (folder / "labels.json").write_text(json.dumps(entries))
    return folder


def test_several_folders_load_in_order_with_their_groups(tmp_path: Path) -> None:
    first = write_folder(
        tmp_path / "one",
        [
            {"file": "aopd-9.jsonl", "label": "healthy"},
            {"file": "run.jsonl", "label": "unhealthy", "onset_step": 5, "group": "verl-twins (ours)"},
        ],
    )
    second = write_folder(tmp_path / "two", [{"file": "run.jsonl", "label": "healthy"}])
    cases = d.load_folders([first, second])
    assert [c.name for c in cases] == ["aopd-9", "run", "two:run"]
    assert [c.group for c in cases] == [d.AOPD, "verl-twins (ours)", "two"]
    assert cases[1].onset == 5 and cases[2].path == second / "run.jsonl"


def test_the_default_folders_are_those_that_exist() -> None:
    folders = d.default_trace_dirs()
    assert folders[0] == d.DEFAULT_TRACES
    assert (d.VERL_TWINS in folders) == (d.VERL_TWINS / "labels.json").is_file()


def test_every_rule_declares_what_it_was_tuned_on() -> None:
    checks = ChecksConfig()
    for rules in d.RULE_SETS:
        for check in build_checks(checks, rules):
            assert check.name in d.TUNED_ON, f"{check.name}: say in TUNED_ON which groups it was written against"
    assert set(d.CALIBRATION_GROUPS) <= d.tuning_set("default")
    assert d.tuning_set("seed") == set()
    assert d.tuning_set(d.RLDOCTOR) == set()


def test_every_fixture_trace_has_a_group_and_the_calibration_groups_are_the_first_sixteen() -> None:
    entries = json.loads((FIXTURES / "traces" / "labels.json").read_text())
    assert all(isinstance(e.get("group"), str) and e["group"] for e in entries)
    assert {e["group"] for e in entries[:16]} == set(d.CALIBRATION_GROUPS)
    assert not {e["group"] for e in entries[16:]} & set(d.CALIBRATION_GROUPS)
    assert d.TRL_SWEEP_GROUP in {e["group"] for e in entries[16:]}


def test_rldoctor_is_replayed_prefix_by_prefix_until_its_first_critical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rl_doctor = pytest.importorskip("rl_doctor")
    from rl_doctor.detectors.base import Severity as DoctorSeverity

    path = tmp_path / "run.jsonl"
    lines = [{"step": s, "data": {"actor/entropy": 1.0 / s}} for s in (1, 2, 2, 3, 4, 5)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    seen: list[int] = []

    def fake_run_from_records(records: list[dict[str, object]], **_: object) -> list[dict[str, object]]:
        return records

    def fake_diagnose(records: list[dict[str, object]]) -> SimpleNamespace:
        seen.append(len(records))
        level = DoctorSeverity.CRITICAL if records[-1]["step"] == 4 else DoctorSeverity.WARNING
        return SimpleNamespace(findings=[SimpleNamespace(detector="entropy_collapse", severity=level, summary="s")])

    monkeypatch.setattr(rl_doctor, "run_from_records", fake_run_from_records)
    monkeypatch.setattr(rl_doctor, "diagnose", fake_diagnose)
    case = d.TraceCase("run", path, d.UNHEALTHY, None, 4, None)
    result = d.rldoctor_replay(case)
    assert seen == [1, 3, 4, 5]  # step 2's two lines are one prefix; nothing after the first critical
    first = result.first_critical
    assert first is not None and (first.check, first.step) == ("rldoctor:entropy_collapse", 4)
    assert result.steps == 5


def test_json_output_has_the_group_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_folder(
        tmp_path / "traces",
        [
            {"file": "aopd-9.jsonl", "label": "healthy", "group": "G"},
            {"file": "other.jsonl", "label": "unhealthy", "onset_step": 3, "group": "H"},
        ],
    )
    assert d.main(["--traces", str(folder), "--no-scenarios", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["traces_dirs"] == [str(folder)]
    assert out["early_tolerance_steps"] == 10 and out["late_tolerance_steps"] == 10
    assert {"G", "H", d.GUARDED_GROUP} <= set(out["groups"]["default"])
    assert out["leave_one_group_out"]["default"][d.GUARDED_GROUP]["tuned_on"] is True
    assert out["leave_one_group_out"]["default"]["G"]["tuned_on"] is False
    assert out["worst_group"]["default"] in out["groups"]["default"]
    assert "held_out_vs_in_sample" in out and out["tuned_on"] == d.TUNED_ON
    assert out["traces"][0]["group"] == "G" and "verdict" in out["traces"][0]["rules"]["default"]
