"""``guardian report``: the data read from a real SQLite store and real dump folders built by hand (a collapse
rolled back from step 20 to 10, its abandoned dumps quarantined), the pure plots and page, and the command's
bad input. The browser check on a real guarded run is tests/e2e/test_report_browser.py."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import orjson
import pytest

from guardian.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from guardian.config import GuardianConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.keys import Signal
from guardian.report import page, story
from guardian.report.assemble import incident_report, run_report
from guardian.report.model import Report
from guardian.report.series import Marker, MarkerKind, Plot, Trace
from guardian.report.svg import nice_ticks, plot_svg
from guardian.report.trajectories import DumpFolder, highest_reward
from guardian.states import Kind, State
from guardian.store import ConfigChange, Store, StoredPlan

NOW = 1_800_000_000.0
RUN = "run-collapse"
ENTROPY, REWARD, VAL = "actor/entropy", "critic/score/mean", "val-core/gsm8k/acc/mean@1"
HACK = "<script>alert('pwned')</script> & the answer is 42"
LONG = "so " * 400 + "the answer"


def _values(step: int, attempt: int) -> dict[str, float]:
    """Attempt 1's entropy falls fast (a NaN at step 17), attempt 2's slowly; validation every 10 steps."""
    entropy = math.nan if (attempt, step) == (1, 17) else 2.0 - step * (0.09 if attempt == 1 else 0.01)
    values = {ENTROPY: entropy, REWARD: 0.01 * step + (0.2 if attempt == 2 else 0.0)}
    if step % 10 == 0:
        values[VAL] = 0.1 * attempt
    return values


def _dump(folder: Path, step: int, rows: list[dict[str, object]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


@pytest.fixture
def world(tmp_path: Path) -> tuple[GuardianConfig, int]:
    """Attempt 1 logs steps 1-25 and collapses (onset 15, detected 20); intervention 1 rolls back to step 10,
    patches the entropy coefficient and attempt 2 resumes at 11 and runs to 40. The run's own dump folder holds
    the kept dumps, its quarantine the abandoned branch's (steps 11-25)."""
    home, dumps = tmp_path / "home", tmp_path / "dumps"
    config = GuardianConfig.model_validate({"home": str(home), "report": {"trajectories": 5, "context_steps": 5}})
    with Store.open(config.database_url()) as store:
        store.ensure_run(
            RUN,
            name=RUN,
            metrics_path="m.jsonl",
            rollouts_dir=str(dumps),
            checkpoints_dir=str(tmp_path / "ckpt"),
            mode="enforce",
            now=NOW,
            config_json=orjson.dumps({"command": ["python", "-m", "verl", "trainer.n_gpus_per_node=4"]}).decode(),
        )
        first = store.start_attempt(RUN, metrics_path=str(tmp_path / "a1.jsonl"), now=NOW)
        store.write_steps(RUN, first.id, 0, [StepRecord(s, _values(s, 1)) for s in range(1, 26)], NOW)
        finding = Finding("entropy_collapse", Severity.CRITICAL, 20, "entropy collapsed", onset_step=15)
        incident = store.open_incident(RUN, finding, NOW + 1)
        store.add_finding(RUN, first.id, finding, NOW + 1, incident_id=incident.id)
        iv = store.create_intervention(
            RUN, incident.id, kind=Kind.REMEDIATE, rung=0, from_attempt_id=first.id, now=NOW + 2
        )
        store.advance(iv.id, State.STOPPING, now=NOW + 3, detail={"plan": "rung 1 of 3"})
        store.advance(iv.id, State.STOPPED, now=NOW + 4, detail={"target": "/ckpt/global_step_10", "why": "healthy"})
        store.advance(iv.id, State.ROLLED_BACK, now=NOW + 5, target_step=10, detail={"moved": [15, 20], "tracker": 10})
        diff = (ConfigChange("actor_rollout_ref.actor.entropy_coeff", -0.3, 0.003),)
        plan = StoredPlan(argv=("python",), diff=diff, notes=("kept the optimizer",), rung="entropy-1")
        store.advance(iv.id, State.PATCHED, now=NOW + 6, plan=plan, detail={"diff": [c.to_json() for c in diff]})
        second = store.start_attempt(RUN, metrics_path=str(tmp_path / "a2.jsonl"), now=NOW + 7)
        store.advance(iv.id, State.RESUMING, now=NOW + 7, to_attempt_id=second.id)
        store.write_steps(RUN, second.id, 0, [StepRecord(s, _values(s, 2)) for s in range(10, 41)], NOW + 8)
        store.advance(iv.id, State.PROBATION, now=NOW + 8, detail={"first_step": 11})
        store.advance(
            iv.id,
            State.RESOLVED,
            now=NOW + 9,
            detail={"why": "21 steps after the rollback: reward 0.5 vs 0.3 at the rollback point (higher)"},
        )
        store.close_incident(incident.id, status="resolved", now=NOW + 10, step=32, note="fixed")
    for step in range(1, 41):
        _dump(dumps, step, [{"input": f"q{step}", "output": "ok", "gts": "ok", "score": 0.1, "step": step}])
    quarantine = dumps / ".guardian-quarantine" / "incident-1"
    for step in range(11, 26):
        _dump(quarantine, step, [{"input": "q", "output": HACK, "gts": "42", "score": 0.5 + step / 100, "step": step}])
    _dump(quarantine, 24, [{"input": "long", "output": LONG, "gts": "x", "score": 9.0, "format": 1.0}])
    (dumps / "33.jsonl").write_bytes(b'{"input": "nan", "output": "x", "score": NaN}\nnot json\n')
    return config, incident.id


def _incident(config: GuardianConfig, incident_id: int) -> Report:
    with Store.open(config.database_url()) as store:
        report = incident_report(store, incident_id, config, NOW + 60)
    assert report is not None
    return report


# ------------------------------------------------------------------------------------------------ the data


def test_an_incident_report_spans_its_marked_steps_and_draws_both_branches(world: tuple[GuardianConfig, int]) -> None:
    report = _incident(*world)
    assert [(m.kind, m.step, m.label) for m in report.markers] == [
        (MarkerKind.ONSET, 15, "onset"),
        (MarkerKind.DETECTION, 20, "detected"),
        (MarkerKind.ROLLBACK, 10, "rollback"),
        (MarkerKind.RESUME, 11, "resume"),
    ]
    assert report.steps == (5, 37)  # rollback 10 - 5 .. closed 32 + 5
    entropy, _, kl, log_ppl, reward, val, length = report.plots
    assert (entropy.key, kl.key, log_ppl.key, length.key) == (ENTROPY, None, None, None)
    kept, abandoned = entropy.traces
    assert not kept.abandoned and [s for s, _ in kept.points] == list(range(5, 38))
    assert kept.points[10 - 5] == (10, 2.0 - 10 * 0.01)  # from step 10 on the kept line is attempt 2's
    # the abandoned branch leaves the kept timeline at its last kept step (9) and runs to 25, its NaN a gap
    assert abandoned.name == "attempt 1 (abandoned)" and abandoned.abandoned
    assert [s for s, _ in abandoned.points] == list(range(9, 26))
    assert dict(abandoned.points)[17] is None
    assert reward.key == REWARD and len(reward.traces) == 2
    assert val.key == "val-core/*/mean@*" and val.traces[0].points == ((10, 0.2), (20, 0.2), (30, 0.2))
    assert val.traces[1].points == ((10, 0.1), (20, 0.1))  # attempt 2 logged step 10 again: attempt 1's is abandoned


def test_timeline_patch_lineage_and_cost(world: tuple[GuardianConfig, int]) -> None:
    report = _incident(*world)
    what = [r.what for r in report.timeline]
    assert what[0] == "incident #1 opened" and what[-1] == "incident #1 resolved"
    assert "intervention 1 of incident #1: PROBATION" in what
    details = " | ".join(r.detail for r in report.timeline)
    assert "rollback target /ckpt/global_step_10 - healthy" in details
    assert "quarantined checkpoints: 15, 20 - tracker rewritten to step 10" in details
    assert "resumed at step 11" in details
    (patch,) = report.patches
    assert (patch.name, patch.rung, patch.notes) == (
        "intervention 1 of incident #1",
        "entropy-1",
        ("kept the optimizer",),
    )
    assert patch.changes[0].after == 0.003
    assert [(a.number, a.launched_by is not None) for a in report.lineage] == [(1, False), (2, True)]
    own = report.cost.incident(1)
    assert own is not None and own.steps_lost == 15  # steps 11-25 thrown away


def test_a_run_report_spans_every_step_and_names_each_of_its_incidents(world: tuple[GuardianConfig, int]) -> None:
    config, _ = world
    with Store.open(config.database_url()) as store:
        later = Finding("kl_drift", Severity.WARN, 36, "KL rising", onset_step=33)
        store.add_finding(RUN, None, later, NOW + 20, incident_id=store.open_incident(RUN, later, NOW + 20).id)
        report = run_report(store, RUN, config, NOW + 60)
        assert run_report(store, "run-unknown", config, NOW) is None
        assert incident_report(store, 99, config, NOW) is None
    assert report is not None and report.incident is None
    assert report.steps == (1, 40) and report.title == f"Run {RUN}"
    labels = [m.label for m in report.markers]
    assert labels == ["onset #1", "detected #1", "onset #2", "detected #2", "rollback", "resume"]
    assert [r.what for r in report.timeline][-1] == "incident #2 opened"


def test_the_highest_reward_trajectories_come_from_both_branches(world: tuple[GuardianConfig, int]) -> None:
    report = _incident(*world)
    sample = report.trajectories
    assert sample is not None
    # the abandoned branch dumped one hack at steps 11-25: shown once, at its best score; then the kept branch's
    assert [(t.step, t.score) for t in sample.shown] == [(24, 9.0), (25, 0.75), (37, 0.1), (36, 0.1), (35, 0.1)]
    assert all(t.abandoned and t.source == "quarantined by incident-1" for t in sample.shown[:2])
    assert not any(t.abandoned for t in sample.shown[2:]) and sample.shown[2].source == "run dump folder"
    assert sample.shown[0].extras == (("format", 1.0),) and sample.shown[1].response == HACK
    # the dumps of steps 5-37 in both folders, one row each; the NaN score and the broken line of step 33 not scored
    assert (sample.dumps, sample.scored_rows) == (33 + 15, 32 + 15)
    assert len(sample.problems) == 1 and "33.jsonl:2: not JSON" in sample.problems[0]


def test_an_attempts_own_dump_folder_is_abandoned_where_the_kept_timeline_is_another_attempts(tmp_path: Path) -> None:
    _dump(tmp_path / "a1", 5, [{"input": "p", "output": "r5", "score": 1.0}])
    _dump(tmp_path / "a1", 15, [{"input": "p", "output": "r15", "score": 1.0}])
    sample = highest_reward([DumpFolder(tmp_path / "a1", 1)], None, {5: 1, 15: 2}, 10)
    assert [(t.step, t.abandoned, t.source) for t in sample.shown] == [(15, True, "attempt 1"), (5, False, "attempt 1")]
    assert highest_reward([DumpFolder(tmp_path / "a1", 1)], None, {}, 0).shown == ()


# ------------------------------------------------------------------------------------------------ rendering


def test_nice_ticks_are_round_and_span_the_range() -> None:
    assert nice_ticks(0, 70) == [0, 20, 40, 60]
    assert nice_ticks(0.03, 0.61, count=4) == pytest.approx([0.2, 0.4, 0.6])
    assert nice_ticks(3, 3) == [3]


def test_a_plot_says_not_logged_or_non_finite_and_marks_the_steps() -> None:
    markers = [Marker(15, MarkerKind.ONSET, "onset"), Marker(99, MarkerKind.RESUME, "resume <late>")]
    missing = plot_svg(Plot(Signal.KL, "KL <to> ref", None, ()), markers, (0, 40))
    assert 'data-state="not-logged"' in missing and ">not logged</text>" in missing
    assert 'aria-label="KL &lt;to&gt; ref"' in missing
    assert 'class="marker onset"' in missing and "resume" not in missing  # a marker outside the steps is left out
    only_nan = plot_svg(Plot(Signal.ENTROPY, "e", ENTROPY, (Trace("kept", False, ((1, None),)),)), [], (0, 4))
    assert 'data-state="non-finite"' in only_nan and "NaN/inf only" in only_nan
    drawn = plot_svg(
        Plot(Signal.ENTROPY, "e", ENTROPY, (Trace("kept", False, ((1, 1.0), (2, None), (3, 2.0), (4, 3.0))),)),
        [],
        (1, 4),
    )
    assert drawn.count("<polyline") == 1 and drawn.count('class="nonfinite"') == 1  # the NaN splits the line
    assert drawn.count("<circle") == 4 - 1  # a short trace shows each value


def test_the_page_escapes_folds_and_loads_nothing(world: tuple[GuardianConfig, int]) -> None:
    html = page.render(_incident(*world))
    assert "<script" not in html and "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt; &amp;" in html
    assert re.search(r"<details><summary>(so ){50}", html) and f"({len(LONG)} characters)" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html) and "url(" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert html.count('<svg class="plot"') == 7 and html.count('data-state="not-logged"') == 4
    for section in ("signals", "timeline", "config", "lineage", "cost", "trajectories"):
        assert f'<section id="{section}">' in html
    assert "actor_rollout_ref.actor.entropy_coeff" in html and "-0.3" in html and "0.003" in html
    said = "The 5 highest-reward distinct samples of 47 scored in 48 rollout dump(s) of the steps shown (both branches)"
    assert said in html and "A prompt and response dumped more than once is shown once, at its best score." in html


def test_an_event_says_a_long_list_of_steps_as_its_count_and_span() -> None:
    said = story.event_summary({"dumps_quarantined": list(range(21, 53)), "dumps_kept": False})
    assert (
        said
        == "quarantined rollout dumps: 32 (steps 21-52) - the abandoned branch's rollout dumps could not be moved aside"
    )


# ------------------------------------------------------------------------------------------------ the command


def test_the_command_writes_the_page_atomically(
    world: tuple[GuardianConfig, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, incident = world
    monkeypatch.setenv("GUARDIAN_HOME", str(config.home))
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    out.write_text("old")
    assert main(["report", str(incident), "-o", str(out)]) == EXIT_OK
    assert out.read_text().startswith("<!DOCTYPE html>") and os.stat(out).st_mode & 0o777 == 0o644
    assert main(["report", "--run", RUN, "-o", str(tmp_path / "out" / "run.html")]) == EXIT_OK
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html", "run.html"]  # no temp file left


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["report", "7", "-o", "{tmp}/r.html"], EXIT_ERROR, "no incident #7 in sqlite:///"),
        (["report", "--run", "nope", "-o", "{tmp}/r.html"], EXIT_ERROR, "no run 'nope' in sqlite:///"),
        (["report", "1", "-o", "{tmp}/missing/r.html"], EXIT_ERROR, "missing does not exist"),
        (["report", "1", "-o", "{tmp}"], EXIT_ERROR, "is a directory"),
        (["report", "1", "--run", RUN, "-o", "{tmp}/r.html"], EXIT_USAGE, "give an INCIDENT_ID or --run RUN_ID"),
        (["report", "-o", "{tmp}/r.html"], EXIT_USAGE, "give an INCIDENT_ID or --run RUN_ID"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    world: tuple[GuardianConfig, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    said: str,
) -> None:
    config, _ = world
    monkeypatch.setenv("GUARDIAN_HOME", str(config.home))
    target = tmp_path / "reports"
    target.mkdir()
    assert main([a.format(tmp=target) for a in argv]) == code
    lines = [line for line in capsys.readouterr().err.splitlines() if "event=using " not in line]
    assert said in lines[0] and len(lines) == 1
    assert list(target.iterdir()) == []
