"""The demo's policy and verl's GRPO actor loss, in numpy with analytic gradients.

The policy is a factorised softmax over 7 tokens per position (``logits[p, t] = shared[t] + table[p, t]``), so a
response is sampled at every position at once and cut after its first EOS. The loss is verl 0.9.1's vanilla PPO
actor loss (dual clip, entropy bonus, KL loss, ``token-mean``) at the rollout temperature.
Why: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from guardian.demo.task import EOS, VOCAB_SIZE

Array = NDArray[np.float64]
IntArray = NDArray[np.int64]

# verl's GRPO epsilon (core_algos.compute_grpo_outcome_advantage) and KL clamps (core_algos.kl_penalty).
GRPO_EPS = 1e-6
KL_LOGRATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0
# the starting policy's EOS logit: -1.5 at the first position, +1 nat per position, at most 2.5
EOS_PRIOR_START = -1.5
EOS_PRIOR_CAP = 2.5


def initial_params(num_prompts: int, max_len: int) -> dict[str, Array]:
    """The "pretrained" starting point: no knowledge of the answers, a habit of stopping early.

    The EOS logit starts low and rises by one nat per position up to a cap (letters sit at 0), so a
    fresh policy writes about 3 letters and stops, yet nothing forbids longer answers. It does not
    depend on the seed: like verl's ``model.path``, the starting weights are fixed, and they are also
    the frozen reference of the KL loss.
    """
    shared = np.zeros((max_len, VOCAB_SIZE))
    shared[:, EOS] = np.minimum(EOS_PRIOR_START + np.arange(max_len, dtype=np.float64), EOS_PRIOR_CAP)
    return {"shared": shared, "table": np.zeros((num_prompts, max_len, VOCAB_SIZE))}


def logits(params: dict[str, Array], prompt_ids: IntArray) -> Array:
    """Per-sequence logits ``[N, L, V]`` for the prompts of ``N`` sequences."""
    return params["shared"][None, :, :] + params["table"][prompt_ids]


def log_softmax(z: Array) -> Array:
    shifted = z - z.max(axis=-1, keepdims=True)
    out: Array = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


@dataclass(frozen=True, slots=True)
class Rollout:
    """Sampled responses: tokens ``[N, L]``, the response mask, and lengths (EOS included)."""

    tokens: IntArray
    mask: Array
    lengths: IntArray


def sample(params: dict[str, Array], prompt_ids: IntArray, temperature: float, rng: np.random.Generator) -> Rollout:
    """Sample one response per entry of ``prompt_ids``; a response ends with its first EOS or at L.

    Non-finite weights give non-finite probabilities, every comparison fails and token 0 is chosen at
    every position: the run writes ``aaaa…`` to the length cap, verl's "!!!!" failure.
    """
    z = logits(params, prompt_ids) / temperature
    with np.errstate(invalid="ignore", over="ignore"):
        probs = np.exp(log_softmax(z))
        cumulative = np.cumsum(probs, axis=-1)
        u = rng.random(z.shape[:2])
        tokens = (cumulative < u[..., None]).sum(axis=-1).astype(np.int64)
    np.minimum(tokens, VOCAB_SIZE - 1, out=tokens)
    max_len = z.shape[1]
    is_eos = tokens == EOS
    first_eos = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), max_len - 1)
    lengths = (first_eos + 1).astype(np.int64)
    mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.float64)
    return Rollout(tokens=tokens, mask=mask, lengths=lengths)


def greedy(params: dict[str, Array], prompt_ids: IntArray) -> tuple[IntArray, IntArray]:
    """Greedy responses (verl validation: temperature 0) and their lengths, EOS included."""
    tokens = np.argmax(logits(params, prompt_ids), axis=-1).astype(np.int64)
    is_eos = tokens == EOS
    lengths = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, tokens.shape[1]).astype(np.int64)
    return tokens, lengths


def token_stats(
    params: dict[str, Array], prompt_ids: IntArray, tokens: IntArray, temperature: float
) -> tuple[Array, Array, Array]:
    """Log-prob of each sampled token ``[N, L]``, the entropy at each position, and the probabilities."""
    with np.errstate(invalid="ignore", over="ignore"):
        logq = log_softmax(logits(params, prompt_ids) / temperature)
        q = np.exp(logq)
        logp = np.take_along_axis(logq, tokens[..., None], axis=-1)[..., 0]
        entropy = -(q * logq).sum(axis=-1)
    return logp, entropy, q


def masked_mean(values: Array, mask: Array) -> float:
    total = float(mask.sum())
    return float((values * mask).sum() / total) if total > 0 else float("nan")


def grpo_advantages(scores: Array, group_ids: IntArray, norm_by_std: bool) -> Array:
    """verl's GRPO outcome advantage per sequence: ``(s - mean) / (std + 1e-6)`` within each group.

    ``std`` is Bessel-corrected (``torch.std``); a one-sample group gets mean 0 and std 1, as in verl.
    """
    _, inverse, counts = np.unique(group_ids, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=scores)
    mean = np.where(counts > 1, sums / counts, 0.0)
    centred = scores - mean[inverse]
    squares = np.bincount(inverse, weights=centred * centred)
    std = np.where(counts > 1, np.sqrt(squares / np.maximum(counts - 1, 1)), 1.0)
    if not norm_by_std:
        return centred
    advantages: Array = centred / (std[inverse] + GRPO_EPS)
    return advantages


@dataclass(frozen=True, slots=True)
class LossConfig:
    """The actor-loss settings, with verl's key names in ``actor_rollout_ref.actor``."""

    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    temperature: float


@dataclass(frozen=True, slots=True)
class MiniBatch:
    """The rows of one PPO mini-batch: what was sampled and what the old/reference policies said."""

    prompt_ids: IntArray
    tokens: IntArray
    mask: Array
    advantages: Array  # per sequence
    old_logp: Array
    ref_logp: Array | None


def kl_estimate(logp: Array, ref_logp: Array, kind: str) -> tuple[Array, Array]:
    """verl's ``kl_penalty`` value per token and its derivative with respect to ``logp``."""
    diff = logp - ref_logp
    if kind in ("kl", "k1"):
        return diff, np.ones_like(diff)
    if kind == "abs":
        return np.abs(diff), np.sign(diff)
    if kind in ("mse", "k2"):
        return 0.5 * diff**2, diff
    if kind in ("low_var_kl", "k3"):
        log_ratio = -diff  # ref - logp
        inside = np.abs(log_ratio) <= KL_LOGRATIO_CLAMP
        log_ratio = np.clip(log_ratio, -KL_LOGRATIO_CLAMP, KL_LOGRATIO_CLAMP)
        value = np.exp(log_ratio) - log_ratio - 1.0
        grad = np.where(inside, 1.0 - np.exp(log_ratio), 0.0)
        grad = np.where(np.abs(value) <= KL_VALUE_CLAMP, grad, 0.0)
        return np.clip(value, -KL_VALUE_CLAMP, KL_VALUE_CLAMP), grad
    raise ValueError(f"kl_loss_type {kind!r} is not supported by the demo (use low_var_kl, k1, k2 or abs)")


def actor_loss(
    params: dict[str, Array], batch: MiniBatch, cfg: LossConfig
) -> tuple[dict[str, float], dict[str, Array]]:
    """verl's actor loss on one mini-batch: its metrics and the gradient of every parameter."""
    t = cfg.temperature
    logp, entropy, q = token_stats(params, batch.prompt_ids, batch.tokens, t)
    mask = batch.mask
    n_tokens = max(float(mask.sum()), 1.0)
    adv = np.broadcast_to(batch.advantages[:, None], logp.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        neg_kl = np.clip(logp - batch.old_logp, -20.0, 20.0)
        ratio = np.exp(neg_kl)
        loss1 = -adv * ratio
        loss2 = -adv * np.clip(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
        clipped1 = np.maximum(loss1, loss2)
        loss3 = -adv * cfg.clip_ratio_c
        pg_tok = np.where(adv < 0, np.minimum(loss3, clipped1), clipped1)
        # d pg_tok / d logp: -A * ratio where the unclipped branch is the active one, else 0
        active = ~(loss2 > loss1) & ~((adv < 0) & (loss3 < clipped1)) & (np.abs(logp - batch.old_logp) < 20.0)
        coef = np.where(active, -adv * ratio, 0.0)
    metrics = {
        "actor/pg_clipfrac": masked_mean((loss2 > loss1).astype(np.float64), mask),
        "actor/ppo_kl": masked_mean(-neg_kl, mask),
        "actor/pg_clipfrac_lower": masked_mean(((clipped1 > loss3) & (adv < 0)).astype(np.float64), mask),
        "actor/pg_loss": masked_mean(pg_tok, mask),
    }
    loss = metrics["actor/pg_loss"]
    entropy_coef_grad: Array | None = None
    if cfg.entropy_coeff != 0:
        entropy_loss = masked_mean(entropy, mask)
        metrics["actor/entropy_loss"] = entropy_loss
        loss -= cfg.entropy_coeff * entropy_loss
        entropy_coef_grad = entropy
    if cfg.use_kl_loss:
        assert batch.ref_logp is not None, "use_kl_loss needs the reference log-probs"
        kl_value, kl_grad = kl_estimate(logp, batch.ref_logp, cfg.kl_loss_type)
        kl_loss = masked_mean(kl_value, mask)
        metrics["actor/kl_loss"] = kl_loss
        metrics["actor/kl_coef"] = cfg.kl_loss_coef
        loss += cfg.kl_loss_coef * kl_loss
        coef = coef + cfg.kl_loss_coef * kl_grad
    metrics["actor/loss"] = loss

    onehot = np.zeros_like(q)
    np.put_along_axis(onehot, batch.tokens[..., None], 1.0, axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        dz = coef[..., None] * (onehot - q) / t
        if entropy_coef_grad is not None:
            logq = np.log(np.maximum(q, 1e-300))
            dz += cfg.entropy_coeff * q * (logq + entropy_coef_grad[..., None]) / t
        dz *= (mask / n_tokens)[..., None]
    num_prompts = params["table"].shape[0]
    rows = np.zeros((num_prompts, batch.prompt_ids.size))
    rows[batch.prompt_ids, np.arange(batch.prompt_ids.size)] = 1.0
    grads = {
        "shared": dz.sum(axis=0),
        "table": (rows @ dz.reshape(dz.shape[0], -1)).reshape(params["table"].shape),
    }
    return metrics, grads
