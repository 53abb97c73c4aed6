"""The reward's trend (checks/trend.py): noise, pace and window from the run itself, and no look-ahead."""

from __future__ import annotations

import numpy as np
import pytest

from guardian.checks.trend import Trend, plateau_start, reward_trend_at
from guardian.config import BaselineConfig, RewardCollapseConfig
from guardian.core import StepRecord
from guardian.history.timeline import RunHistory

R = "critic/score/mean"
CFG, BASE = RewardCollapseConfig(), BaselineConfig()


def run(values: list[float], sigma: float, seed: int = 3, best: float = 1.0) -> RunHistory:
    noise = np.random.default_rng(seed).normal(0.0, sigma, len(values))
    h = RunHistory()
    for step, (v, e) in enumerate(zip(values, noise, strict=True), 1):
        h.add(StepRecord(step, {R: v + float(e), "critic/score/max": best, "critic/score/min": 0.0}))
    return h


def trend(h: RunHistory, step: int | None = None) -> Trend:
    got = reward_trend_at(h, step if step is not None else h.last_step or 0, CFG, BASE)
    assert got is not None
    return got


def ramp(a: float, b: float, n: int) -> list[float]:
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def test_noise_is_the_runs_own_scatter_not_its_trend() -> None:
    t = trend(run(ramp(0.1, 0.9, 80), 0.03))
    assert t.noise == pytest.approx(0.03, rel=0.35)
    assert t.pace == pytest.approx(0.8 / 79, rel=0.35)


def test_the_window_adapts_to_pace_and_noise() -> None:
    fast = trend(run(ramp(0.1, 0.9, 40), 0.01))
    slow = trend(run(ramp(0.1, 0.2, 200), 0.05))
    assert fast.window == CFG.window_min_steps and fast.improving
    assert slow.window == CFG.window_max_steps


def test_a_plateau_after_learning_is_stalled_and_where_it_began_is_found() -> None:
    h = run(ramp(0.1, 0.5, 30) + [0.5] * 30, 0.01)
    t = trend(h)
    assert t.stalled and t.long_stalled and not t.improving and not t.falling and not t.converged
    start = plateau_start(h, 60, CFG, BASE)
    assert start is not None and 27 <= start <= 34


def test_a_fall_is_falling_and_a_fall_below_the_start_is_a_collapse() -> None:
    t = trend(run([0.5] * 30 + ramp(0.5, 0.2, 8) + [0.2] * 4, 0.02))
    assert t.falling and t.collapsed and t.level < t.baseline


def test_near_the_ceiling_a_plateau_is_convergence() -> None:
    assert trend(run(ramp(0.1, 0.8, 40) + [0.8] * 40, 0.02)).converged
    assert not trend(run(ramp(0.1, 0.4, 40) + [0.4] * 40, 0.02)).converged


def test_the_ceiling_is_the_best_sample_seen_not_the_first_batches_best() -> None:
    h = RunHistory()
    for step in range(1, 41):
        best = 0.5 if step < 20 else 1.0  # a fresh policy rarely writes a perfect answer
        h.add(StepRecord(step, {R: 0.45, "critic/score/max": best, "critic/score/min": 0.0}))
    assert trend(h, 15).saturated and not trend(h, 40).saturated


def test_a_judgment_never_changes_when_later_steps_arrive() -> None:
    """What the trend said at a step is what a live guardian said then: the replay reaches the same."""
    values = ramp(0.1, 0.5, 30) + [0.5] * 10 + ramp(0.5, 0.1, 10)
    full = run(values, 0.02)
    for step in range(12, len(values) + 1):
        partial = run(values[:step], 0.02)
        assert trend(partial, step) == trend(full, step), step
