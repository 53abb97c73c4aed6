"""Each check on synthetic runs shaped like the real failure (and healthy) modes."""

from __future__ import annotations

import math

from conftest import context, history_of

from guardian.checks.drift import kl_drift, logprob_decline
from guardian.checks.egr import egr_collapse
from guardian.checks.entropy import entropy_collapse, entropy_explosion
from guardian.checks.length import length_collapse, length_explosion, truncation
from guardian.checks.reward import reward_collapse
from guardian.checks.seed import seed_entropy, seed_lld
from guardian.checks.spikes import grad_spike, non_finite
from guardian.checks.stall import stall
from guardian.config import ChecksConfig
from guardian.findings import Severity
from guardian.history import RunHistory, StepRecord
from guardian.keys import ALL_ONE_KEY, ALL_ZERO_KEY, EGR_KEY, Signal

C = ChecksConfig()
H, R = "actor/entropy", "critic/score/mean"
SCORE_RANGE = {"critic/score/max": 1.0, "critic/score/min": 0.0}


def decay(start: float, end: float, n: int) -> list[float]:
    return [start * (end / start) ** (i / (n - 1)) for i in range(n)]


def ramp(start: float, end: float, n: int) -> list[float]:
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def collapse(h: RunHistory) -> Severity:
    return entropy_collapse(context(h), C.entropy_collapse, C.reward_collapse, C.egr_collapse).severity


# -- entropy ---------------------------------------------------------------------------------------
def test_entropy_falling_while_reward_rises_is_learning_not_collapse() -> None:
    # GSM8K-like: entropy 0.5 -> 0.07 while reward climbs 0.1 -> 0.9 (healthy, facts §3.8)
    n = 100
    rows = [{H: e, R: r, **SCORE_RANGE} for e, r in zip(decay(0.5, 0.07, n), ramp(0.1, 0.9, n), strict=True)]
    h = history_of(rows)
    finding = entropy_collapse(context(h), C.entropy_collapse, C.reward_collapse, C.egr_collapse)
    assert finding.severity == Severity.WARN
    assert "learning" in finding.message


def test_entropy_collapse_with_reward_plateau_is_critical_with_onset_at_the_decline() -> None:
    # the seed tutorial's collapse: entropy 2.85 -> 0.05, reward plateaus at 0.55 (mid-range)
    flat = [{H: 2.85, R: 0.2, **SCORE_RANGE}] * 20
    falling = [{H: e, R: min(0.55, 0.2 + 0.01 * i), **SCORE_RANGE} for i, e in enumerate(decay(2.85, 0.05, 80))]
    plateau = [{H: 0.05, R: 0.55, **SCORE_RANGE}] * 30
    h = history_of(flat + falling + plateau)
    finding = entropy_collapse(context(h), C.entropy_collapse, C.reward_collapse, C.egr_collapse)
    assert finding.severity == Severity.CRITICAL
    assert finding.onset_step is not None and 20 < finding.onset_step < 50
    assert finding.evidence["entropy_baseline"] == 2.85


def test_entropy_low_with_low_egr_is_critical_even_if_reward_unknown_trend() -> None:
    rows = [{H: 1.0, EGR_KEY: 0.9, ALL_ZERO_KEY: 0.05, ALL_ONE_KEY: 0.05}] * 10
    rows += [{H: 0.12, EGR_KEY: 0.1, ALL_ZERO_KEY: 0.4, ALL_ONE_KEY: 0.5}] * 5
    assert collapse(history_of(rows)) == Severity.CRITICAL


def test_entropy_low_but_reward_saturated_is_only_a_warning() -> None:
    rows = [{H: 0.5, R: 0.5, **SCORE_RANGE}] * 10 + [{H: 0.03, R: 0.97, **SCORE_RANGE}] * 40
    assert collapse(history_of(rows)) == Severity.WARN


def test_entropy_gone_with_no_reward_signal_is_critical() -> None:
    rows = [{H: 0.5}] * 10 + [{H: 0.005}] * 5
    assert collapse(history_of(rows)) == Severity.CRITICAL


def test_single_low_step_does_not_raise() -> None:
    rows = [{H: 0.5}] * 10 + [{H: 0.005}] + [{H: 0.5}] * 2
    assert collapse(history_of(rows)) == Severity.OK


def test_entropy_explosion_critical_when_reward_falls() -> None:
    rows = [{H: 0.25, R: 0.6, **SCORE_RANGE}] * 10 + [{H: 0.5, R: 0.2, **SCORE_RANGE}] * 6
    finding = entropy_explosion(context(history_of(rows)), C.entropy_explosion, C.reward_collapse)
    assert finding.severity == Severity.CRITICAL
    rows = [{H: 0.25, R: 0.6, **SCORE_RANGE}] * 10 + [{H: 0.5, R: 0.6, **SCORE_RANGE}] * 6
    assert entropy_explosion(context(history_of(rows)), C.entropy_explosion, C.reward_collapse).severity == (
        Severity.WARN
    )


def test_missing_signal_is_unknown_not_an_error() -> None:
    h = history_of([{R: 0.5}] * 10)
    finding = entropy_collapse(context(h), C.entropy_collapse, C.reward_collapse, C.egr_collapse)
    assert finding.severity == Severity.UNKNOWN
    assert "entropy" in finding.message


def test_too_few_steps_for_a_baseline_is_unknown() -> None:
    assert collapse(history_of([{H: 0.5}] * 3)) == Severity.UNKNOWN


# -- EGR -------------------------------------------------------------------------------------------
def test_egr_collapse_critical_but_saturation_is_a_warning() -> None:
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
    assert kl_drift(context(h), C.kl_drift, C.reward_collapse).severity == Severity.OK
    # aopd-1-like blow-up: 0.83 -> 16 in eight steps while reward falls
    values = [0.83, 0.85, 1.3, 2.0, 2.5, 4.4, 7.8, 13.0, 15.7, 16.6, 16.6, 16.9]
    rows = [{"actor/reward_kl_penalty": v} for v in values]
    finding = kl_drift(context(history_of(rows)), C.kl_drift, C.reward_collapse)
    assert finding.severity == Severity.CRITICAL
    assert finding.onset_step is not None and finding.onset_step <= 5


def test_fast_kl_growth_while_reward_climbs_warns_unless_extreme() -> None:
    kl = "actor/kl_loss"
    early = [{kl: 0.2, R: r, **SCORE_RANGE} for r in ramp(0.1, 0.3, 30)]
    fast = [{kl: k, R: r, **SCORE_RANGE} for k, r in zip(ramp(0.2, 0.6, 10), ramp(0.3, 0.5, 10), strict=True)]
    assert kl_drift(context(history_of(early + fast)), C.kl_drift, C.reward_collapse).severity == Severity.WARN
    stalled = [{kl: k, R: 0.3, **SCORE_RANGE} for k in ramp(0.2, 0.6, 10)]
    flat_early = [{kl: 0.2, R: 0.3, **SCORE_RANGE}] * 30
    assert kl_drift(context(history_of(flat_early + stalled)), C.kl_drift, C.reward_collapse).severity == (
        Severity.CRITICAL
    )
    extreme = [{kl: k, R: r, **SCORE_RANGE} for k, r in zip(ramp(0.2, 1.5, 10), ramp(0.3, 0.5, 10), strict=True)]
    assert kl_drift(context(history_of(early + extreme)), C.kl_drift, C.reward_collapse).severity == Severity.CRITICAL


def test_logprob_decline_on_rising_negative_log_likelihood() -> None:
    key = "rollout_corr/training_log_ppl"
    h = history_of([{key: 0.5}] * 10 + [{key: 1.2}] * 4)
    finding = logprob_decline(context(h), C.logprob_decline)
    assert finding.severity == Severity.CRITICAL
    assert finding.evidence["ratio_to_baseline"] == 2.4


# -- reward ----------------------------------------------------------------------------------------
def test_reward_collapse_from_peak() -> None:
    rows = [{R: r, **SCORE_RANGE} for r in ramp(0.2, 0.8, 30)] + [{R: 0.05, **SCORE_RANGE}] * 5
    finding = reward_collapse(context(history_of(rows)), C.reward_collapse)
    assert finding.severity == Severity.CRITICAL
    assert finding.evidence["drop_from_peak_fraction"] is not None


# -- length ----------------------------------------------------------------------------------------
def test_length_collapse_to_a_few_tokens() -> None:
    rows = [{"response_length/mean": v} for v in [970, 1015, 1004, 906, 944, 929, 625, 430, 133, 31, 20, 9, 9]]
    assert length_collapse(context(history_of(rows)), C.length).severity == Severity.CRITICAL


def test_slow_length_growth_is_a_warning_fast_growth_is_critical() -> None:
    slow = [{"response_length/mean": v} for v in ramp(1000, 4000, 100)]
    assert length_explosion(context(history_of(slow)), C.length).severity == Severity.WARN
    fast = [{"response_length/mean": 1000.0}] * 10 + [{"response_length/mean": v} for v in ramp(1000, 6000, 8)]
    assert length_explosion(context(history_of(fast)), C.length).severity == Severity.CRITICAL


def test_truncation_uses_clip_ratio_only_when_batch_max_is_the_cap() -> None:
    # verl V1: clip_ratio is the share at the *batch* max; short batches are not truncated
    rows = [{"response_length/clip_ratio": 0.5, "response_length/max": 300.0}] * 10
    h2 = RunHistory(length_cap=4096)
    for step, row in enumerate(rows, 1):
        h2.add(StepRecord(step, row))
    assert truncation(context(h2), C.length).severity == Severity.OK
    at_cap = [{"response_length/clip_ratio": 0.02, "response_length/max": 4096.0}] * 6
    at_cap += [{"response_length/clip_ratio": 0.5, "response_length/max": 4096.0}] * 4
    h3 = RunHistory(length_cap=4096)
    for step, row in enumerate(at_cap, 1):
        h3.add(StepRecord(step, row))
    assert truncation(context(h3), C.length).severity == Severity.CRITICAL


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


# -- stall ---------------------------------------------------------------------------------------
def test_stall_uses_the_runs_own_step_time_and_an_injected_clock() -> None:
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {"timing_s/step": 30.0}), arrived_at=1000.0 + 30 * step)
    last = 1000.0 + 300
    assert stall(context(h, now=last + 60), C.stall).severity == Severity.OK
    assert stall(context(h, now=last + 100), C.stall).severity == Severity.WARN
    assert stall(context(h, now=last + 151), C.stall).severity == Severity.CRITICAL
    assert stall(context(h, now=None), C.stall).severity == Severity.UNKNOWN


def test_no_first_step_after_startup_timeout() -> None:
    h = RunHistory()
    assert stall(context(h, now=100.0, started_at=0.0), C.stall).severity == Severity.OK
    assert stall(context(h, now=4000.0, started_at=0.0), C.stall).severity == Severity.CRITICAL


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
    from guardian.checks import build_checks, evaluate

    config = ChecksConfig.model_validate({"non_finite": {"warmup_steps": 10}})
    checks = [c for c in build_checks(config) if c.name == "non_finite"]
    h = history_of([{"actor/grad_norm": None}] * 4)
    (finding,) = evaluate(context(h), checks)
    assert finding.severity == Severity.UNKNOWN and "warming up" in finding.message


def test_a_relaunched_trainer_gets_its_start_up_allowance_not_a_stall() -> None:
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {"timing_s/step": 5.0}), arrived_at=1000.0 + 5 * step)
    relaunched_at = 2000.0  # long after the last step of the previous attempt
    assert stall(context(h, now=2100.0, started_at=relaunched_at), C.stall).severity == Severity.OK
    assert stall(context(h, now=relaunched_at + 3600.0, started_at=relaunched_at), C.stall).severity == (
        Severity.CRITICAL
    )
    # once the new attempt logs, the usual limit applies again
    h.add(StepRecord(11, {"timing_s/step": 5.0}), arrived_at=2150.0)
    assert stall(context(h, now=2150.0 + 61.0, started_at=relaunched_at), C.stall).severity == Severity.CRITICAL


def test_tool_calls_are_derived_from_num_turns_unless_logged() -> None:
    history = RunHistory()
    history.add(StepRecord(1, {"num_turns/mean": 6.0}))  # prompt + answer + 2 calls x (assistant, tool)
    history.add(StepRecord(2, {"num_turns/mean": 2.0, "tool_call_counts/mean": 1.25}))
    history.add(StepRecord(3, {"training/num_turns/mean": 1.0}))
    assert history.signal(Signal.TOOL_CALLS).values == [2.0, 1.25, 0.0]
