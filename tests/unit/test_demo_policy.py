"""The demo's RL math: analytic gradients against finite differences, GRPO, KL, AdamW, the LR schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from guardian.demo.optim import LR_GAIN, AdamW, ConstantWarmup, clip_grad_norm
from guardian.demo.policy import (
    GRPO_EPS,
    LossConfig,
    MiniBatch,
    actor_loss,
    grpo_advantages,
    initial_params,
    kl_estimate,
    sample,
    token_stats,
)
from guardian.demo.task import EOS, VOCAB_SIZE, OverlongBuffer, build_dataset, compute_score, dapo_reward


def _batch(temperature: float, seed: int = 0) -> tuple[dict[str, np.ndarray], MiniBatch]:
    rng = np.random.default_rng(seed)
    params = initial_params(num_prompts=3, max_len=5)
    params["table"] += rng.normal(scale=0.5, size=params["table"].shape)
    params["shared"] += rng.normal(scale=0.3, size=params["shared"].shape)
    prompt_ids = np.repeat(np.arange(3), 4)
    rollout = sample(params, prompt_ids, temperature, rng)
    logp, _, _ = token_stats(params, prompt_ids, rollout.tokens, temperature)
    old = logp + rng.normal(scale=0.3, size=logp.shape)  # ratios spread across the clip range
    ref = logp + rng.normal(scale=0.5, size=logp.shape)
    adv = rng.normal(size=prompt_ids.size)
    return params, MiniBatch(prompt_ids, rollout.tokens, rollout.mask, adv, old, ref)


@pytest.mark.parametrize(
    ("temperature", "entropy_coeff", "use_kl", "kl_type"),
    [(1.0, 0.0, False, "low_var_kl"), (0.5, 0.01, True, "low_var_kl"), (1.0, 0.2, True, "k1"), (0.7, 0.0, True, "mse")],
)
def test_analytic_gradient_matches_finite_differences(
    temperature: float, entropy_coeff: float, use_kl: bool, kl_type: str
) -> None:
    params, batch = _batch(temperature)
    cfg = LossConfig(0.2, 0.28, 3.0, entropy_coeff, use_kl, 0.5, kl_type, temperature)
    _, grads = actor_loss(params, batch, cfg)
    rng = np.random.default_rng(1)
    h = 1e-6
    checked = 0
    for name in ("shared", "table"):
        flat = params[name].reshape(-1)
        for index in rng.choice(flat.size, size=25, replace=False):
            saved = flat[index]
            flat[index] = saved + h
            up = actor_loss(params, batch, cfg)[0]["actor/loss"]
            flat[index] = saved - h
            down = actor_loss(params, batch, cfg)[0]["actor/loss"]
            flat[index] = saved
            numeric = (up - down) / (2 * h)
            assert grads[name].reshape(-1)[index] == pytest.approx(numeric, abs=1e-6, rel=1e-4)
            checked += abs(numeric) > 1e-8
    assert checked > 10, "the check must cover parameters that matter"


def test_loss_metrics_follow_verl_definitions() -> None:
    params, batch = _batch(1.0, seed=3)
    cfg = LossConfig(0.2, 0.2, 3.0, 0.0, True, 0.01, "low_var_kl", 1.0)
    metrics, _ = actor_loss(params, batch, cfg)
    logp, _, _ = token_stats(params, batch.prompt_ids, batch.tokens, 1.0)
    m = batch.mask.astype(bool)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(np.mean((batch.old_logp - logp)[m])))
    ratio = np.exp(logp - batch.old_logp)
    adv = np.broadcast_to(batch.advantages[:, None], ratio.shape)
    clipped = -adv * np.clip(ratio, 0.8, 1.2) > -adv * ratio
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(np.mean(clipped[m])))
    assert metrics["actor/kl_coef"] == 0.01
    k3 = np.exp(batch.ref_logp - logp) - (batch.ref_logp - logp) - 1  # type: ignore[operator]
    assert metrics["actor/kl_loss"] == pytest.approx(float(np.mean(np.clip(k3, -10, 10)[m])))
    assert "actor/entropy_loss" not in metrics, "only with entropy_coeff != 0, as in verl"


def test_grpo_advantages_like_verl() -> None:
    scores = np.array([1.0, 0.0, 0.5, 0.5, 0.3, 0.7, 0.2])
    groups = np.array([0, 0, 1, 1, 2, 2, 3])
    adv = grpo_advantages(scores, groups, norm_by_std=True)
    std0 = np.std([1.0, 0.0], ddof=1)
    assert adv[0] == pytest.approx(0.5 / (std0 + GRPO_EPS))
    assert adv[2] == adv[3] == 0.0, "an all-equal group teaches nothing"
    assert adv[6] == pytest.approx(0.2 / (1.0 + GRPO_EPS)), "one-sample group: mean 0, std 1"
    assert grpo_advantages(scores, groups, norm_by_std=False)[4] == pytest.approx(-0.2)


def test_kl_estimators_and_clamps() -> None:
    logp = np.array([-1.0, -2.0, -30.0])
    ref = np.array([-1.5, -2.0, -1.0])
    value, grad = kl_estimate(logp, ref, "low_var_kl")
    assert value[0] == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert value[1] == 0.0
    assert value[2] == 10.0 and grad[2] == 0.0, "clamped at 10 like verl"
    assert kl_estimate(logp, ref, "k1")[0][0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not supported"):
        kl_estimate(logp, ref, "full")


def test_sampling_stops_at_eos_and_nan_weights_give_garbage() -> None:
    params = initial_params(num_prompts=2, max_len=6)
    params["shared"][:, EOS] = -50.0
    params["shared"][2, EOS] = 50.0
    rollout = sample(params, np.array([0, 1]), 1.0, np.random.default_rng(0))
    assert rollout.lengths.tolist() == [3, 3]
    assert rollout.mask.sum(axis=1).tolist() == [3, 3]
    params["shared"][:, 0] = np.nan
    broken = sample(params, np.array([0, 1]), 1.0, np.random.default_rng(0))
    assert (broken.tokens == 0).all() and broken.lengths.tolist() == [6, 6]
    assert np.isnan(token_stats(params, np.array([0]), broken.tokens[:1], 1.0)[1]).all()


def test_initial_policy_does_not_depend_on_the_seed() -> None:
    a, b = initial_params(4, 8), initial_params(4, 8)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["shared"].shape == (8, VOCAB_SIZE)


def test_task_scoring_and_dapo_shaping() -> None:
    prompt = next(p for p in build_dataset() if len(p.code) == 3)
    tokens = np.array([*prompt.target, 0, 0])
    assert compute_score(tokens, 4, prompt) == 1.0
    assert compute_score(tokens, 3, prompt) == 0.75, "the code without its EOS"
    wrong = tokens.copy()
    wrong[1] = (wrong[1] + 1) % EOS
    assert compute_score(wrong, 4, prompt) == 0.25
    buffer = OverlongBuffer(length=4, penalty_factor=1.0, max_resp_len=16)
    assert dapo_reward(1.0, 14, buffer) == pytest.approx(0.5), "2 tokens into the 4-token buffer"
    assert dapo_reward(1.0, 5, buffer) == 1.0
    slipped = OverlongBuffer(length=4, penalty_factor=-1.0, max_resp_len=16)
    assert dapo_reward(1.0, 4, slipped) == pytest.approx(-1.0), "a negative factor penalises short answers"


def test_adamw_matches_torch_formula() -> None:
    params = {"w": np.array([1.0, -2.0])}
    opt = AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01)
    lr = 1e-4 * LR_GAIN
    w = np.array([1.0, -2.0])
    m = np.zeros(2)
    v = np.zeros(2)
    for t, g in enumerate([np.array([0.5, -0.1]), np.array([0.2, 0.3])], start=1):
        opt.step({"w": g.copy()})
        w = w * (1 - lr * 0.01)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w = w - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        assert params["w"] == pytest.approx(w, rel=1e-12)
    restored = AdamW({"w": params["w"].copy()}, lr=5.0, betas=(0.5, 0.5), weight_decay=0.0)
    restored.load_state_dict(opt.state_dict())
    assert restored.group == opt.group and restored.step_count == 2, "hyper-parameters come back with the state"


def test_constant_warmup_schedule_and_state() -> None:
    opt = AdamW({"w": np.zeros(1)}, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
    schedule = ConstantWarmup(opt, warmup_steps=3)
    assert opt.group.lr == 0.0, "LambdaLR applies lambda(0) at construction"
    assert [schedule.step() for _ in range(4)] == pytest.approx([1e-5 / 3, 2e-5 / 3, 1e-5, 1e-5])
    fresh = ConstantWarmup(AdamW({"w": np.zeros(1)}, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0), 0)
    fresh.load_state_dict(schedule.state_dict())
    assert fresh.step() == pytest.approx(1e-5), "base_lrs come from the checkpoint"


def test_clip_grad_norm() -> None:
    grads = {"a": np.array([3.0]), "b": np.array([4.0])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    assert math.hypot(grads["a"][0], grads["b"][0]) == pytest.approx(1.0, rel=1e-5)
    small = {"a": np.array([0.3])}
    assert clip_grad_norm(small, 1.0) == pytest.approx(0.3) and small["a"][0] == 0.3
    broken = {"a": np.array([np.nan])}
    assert math.isnan(clip_grad_norm(broken, 1.0))
