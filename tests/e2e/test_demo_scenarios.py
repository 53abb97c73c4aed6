"""Each named scenario produces its phenomenon, read back from the trainer's own JSONL and dumps,
and the guardian's checks agree with what each run is (healthy, collapsed, converged, drifting while learning)."""

from __future__ import annotations

import json
import math
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from guardian.config import ChecksConfig
from guardian.core import Severity
from guardian.demo import scenarios, trainer
from guardian.demo.scenarios import RunFiles, Scenario
from guardian.incidents.replay import ReplayResult, replay_file
from guardian.sources.rollouts import GroupStats, RolloutDir


class Run:
    """A finished run's metric lines (by step) and per-step group statistics from its dumps."""

    def __init__(self, files: RunFiles) -> None:
        self.files = files
        self.lines = [json.loads(line) for line in files.metrics.read_text().splitlines()]
        self.steps = {r["step"]: r["data"] for r in self.lines if "training/global_step" in r["data"]}
        dumps = RolloutDir(files.rollouts)
        self.groups: dict[int, GroupStats] = dict(dumps.poll().stats) | dict(dumps.poll().stats)

    def series(self, key: str) -> list[float]:
        return [math.nan if self.steps[s][key] is None else self.steps[s][key] for s in sorted(self.steps)]

    def mean(self, key: str, first: int, last: int) -> float:
        return statistics.fmean(
            v for s, v in zip(sorted(self.steps), self.series(key), strict=True) if first <= s <= last
        )

    def egr(self, first: int, last: int) -> list[float]:
        return [g.effective_group_ratio for s, g in sorted(self.groups.items()) if first <= s <= last]

    def replay(self) -> ReplayResult:
        return replay_file(self.files.metrics, ChecksConfig(), rollouts=self.files.rollouts)


def run_in_process(scenario: Scenario, root: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Run:
    files = RunFiles(root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(files.metrics))
    assert trainer.main([*scenario.arguments(files), *extra]) == scenario.expected_exit_code
    return Run(files)


def critical_checks(result: ReplayResult) -> set[str]:
    return {f.check for f in result.raised if f.severity == Severity.CRITICAL}


# -- fast: short versions of the long scenarios, and the short scenarios ------------------------------


def test_healthy_first_60_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_in_process(scenarios.get("healthy"), tmp_path, monkeypatch, "trainer.total_training_steps=60")
    assert min(run.egr(1, 60)) > 0.5
    assert run.mean("actor/entropy", 55, 60) > 0.95 * run.mean("actor/entropy", 1, 5)
    assert run.steps[60]["actor/lr"] == 1e-6


def test_entropy_collapse_first_80_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the wrong-signed entropy bonus: entropy halves within ~10 steps, the reward stalls near 0.3
    run = run_in_process(scenarios.get("entropy_collapse"), tmp_path, monkeypatch, "trainer.total_training_steps=80")
    start = run.mean("actor/entropy", 1, 5)
    assert run.mean("actor/entropy", 21, 25) < 0.3 * start and run.mean("actor/entropy", 61, 70) < 0.1 * start
    plateau = run.mean("critic/score/mean", 51, 80)
    assert plateau < 0.45 and abs(plateau - run.mean("critic/score/mean", 36, 50)) < 0.08, "stalled far below 1"
    result = run.replay()
    first = result.first_critical
    assert first is not None and first.check == "entropy_collapse", [f.to_json() for f in result.raised]
    assert first.step is not None and first.step <= 60 and first.onset_step is not None and first.onset_step <= 25
    assert (tmp_path / "checkpoints" / "global_step_20" / "actor").is_dir()


def test_seed_settings_first_100_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_in_process(scenarios.get("seed_settings"), tmp_path, monkeypatch, "trainer.total_training_steps=100")
    start = run.mean("actor/entropy", 1, 5)
    assert run.mean("actor/entropy", 41, 50) < 0.2 * start, "collapse within ~20 steps after the 30-step warm-up"
    assert statistics.fmean(run.egr(81, 100)) < 0.2
    assert 0.5 < run.mean("critic/score/mean", 81, 100) < 0.9, "an intermediate plateau, not a solved task"
    assert run.mean("actor/kl_loss", 91, 100) > 10 * run.mean("actor/kl_loss", 1, 3)
    # easy prompts all-correct, the rest stuck: neither kind of uniform group explains the low EGR alone
    late = [g for s, g in run.groups.items() if s > 80]
    assert 0.3 < statistics.fmean(g.all_one_fraction for g in late) < 0.8
    assert (tmp_path / "checkpoints" / "global_step_5" / "actor").is_dir()


def test_kl_blowup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_in_process(scenarios.get("kl_blowup"), tmp_path, monkeypatch)
    kl_start = run.mean("actor/kl_loss", 1, 5)
    assert run.mean("actor/kl_loss", 91, 100) > 20 * kl_start
    assert run.mean("critic/score/mean", 91, 100) > run.mean("critic/score/mean", 1, 10) + 0.5, "still learning"
    assert run.steps[1]["actor/kl_coef"] == 1e-4
    # KL to the reference grows to ~1 nat/token while the reward climbs: a warning, never a rollback
    result = run.replay()
    assert result.healthy, [f.to_json() for f in result.raised]
    assert "kl_drift" in {f.check for f in result.raised}


def test_nan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_in_process(scenarios.get("nan"), tmp_path, monkeypatch)
    for key in ("actor/grad_norm", "actor/entropy", "actor/pg_loss", "rollout_corr/training_log_ppl"):
        series = run.series(key)
        assert all(math.isfinite(v) for v in series[:19]), key
        assert all(math.isnan(v) for v in series[19:]), f"{key} is null from step 20 on"
    assert b'"actor/grad_norm":null' in run.files.metrics.read_bytes()
    assert capsys.readouterr().out.count("WARN: grad_norm is not finite: nan") == 21 * 4, "every update skipped"
    dump = [json.loads(x) for x in (run.files.rollouts / "25.jsonl").read_text().splitlines()]
    assert {row["output"] for row in dump} == {"a" * 16}, "the '!!!!' failure: one token to the length cap"
    assert run.mean("critic/score/mean", 20, 40) < run.mean("critic/score/mean", 1, 19)
    assert "non_finite" in critical_checks(run.replay())


def test_length_explosion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = run_in_process(scenarios.get("length_explosion"), tmp_path, monkeypatch)
    assert run.mean("response_length/mean", 91, 100) > 3 * run.mean("response_length/mean", 1, 5)
    assert run.steps[100]["response_length/max"] == 16
    dump = [json.loads(x) for x in (run.files.rollouts / "100.jsonl").read_text().splitlines()]
    truncated = statistics.fmean(len(row["output"]) == 16 for row in dump)  # 16 letters: no EOS within the cap
    first = [json.loads(x) for x in (run.files.rollouts / "1.jsonl").read_text().splitlines()]
    assert truncated > 0.3 and statistics.fmean(len(row["output"]) == 16 for row in first) == 0
    assert run.mean("critic/score/mean", 91, 100) > run.mean("critic/score/mean", 1, 5), "reward 'improves'"
    # cut at the cap while the reward improves: a warning naming the fix, no rollback (it would not move the cap)
    result = run.replay()
    assert result.healthy, [f.to_json() for f in result.raised]
    truncation = next(f for f in result.raised if f.check == "truncation")
    assert "raise data.max_response_length" in truncation.message


def test_crash_exits_with_its_code_after_logging_the_previous_step(tmp_path: Path) -> None:
    scenario = scenarios.get("crash")
    process = scenario.run(tmp_path, timeout=60)
    assert process.returncode == scenario.expected_exit_code == 3
    lines = [json.loads(x) for x in RunFiles(tmp_path).metrics.read_text().splitlines()]
    assert lines[-1]["step"] == 14
    assert "injected crash at step 15" in RunFiles(tmp_path).console.read_text()
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "10"


def _wait_for_step(path: Path, step: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            if lines and lines[-1]["step"] >= step:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"step {step} did not appear in {path} within {timeout}s")


def test_hang_stops_logging_and_dies_on_sigterm(tmp_path: Path) -> None:
    scenario = scenarios.get("hang")
    assert not scenario.finishes
    files = RunFiles(tmp_path)
    with open(files.console, "wb") as log:
        process = subprocess.Popen(
            scenario.command(files), env=scenario.environment(files), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        assert _wait_for_step(files.metrics, 9, timeout=30)[-1]["step"] == 9
        time.sleep(2.0)
        assert process.poll() is None, "still running"
        assert [json.loads(x)["step"] for x in files.metrics.read_text().splitlines()][-1] == 9, "no line for step 10"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == -signal.SIGTERM, "no signal handler: SIGTERM ends it at once"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_scenarios_are_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = scenarios.get("seed_settings").with_extra("trainer.total_training_steps=8")
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        (tmp_path / name).mkdir()
        runs[name] = run_in_process(scenario, tmp_path / name, monkeypatch, f"++trainer.seed={seed}")
    a, b, c = runs["a"], runs["b"], runs["c"]
    drop = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput")
    for step in a.steps:
        same = {k: v for k, v in a.steps[step].items() if not k.startswith(drop)}
        assert same == {k: v for k, v in b.steps[step].items() if not k.startswith(drop)}
    assert (a.files.rollouts / "8.jsonl").read_bytes() == (b.files.rollouts / "8.jsonl").read_bytes()
    assert c.steps[8]["critic/score/mean"] != a.steps[8]["critic/score/mean"], "the seed matters"


# -- slow: the full 300-step runs, through the command line ------------------------------------------


@pytest.fixture(scope="module")
def collapse_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("entropy_collapse")
    assert scenarios.get("entropy_collapse").run(root, timeout=120).returncode == 0
    return Run(RunFiles(root))


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("seed_settings")
    assert scenarios.get("seed_settings").run(root, timeout=120).returncode == 0
    return Run(RunFiles(root))


@pytest.mark.slow
def test_healthy_300_steps(tmp_path: Path) -> None:
    assert scenarios.get("healthy").run(tmp_path, timeout=120).returncode == 0
    run = Run(RunFiles(tmp_path))
    assert sorted(run.steps) == list(range(1, 301))
    assert min(run.egr(1, 300)) > 0.5, "EGR healthy throughout"
    rewards = [run.mean("critic/score/mean", s - 9, s) for s in (10, 100, 200, 300)]
    assert rewards == sorted(rewards) and rewards[-1] > rewards[0] + 0.1, "reward rises"
    assert run.mean("actor/entropy", 291, 300) > 0.8 * run.mean("actor/entropy", 1, 5)
    result = run.replay()
    assert result.healthy, [f.to_json() for f in result.raised]


@pytest.mark.slow
def test_entropy_collapse_300_steps_and_its_rescue(collapse_run: Run, tmp_path: Path) -> None:
    run = collapse_run
    assert run.mean("actor/entropy", 291, 300) < 0.1 * run.mean("actor/entropy", 1, 5)
    stalled = run.mean("critic/score/mean", 281, 300)
    assert stalled < 0.7, "the same LR with a sound bonus gets past 0.9"
    # the rescue the guardian applies: rung entropy-1 (a bonus instead of a penalty, clip-higher) from step 20
    rescue = scenarios.get("entropy_collapse").with_extra(
        *scenarios.resume_overrides(run.files.checkpoints / "global_step_20", 300), *scenarios.ENTROPY_FIX
    )
    assert rescue.run(tmp_path, timeout=120).returncode == 0
    rescued = Run(RunFiles(tmp_path))
    assert min(rescued.steps) == 21 and rescued.steps[21]["actor/lr"] == 2e-5, "LR and optimizer state kept"
    assert rescued.mean("critic/score/mean", 281, 300) > stalled + 0.2, "the rescued run learns on"
    assert rescued.mean("actor/entropy", 281, 300) > 2 * run.mean("actor/entropy", 281, 300)


@pytest.mark.slow
def test_seed_settings_300_steps(seed_run: Run) -> None:
    run = seed_run
    assert run.mean("actor/entropy", 291, 300) < 0.2 * run.mean("actor/entropy", 1, 5)
    assert statistics.fmean(run.egr(281, 300)) < 0.2
    plateau = [run.mean("critic/score/mean", s - 19, s) for s in (100, 200, 300)]
    assert max(plateau) - min(plateau) < 0.15 and max(plateau) < 0.9, "reward plateaus below the ceiling"
    # KL takes off while the reward climbs (learning, a warning); the entropy that runs out later, on a
    # plateau near 0.85, is convergence: advice, not a rollback (the tutorial's rescue buys +0.02 here)
    result = run.replay()
    assert result.healthy, [f.to_json() for f in result.raised if f.severity == Severity.CRITICAL]
    assert "kl_drift" in {f.check for f in result.raised}
    converged = [f for f in result.raised if f.check == "entropy_collapse" and f.advice]
    assert converged and "a warning, not a rollback" in converged[-1].message


@pytest.mark.slow
@pytest.mark.parametrize("fresh_optimizer", [True, False])
def test_seed_rescue_from_a_healthy_checkpoint(seed_run: Run, tmp_path: Path, fresh_optimizer: bool) -> None:
    checkpoint = seed_run.files.checkpoints / "global_step_5"
    patch = scenarios.rescue_overrides(checkpoint, 300)
    if not fresh_optimizer:  # the LR trap: optimizer and scheduler state bring 5e-5 back
        patch = tuple(p for p in patch if "load_contents" not in p)
    rescue = scenarios.get("seed_settings").with_extra(*patch)
    assert rescue.run(tmp_path, timeout=120).returncode == 0
    run = Run(RunFiles(tmp_path))
    assert run.lines[0]["step"] == 5 and min(run.steps) == 6
    lrs = run.series("actor/lr")
    if not fresh_optimizer:
        # the checkpoint's scheduler comes back: its warm-up continues to 5e-5, the patched 1e-6 is ignored
        assert max(lrs) == pytest.approx(5e-5)
        assert statistics.fmean(run.egr(281, 300)) < 0.3, "the patch without the LR collapses again"
        return
    # a fresh optimizer and scheduler: the warm-up starts again, now towards the patched 1e-6
    assert max(lrs) == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1e-6)
    assert min(run.egr(6, 300)) > 0.5
    assert run.mean("actor/entropy", 291, 300) > 0.4 * run.mean("actor/entropy", 6, 10)
    assert run.mean("critic/score/mean", 291, 300) > run.mean("critic/score/mean", 6, 15) + 0.2, "reward keeps rising"
    assert run.steps[6]["actor/entropy_loss"] > 0 and run.steps[6]["actor/kl_coef"] == 0.01
    assert run.replay().healthy
