"""The samples ``guardian report`` counts and shows, on real verl 0.9.1 rollout dumps (tests/fixtures/verl-0.9.1-run/
rollouts: 4 dumps of 128 samples): a watched run's dump folder is read once however it was named, and the
highest-reward table shows each (prompt, response) once, however often a collapsed policy dumped it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from conftest import fixture_path

from guardian.cli import EXIT_OK, main
from guardian.config import GuardianConfig
from guardian.report import page
from guardian.report.assemble import run_report
from guardian.report.trajectories import DumpFolder, highest_reward
from guardian.review.samples import top_samples
from guardian.store import Store

REAL = fixture_path("verl-0.9.1-run")
DUMPS, SAMPLES = 4, 4 * 128  # rollouts/{1,2,5,10}.jsonl: train_batch_size 32 x n 4


def _watched(root: Path) -> None:
    """A watched attempt's files as ``guardian run`` lays them out: attempt-1/metrics.jsonl and its rollouts."""
    attempt = root / "attempt-1"
    attempt.mkdir(parents=True)
    shutil.copy(REAL / "metrics-10-steps.jsonl", attempt / "metrics.jsonl")
    shutil.copytree(REAL / "rollouts", attempt / "rollouts")


def _watch_and_report(home: Path, metrics: str, rollouts: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    argv = ["--log-level", "ERROR", "watch", "--metrics", metrics, "--rollouts", rollouts, "--run-id", "watched"]
    assert main([*argv, "--no-follow", "--no-live"]) == EXIT_OK
    config = GuardianConfig.model_validate({"home": str(home)})
    with Store.open(config.database_url()) as store:
        report = run_report(store, "watched", config, 1_800_000_000.0)
    assert report is not None and report.trajectories is not None
    sample = report.trajectories
    assert (sample.dumps, sample.scored_rows) == (DUMPS, SAMPLES), sample.folders
    assert len(sample.folders) == 1
    return page.render(report)


def test_a_run_watched_by_relative_paths_counts_each_dump_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the attempt's metrics path is stored as given (relative), the run's dump folder resolved: one folder, two names
    _watched(tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    html = _watch_and_report(tmp_path / "home", "attempt-1/metrics.jsonl", "attempt-1/rollouts", monkeypatch)
    assert f"distinct samples of {SAMPLES} scored in {DUMPS} rollout dump(s)" in html


def test_a_run_watched_through_a_link_counts_each_dump_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _watched(tmp_path / "run")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    link = tmp_path / "link" / "attempt-1"
    _watch_and_report(tmp_path / "home", str(link / "metrics.jsonl"), str(link / "rollouts"), monkeypatch)


def _rows(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_highest_reward_table_shows_distinct_samples(tmp_path: Path) -> None:
    """A collapsed policy dumps the same samples step after step: steps 11-25 repeat step 10's dump. Each
    (prompt, response) is shown once, at its best score and, among equal scores, at its latest step."""
    dumps = tmp_path / "rollouts"
    shutil.copytree(REAL / "rollouts", dumps)
    for step in range(11, 26):
        (dumps / f"{step}.jsonl").write_bytes((dumps / "10.jsonl").read_bytes())
    best: dict[tuple[object, object], float] = {}
    for name in ("1", "2", "5", "10"):
        for r in _rows(dumps / f"{name}.jsonl"):
            key = (r["input"], r["output"])
            best[key] = max(best.get(key, float("-inf")), float(r["score"]))  # type: ignore[arg-type]
    repeated = {(r["input"], r["output"]) for r in _rows(dumps / "10.jsonl")}
    sample = highest_reward([DumpFolder(dumps, None)], None, {}, 20)
    shown = [(t.prompt, t.response) for t in sample.shown]
    assert len(shown) == 20 and len(set(shown)) == 20, "a repeated sample is shown once"
    assert [t.score for t in sample.shown] == sorted(best.values(), reverse=True)[:20]
    assert all(t.step == 25 for t in sample.shown if (t.prompt, t.response) in repeated)
    assert (sample.dumps, sample.scored_rows) == (DUMPS + 15, SAMPLES + 15 * 128)  # every row read is counted


def test_a_sample_is_held_at_its_best_occurrence_however_the_scores_arrive(tmp_path: Path) -> None:
    """Rising, falling and repeated scores over many steps, held two at a time: the same as ranking every row."""
    rows = {
        step: [
            {"input": "p", "output": "a", "score": step},  # better every step: its older entries go stale
            {"input": "p", "output": "b", "score": 40 - step},  # best at the first step
            {"input": "q", "output": "a", "score": step % 7},
            {"input": f"p{step}", "output": "a", "score": 20},
        ]
        for step in range(1, 40)
    }
    for step, dumped in rows.items():
        (tmp_path / f"{step}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in dumped))
    best: dict[tuple[str, str], tuple[float, int]] = {}
    for step, dumped in rows.items():
        for r in dumped:
            key = (str(r["input"]), str(r["output"]))
            best[key] = max(best.get(key, (float("-inf"), 0)), (float(r["score"]), step))  # type: ignore[arg-type]
    for count in (1, 2, 3, 50):
        shown = highest_reward([DumpFolder(tmp_path, None)], None, {}, count).shown
        expected = sorted(best.values(), reverse=True)[:count]
        assert [(t.score, t.step) for t in shown] == expected
        assert len({(t.prompt, t.response) for t in shown}) == len(shown)


def test_the_checklists_samples_are_one_per_whole_prompt_not_per_shown_prefix(tmp_path: Path) -> None:
    """Prompts that share a long preamble (a system prompt, tool schemas) longer than the characters shown are
    different prompts: each keeps its own best sample."""
    preamble = "You are a careful assistant. " * 20  # 580 characters, more than review_chars shows
    rows = [
        {"input": preamble + "copy 3", "output": "3333", "score": 1.0},
        {"input": preamble + "copy 4", "output": "4444", "score": 0.9},
        {"input": preamble + "copy 4", "output": "4441", "score": 0.8},  # the same prompt: its best is kept
    ]
    (tmp_path / "7.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    review = top_samples({7: tmp_path / "7.jsonl"}, count=5, chars=400)
    assert [(s.score, s.response) for s in review.samples] == [(1.0, "3333"), (0.9, "4444")]
    assert all(len(s.prompt) == 400 and s.prompt.endswith("…") for s in review.samples)
