"""Each check on synthetic runs shaped like the real failure (and healthy) modes."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from conftest import context, history_of

from guardian.checks import RuleSet, build_checks, evaluate
from guardian.checks.drift import kl_drift, logprob_decline
from guardian.checks.egr import egr_collapse
from guardian.checks.entropy import entropy_collapse, entropy_explosion
from guardian.checks.length import length_collapse, length_explosion, truncation
from guardian.checks.reward import reward_collapse
from guardian.checks.seed import seed_entropy, seed_lld
from guardian.checks.spikes import grad_spike, non_finite
from guardian.checks.stall import stall
from guardian.config import ChecksConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.history.timeline import RunHistory
from guardian.keys import ALL_ONE_KEY, ALL_ZERO_KEY, EGR_KEY, Signal

C = ChecksConfig()
H, R = "actor/entropy", "critic/score/mean"
SCORE_RANGE = {"critic/score/max": 1.0, "critic/score/min": 0.0}


def decay(start: float, end: float, n: int) -> list[float]:
    return [start * (end / start) ** (i / (n - 1)) for i in range(n)]


def ramp(start: float, end: float, n: int) -> list[float]:
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def noisy(values: list[float], sigma: float, seed: int = 7) -> list[float]:
    """``values`` with reproducible Gaussian batch noise (real rewards scatter step to step)."""
    rng = np.random.default_rng(seed)
    return [v + float(e) for v, e in zip(values, rng.normal(0.0, sigma, len(values)), strict=True)]


def judged(h: RunHistory, check: str, cfg: ChecksConfig = C) -> Finding:
    """The named check's finding as the guardian ends with it: shape and outcome weighed by the policy."""
    (finding,) = [f for f in evaluate(context(h), build_checks(cfg)) if f.check == check]
    return finding


def collapse(h: RunHistory) -> Finding:
    return judged(h, "entropy_collapse")


def collapse_shape(h: RunHistory) -> Finding:
    return entropy_collapse(context(h), C.entropy_collapse, C.egr_collapse)


def rows_of(entropy: list[float], reward: list[float]) -> list[dict[str, float | None]]:
    return [{H: e, R: r, **SCORE_RANGE} for e, r in zip(entropy, reward, strict=True)]


# -- entropy ---------------------------------------------------------------------------------------
def test_entropy_falling_while_reward_rises_is_learning_not_collapse() -> None:
    # GSM8K-like: entropy 0.5 -> 0.07 while reward climbs 0.1 -> 0.9 (healthy, facts §3.8)
    n = 100
    h = RunHistory()
    for step, row in enumerate(rows_of(decay(0.5, 0.07, n), noisy(ramp(0.1, 0.9, n), 0.02)), 1):
        h.add(StepRecord(step, {k: float(v) for k, v in row.items() if v is not None}))
        finding = collapse(h)
        assert finding.severity < Severity.CRITICAL, finding
    assert finding.healthy and "actor/entropy at 14% of its early level" in finding.message
    assert finding.evidence["progress"] == "improving"


def test_entropy_falling_fast_on_a_flat_reward_is_critical_within_seven_steps_with_onset_at_the_fall() -> None:
    # real verl run-a's shape: reward climbs 0.2 -> 0.53 while entropy eases 3.6 -> 2.0 (steps 1-15), then
    # the reward sits at 0.53 while entropy falls 20 % a step
    learning = rows_of(decay(3.6, 2.0, 15), noisy(ramp(0.2, 0.53, 15), 0.01))
    collapsing = rows_of(decay(1.6, 0.1, 15), noisy([0.53] * 15, 0.01, seed=8))
    h = RunHistory()
    first_critical = None
    for step, row in enumerate(learning + collapsing, 1):
        h.add(StepRecord(step, {k: float(v) for k, v in row.items() if v is not None}))
        finding = collapse(h)
        if finding.severity == Severity.CRITICAL and first_critical is None:
            first_critical = finding
    assert first_critical is not None and first_critical.step is not None
    assert first_critical.step - 15 <= 7, first_critical
    assert first_critical.onset_step is not None and 12 <= first_critical.onset_step <= 17
    assert "actor/entropy fell from" in first_critical.message and "not clearly improving" in first_critical.message
    assert first_critical.evidence["policy"] == "mechanism/fast failure"


def test_a_fast_fall_the_reward_pays_for_is_not_a_collapse() -> None:
    # entropy halves within a few steps but the reward keeps climbing
    entropy = decay(2.0, 1.5, 20) + decay(1.4, 0.3, 10)
    reward = noisy(ramp(0.1, 0.3, 20) + ramp(0.35, 0.9, 10), 0.01)
    h = history_of(rows_of(entropy, reward))
    assert collapse_shape(h).severity == Severity.CRITICAL  # the shape is there ...
    finding = collapse(h)
    assert finding.severity == Severity.WARN and finding.advice  # ... the outcome excuses it
    assert "a warning, not a rollback" in finding.message


def test_low_steady_entropy_and_a_flat_reward_near_the_ceiling_is_advice_not_a_collapse() -> None:
    entropy = decay(1.6, 0.05, 40) + noisy([0.04] * 80, 0.003)
    reward = noisy(ramp(0.05, 0.8, 40) + [0.82] * 80, 0.03)
    finding = collapse(history_of(rows_of(entropy, reward)))
    assert finding.severity == Severity.WARN and finding.advice and finding.healthy
    assert "holds near its best" in finding.message


def test_entropy_gone_at_half_the_best_samples_score_is_not_called_converged() -> None:
    # the reward plateaus at 0.45 while the best sample scores 1.0 and entropy slowly goes to zero
    entropy = decay(1.6, 0.05, 40) + noisy([0.04] * 80, 0.003)
    reward = noisy(ramp(0.05, 0.45, 40) + [0.45] * 80, 0.01)
    finding = collapse(history_of(rows_of(entropy, reward)))
    assert finding.severity == Severity.CRITICAL and not finding.advice
    assert finding.evidence["progress"] == "stalled"


def test_entropy_low_but_reward_saturated_is_advice() -> None:
    rows = rows_of([0.5] * 10 + decay(0.5, 0.03, 20) + [0.03] * 20, noisy([0.5] * 10 + [0.97] * 40, 0.01))
    finding = collapse(history_of(rows))
    assert finding.severity == Severity.WARN and finding.advice


def test_entropy_dead_within_a_few_steps_acts_alone_even_while_the_reward_climbs() -> None:
    # an LR far too high: entropy 4.1 -> 0 within ten steps, the reward still rising on the last samples
    entropy = [4.1] * 6 + decay(4.0, 0.002, 8)
    reward = noisy(ramp(0.1, 0.4, 14), 0.005)
    finding = collapse(history_of(rows_of(entropy, reward)))
    assert finding.severity == Severity.CRITICAL and finding.evidence["hard"] is True
    assert "went deterministic" in finding.message and finding.evidence["policy"] == "mechanism/hard failure"


def test_the_early_reference_sees_a_fall_that_began_in_the_baseline_window() -> None:
    # entropy already falling in the first steps: the median of the first five (2.0) hides half the fall
    entropy = decay(4.0, 1.0, 6) + decay(0.9, 0.5, 10)
    finding = collapse_shape(history_of([{H: e} for e in entropy]))
    assert finding.evidence["entropy_reference"] == 4.0
    assert finding.evidence["entropy_ratio"] == pytest.approx(0.125)


def test_slow_collapse_with_a_stalled_reward_is_critical() -> None:
    entropy = [1.0] * 10 + decay(1.0, 0.05, 60)
    reward = noisy([0.3] * 70, 0.02)
    finding = collapse(history_of(rows_of(entropy, reward)))
    assert finding.severity == Severity.CRITICAL
    assert "still falling" in finding.message


def test_entropy_low_with_low_egr_is_critical_when_the_reward_is_stuck() -> None:
    rows = [{H: 1.0, R: 0.4, EGR_KEY: 0.9, ALL_ZERO_KEY: 0.05, ALL_ONE_KEY: 0.05, **SCORE_RANGE}] * 10
    rows += [
        {H: e, R: r, EGR_KEY: 0.1, ALL_ZERO_KEY: 0.4, ALL_ONE_KEY: 0.5, **SCORE_RANGE}
        for e, r in zip([0.29] * 20 + decay(0.29, 0.16, 25), noisy([0.4] * 45, 0.02), strict=True)
    ]
    finding = collapse(history_of(rows))
    assert finding.severity == Severity.CRITICAL
    assert "groups with mixed rewards" in finding.message


def test_entropy_gone_with_no_reward_signal_is_critical() -> None:
    rows: list[dict[str, float | None]] = [{H: 0.5}] * 10 + [{H: 0.005}] * 5
    assert collapse(history_of(rows)).severity == Severity.CRITICAL


def test_single_low_step_does_not_raise() -> None:
    rows: list[dict[str, float | None]] = [{H: 0.5}] * 10 + [{H: 0.005}] + [{H: 0.5}] * 2
    assert collapse(history_of(rows)).severity == Severity.OK


def explosion(rows: list[dict[str, float | None]]) -> Finding:
    return judged(history_of(rows), "entropy_explosion")


def test_entropy_explosion_critical_when_reward_falls() -> None:
    rising = rows_of([0.8] * 10 + [1.6] * 6, noisy([0.6] * 10 + [0.2] * 6, 0.01))
    assert explosion(rising).severity == Severity.CRITICAL
    learning = rows_of([0.8] * 10 + [1.6] * 6, noisy(ramp(0.2, 0.6, 16), 0.01))
    finding = explosion(learning)
    assert finding.severity == Severity.WARN and finding.advice


def test_entropy_rising_from_a_very_low_baseline_while_reward_holds_is_not_critical() -> None:
    # a healthy run (final eval 0.89): entropy 0.13 -> 0.67 while reward holds at 0.83-0.9
    rows = rows_of([0.13] * 10 + ramp(0.13, 0.67, 30), noisy([0.86] * 40, 0.02))
    finding = explosion(rows)
    assert finding.severity == Severity.WARN
    assert "actor/entropy rose to" in finding.message


def test_entropy_explosion_eases_when_the_raw_value_is_back_to_normal() -> None:
    # the smoothed series still reads high for a step after the raw entropy came back (3-step median lag)
    spike = rows_of([1.2] * 10 + [4.0] * 6 + [1.2], noisy([0.5] * 10 + [0.3] * 7, 0.01))

    def shape(rows: list[dict[str, float | None]]) -> Finding:
        return entropy_explosion(context(history_of(rows)), C.entropy_explosion)

    finding = shape(spike)
    assert finding.evidence["entropy_smoothed"] == 4.0 and finding.evidence["entropy_ratio"] == 1.0
    assert finding.severity == Severity.CRITICAL  # held: one normal point does not ease a critical
    back = spike + rows_of([1.2, 1.2], [0.3, 0.3])
    assert shape(back).severity == Severity.OK


def test_missing_signal_is_unknown_not_an_error() -> None:
    finding = collapse(history_of([{R: 0.5}] * 10))
    assert finding.severity == Severity.UNKNOWN
    assert "entropy" in finding.message


def test_too_few_steps_for_a_baseline_is_unknown() -> None:
    assert collapse(history_of([{H: 0.5}] * 3)).severity == Severity.UNKNOWN


# -- EGR -------------------------------------------------------------------------------------------
def test_egr_collapse_is_a_failure_shape_but_saturation_is_a_warning() -> None:
    healthy = [{EGR_KEY: 0.9, ALL_ZERO_KEY: 0.05, ALL_ONE_KEY: 0.05}] * 6
    stuck = [{EGR_KEY: 0.1, ALL_ZERO_KEY: 0.45, ALL_ONE_KEY: 0.45}] * 3
    finding = egr_collapse(context(history_of(healthy + stuck)), C.egr_collapse)
    assert finding.severity == Severity.CRITICAL
    easy = [{EGR_KEY: 0.1, ALL_ZERO_KEY: 0.0, ALL_ONE_KEY: 0.9}] * 3
    finding = egr_collapse(context(history_of(healthy + easy)), C.egr_collapse)
    assert finding.severity == Severity.WARN
    assert "too easy" in finding.message


def test_egr_estimated_from_dapo_evictions() -> None:
    h = RunHistory(train_batch_size=32)
    for step in range(1, 10):
        h.add(StepRecord(step, {"training/filter_groups/evicted_samples": 96.0}))
    assert math.isclose(h.signal(Signal.EGR).values[-1], 32 / 128)


# -- KL and log-prob ---------------------------------------------------------------------------
def test_kl_growing_slowly_is_learning_a_blow_up_is_drift() -> None:
    kl = "actor/kl_loss"
    # a healthy run: KL starts at 0 (policy = reference) and walks up slowly
    h = history_of([{kl: v} for v in ramp(0.0, 0.8, 200)])
    assert kl_drift(context(h), C.kl_drift).severity == Severity.OK
    # aopd-1-like blow-up: 0.83 -> 16 in eight steps while reward falls
    values = [0.83, 0.85, 1.3, 2.0, 2.5, 4.4, 7.8, 13.0, 15.7, 16.6, 16.6, 16.9]
    rows = [{"actor/reward_kl_penalty": v} for v in values]
    finding = kl_drift(context(history_of(rows)), C.kl_drift)
    assert finding.severity == Severity.CRITICAL
    assert finding.onset_step is not None and finding.onset_step <= 5


def test_fast_kl_growth_while_the_reward_climbs_is_advice_while_it_stalls_a_rollback() -> None:
    kl = "actor/kl_loss"
    early = [{kl: 0.2, R: r, **SCORE_RANGE} for r in ramp(0.1, 0.3, 30)]
    for growth in (ramp(0.2, 0.6, 10), ramp(0.2, 1.5, 10)):  # even an extreme growth, while the run learns
        fast = [{kl: k, R: r, **SCORE_RANGE} for k, r in zip(growth, ramp(0.3, 0.5, 10), strict=True)]
        finding = judged(history_of(early + fast), "kl_drift")
        assert finding.severity == Severity.WARN and finding.advice, finding
    stalled = [{kl: k, R: 0.3, **SCORE_RANGE} for k in ramp(0.2, 0.6, 10)]
    flat_early = [{kl: 0.2, R: 0.3, **SCORE_RANGE}] * 30
    assert judged(history_of(flat_early + stalled), "kl_drift").severity == Severity.CRITICAL


def test_logprob_decline_on_rising_negative_log_likelihood() -> None:
    key = "rollout_corr/training_log_ppl"
    h = history_of([{key: 0.5}] * 10 + [{key: 1.2}] * 4)
    finding = logprob_decline(context(h), C.logprob_decline)
    assert finding.severity == Severity.CRITICAL
    assert finding.evidence["ratio_to_baseline"] == 2.4


# -- reward ----------------------------------------------------------------------------------------
def test_reward_collapse_from_peak() -> None:
    rows = [{R: r, **SCORE_RANGE} for r in noisy(ramp(0.2, 0.8, 30) + [0.05] * 5, 0.01)]
    finding = reward_collapse(context(history_of(rows)), C.reward_collapse)
    assert finding.severity == Severity.CRITICAL
    assert finding.evidence["drop_from_best"] is not None and "critic/score/mean" in finding.message


def test_reward_fall_is_judged_against_noise_not_a_share_of_the_score_range() -> None:
    # a [-1, 1] score sinking -0.55 -> -0.85 is 15 % of the range, eight sigmas of its noise, below its start
    signed = {"critic/score/max": 1.0, "critic/score/min": -1.0}
    scores = noisy([-0.55] * 30 + ramp(-0.55, -0.85, 10) + [-0.85] * 5, 0.04)
    finding = reward_collapse(context(history_of([{R: r, **signed} for r in scores])), C.reward_collapse)
    assert finding.severity == Severity.CRITICAL
    assert "below where the run started" in finding.message


def test_a_reward_far_below_its_start_acts_alone_a_smaller_fall_needs_a_mechanism() -> None:
    # three points below the start by half the scale: a hard failure, with the fall's first step as onset
    far = [{R: r, **SCORE_RANGE} for r in [0.9, 0.85, 0.95, 0.9, 0.1, 0.0, 0.05]]
    finding = judged(history_of(far), "reward_collapse")
    assert finding.severity == Severity.CRITICAL and finding.onset_step == 5
    assert "far below where the run started" in finding.message
    # a significant fall that keeps half of the start: the reward's own finding warns
    fell = [{R: r, **SCORE_RANGE} for r in noisy([0.6] * 30 + [0.4] * 10, 0.01)]
    assert reward_collapse(context(history_of(fell)), C.reward_collapse).severity == Severity.CRITICAL
    assert judged(history_of(fell), "reward_collapse").severity == Severity.WARN


def test_a_noisy_flat_reward_is_not_falling() -> None:
    rows = [{R: r, **SCORE_RANGE} for r in noisy([0.5] * 300, 0.07)]
    h = RunHistory()
    for step, row in enumerate(rows, 1):
        h.add(StepRecord(step, row))
        assert reward_collapse(context(h), C.reward_collapse).severity < Severity.CRITICAL


# -- length ----------------------------------------------------------------------------------------
def test_length_collapse_to_a_few_tokens() -> None:
    rows = [{"response_length/mean": v} for v in [970, 1015, 1004, 906, 944, 929, 625, 430, 133, 31, 20, 9, 9]]
    assert length_collapse(context(history_of(rows)), C.length).severity == Severity.CRITICAL


def test_length_growth_is_a_warning_with_the_fix_critical_only_when_the_reward_falls() -> None:
    slow = [{"response_length/mean": v} for v in ramp(1000, 4000, 100)]
    assert length_explosion(context(history_of(slow)), C.length).severity == Severity.WARN
    lengths = [1000.0] * 10 + ramp(1000, 6000, 8)
    learning = [
        {"response_length/mean": v, R: r, **SCORE_RANGE}
        for v, r in zip(lengths, noisy(ramp(0.2, 0.5, 18), 0.01), strict=True)
    ]
    finding = judged(history_of(learning), "length_explosion")
    assert finding.severity == Severity.WARN and "data.max_response_length" in finding.message
    falling = [
        {"response_length/mean": v, R: r, **SCORE_RANGE}
        for v, r in zip(lengths, noisy([0.5] * 10 + ramp(0.5, 0.1, 8), 0.01), strict=True)
    ]
    assert judged(history_of(falling), "length_explosion").severity == Severity.CRITICAL


def truncated_run(shares: list[float], rewards: list[float]) -> RunHistory:
    h = RunHistory(length_cap=4096)
    for step, (share, reward) in enumerate(zip(shares, rewards, strict=True), 1):
        h.add(
            StepRecord(
                step, {"response_length/clip_ratio": share, "response_length/max": 4096.0, R: reward, **SCORE_RANGE}
            )
        )
    return h


def test_truncation_uses_clip_ratio_only_when_batch_max_is_the_cap() -> None:
    # verl V1: clip_ratio is the share at the *batch* max; short batches are not truncated
    h2 = RunHistory(length_cap=4096)
    for step in range(1, 11):
        h2.add(StepRecord(step, {"response_length/clip_ratio": 0.5, "response_length/max": 300.0}))
    assert truncation(context(h2), C.length).severity == Severity.OK


def test_truncation_warns_with_the_fix_and_is_critical_only_when_the_reward_falls() -> None:
    shares = [0.02] * 6 + [0.95] * 14
    improving = truncated_run(shares, noisy(ramp(0.2, 0.6, 20), 0.01))
    finding = judged(improving, "truncation")
    assert finding.severity == Severity.WARN
    assert "raise data.max_response_length" in finding.message and "4096 tokens" in finding.message
    falling = truncated_run(shares, noisy([0.6] * 8 + ramp(0.6, 0.2, 12), 0.01))
    assert judged(falling, "truncation").severity == Severity.CRITICAL
    # half the answers cut while the reward falls is a warning: not every answer is cut
    half = truncated_run([0.02] * 6 + [0.5] * 14, noisy([0.6] * 8 + ramp(0.6, 0.2, 12), 0.01))
    assert judged(half, "truncation").severity == Severity.WARN


def test_a_critical_does_not_flap_when_one_point_dips() -> None:
    shares = [0.02] * 6 + [0.95] * 10 + [0.25] + [0.95] * 3
    rewards = noisy([0.6] * 6 + ramp(0.6, 0.2, 14), 0.01)
    h = RunHistory(length_cap=4096)
    seen = []
    for step, (share, reward) in enumerate(zip(shares, rewards, strict=True), 1):
        h.add(
            StepRecord(
                step, {"response_length/clip_ratio": share, "response_length/max": 4096.0, R: reward, **SCORE_RANGE}
            )
        )
        seen.append(judged(h, "truncation").severity)
    first = seen.index(Severity.CRITICAL)
    assert all(s == Severity.CRITICAL for s in seen[first:]), seen


# -- onsets: where a fired check says the run-up began ------------------------------------------
def _onset(h: RunHistory, judge: Callable[[RunHistory, ChecksConfig], Finding], cfg: ChecksConfig) -> int | None:
    finding = judge(h, cfg)
    assert finding.severity >= Severity.WARN, finding
    return finding.onset_step


ONSET_CASES = {
    "entropy_explosion.onset_ratio": (
        [{H: 0.5}] * 5 + [{H: v} for v in ramp(0.5, 1.0, 20)],
        lambda h, c: entropy_explosion(context(h), c.entropy_explosion),
        {"entropy_explosion": {"onset_ratio": 1.1}},
    ),
    "entropy_collapse.onset_ratio": (
        [{H: 1.0}] * 5 + [{H: v} for v in ramp(1.0, 0.1, 20)],
        lambda h, c: entropy_collapse(context(h), c.entropy_collapse, c.egr_collapse),
        {"entropy_collapse": {"onset_ratio": 0.9}},
    ),
    "kl_drift.onset_growth": (
        [{"actor/kl_loss": 0.2}] * 15 + [{"actor/kl_loss": 0.2 * 1.15**i} for i in range(1, 16)],
        lambda h, c: kl_drift(context(h), c.kl_drift),
        {"kl_drift": {"onset_growth": 1.2}},
    ),
    "logprob_decline.onset_rise": (
        [{"rollout_corr/training_log_ppl": 1.0}] * 5
        + [{"rollout_corr/training_log_ppl": v} for v in ramp(1.0, 2.0, 20)],
        lambda h, c: logprob_decline(context(h), c.logprob_decline),
        {"logprob_decline": {"onset_rise": 0.05}},
    ),
    "length.collapse_onset_ratio": (
        [{"response_length/mean": 1000.0}] * 5 + [{"response_length/mean": v} for v in ramp(1000, 300, 20)],
        lambda h, c: length_collapse(context(h), c.length),
        {"length": {"collapse_onset_ratio": 0.95}},
    ),
    "length.explosion_onset_ratio": (
        [{"response_length/mean": 1000.0}] * 5 + [{"response_length/mean": v} for v in ramp(1000, 2500, 20)],
        lambda h, c: length_explosion(context(h), c.length),
        {"length": {"explosion_onset_ratio": 1.05}},
    ),
}


@pytest.mark.parametrize("setting", ONSET_CASES)
def test_the_onset_level_is_the_configured_one(setting: str) -> None:
    rows, judge, stricter = ONSET_CASES[setting]
    h = history_of(rows)
    default_onset = _onset(h, judge, C)
    earlier = _onset(h, judge, ChecksConfig.model_validate(stricter))
    assert default_onset is not None and earlier is not None
    assert earlier < default_onset, (earlier, default_onset)


# -- spikes and numbers ------------------------------------------------------------------------
def test_isolated_grad_spike_warns_sustained_is_critical() -> None:
    g = "actor/grad_norm"
    base = [{g: 2.3}] * 20
    assert grad_spike(context(history_of([*base, {g: 48.0}])), C.grad_spike).severity == Severity.WARN
    assert grad_spike(context(history_of([*base, {g: 48.0}, {g: 2.4}])), C.grad_spike).severity == Severity.OK
    finding = grad_spike(context(history_of([*base, {g: 15.0}, {g: 30.0}])), C.grad_spike)
    assert finding.severity == Severity.CRITICAL
    assert finding.onset_step == 21


def test_non_finite_one_step_warns_two_steps_critical() -> None:
    g = "actor/grad_norm"
    h = history_of([{g: 0.1}] * 5 + [{g: None}])
    assert non_finite(context(h), C.non_finite).severity == Severity.WARN
    h = history_of([{g: 0.1}] * 5 + [{g: None}, {g: None, "actor/entropy": None}])
    finding = non_finite(context(h), C.non_finite)
    assert finding.severity == Severity.CRITICAL
    assert finding.onset_step == 6
    assert "actor/entropy" in str(finding.evidence["keys"])


# -- stall (a trainer known to run; without one: tests/unit/test_stall.py) ----------------------------
def test_stall_uses_the_runs_own_step_time_and_an_injected_clock() -> None:
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {"timing_s/step": 30.0}), arrived_at=1000.0 + 30 * step)
    last = 1000.0 + 300
    assert stall(context(h, now=last + 60, trainer_alive=True), C.stall).severity == Severity.OK
    assert stall(context(h, now=last + 100, trainer_alive=True), C.stall).severity == Severity.WARN
    assert stall(context(h, now=last + 151, trainer_alive=True), C.stall).severity == Severity.CRITICAL
    assert stall(context(h, now=None), C.stall).severity == Severity.UNKNOWN


def test_no_first_step_after_startup_timeout() -> None:
    h = RunHistory()
    assert stall(context(h, now=100.0, started_at=0.0, trainer_alive=True), C.stall).severity == Severity.OK
    assert stall(context(h, now=4000.0, started_at=0.0, trainer_alive=True), C.stall).severity == Severity.CRITICAL


# -- seed rules (reproduced as written, flaws included) ------------------------------------------
def test_seed_entropy_fires_on_healthy_learning() -> None:
    rows = [{H: e} for e in decay(0.5, 0.07, 50)]
    assert seed_entropy(context(history_of(rows))).severity == Severity.CRITICAL


def test_seed_lld_sign_bug_fires_when_log_prob_improves() -> None:
    key = "rollout_corr/training_log_ppl"
    improving = [{key: v} for v in ramp(3.0, 1.0, 600)]  # -log pi falls: log pi rises (better)
    worsening = [{key: v} for v in ramp(1.0, 2.0, 600)]
    assert seed_lld(context(history_of(improving))).severity == Severity.CRITICAL
    assert seed_lld(context(history_of(worsening))).severity == Severity.OK


def test_per_check_warmup_holds_judgement() -> None:
    config = ChecksConfig.model_validate({"non_finite": {"warmup_steps": 10}})
    checks = [c for c in build_checks(config) if c.name == "non_finite"]
    h = history_of([{"actor/grad_norm": None}] * 4)
    (finding,) = evaluate(context(h), RuleSet(checks, config))
    assert finding.severity == Severity.UNKNOWN and "warming up" in finding.message


def test_a_relaunched_trainer_gets_its_start_up_allowance_not_a_stall() -> None:
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {"timing_s/step": 5.0}), arrived_at=1000.0 + 5 * step)
    relaunched_at = 2000.0  # long after the last step of the previous attempt
    assert stall(context(h, now=2100.0, started_at=relaunched_at, trainer_alive=True), C.stall).severity == Severity.OK
    assert stall(
        context(h, now=relaunched_at + 3600.0, started_at=relaunched_at, trainer_alive=True), C.stall
    ).severity == (Severity.CRITICAL)
    # once the new attempt logs, the usual limit applies again
    h.add(StepRecord(11, {"timing_s/step": 5.0}), arrived_at=2150.0)
    assert (
        stall(context(h, now=2150.0 + 61.0, started_at=relaunched_at, trainer_alive=True), C.stall).severity
        == Severity.CRITICAL
    )


def test_tool_calls_are_derived_from_num_turns_unless_logged() -> None:
    history = RunHistory()
    history.add(StepRecord(1, {"num_turns/mean": 6.0}))  # prompt + answer + 2 calls x (assistant, tool)
    history.add(StepRecord(2, {"num_turns/mean": 2.0, "tool_call_counts/mean": 1.25}))
    history.add(StepRecord(3, {"training/num_turns/mean": 1.0}))
    assert history.signal(Signal.TOOL_CALLS).values == [2.0, 1.25, 0.0]
