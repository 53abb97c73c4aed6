"""Step metrics with verl 0.9.1's keys, order and meaning (``metric_utils.compute_data_metrics``).

Values are Python floats/ints; validation and ``num_turns`` metrics are numpy scalars, as in verl. V1 pads to the
batch maximum, so ``response_length/clip_ratio`` is the share as long as the longest response, not the truncated
share (facts gotcha 7).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from guardian.demo.policy import Array, IntArray
from guardian.demo.task import DATA_SOURCE


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What one training step sampled and scored, per sequence (and per token for the mask)."""

    prompt_ids: IntArray
    tokens: IntArray
    mask: Array
    lengths: IntArray
    prompt_lengths: IntArray
    scores: Array  # token_level_scores summed: the reward-function score (incl. DAPO shaping)
    advantages: Array  # per sequence
    uids: list[str]
    outputs: list[str]


def _stats(prefix: str, values: NDArray[np.float64]) -> dict[str, float]:
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def log_ppl(old_logp: Array, mask: Array) -> dict[str, float]:
    """``rollout_corr/training_ppl`` and ``training_log_ppl``: per-sequence mean -log pi_old, batch mean."""
    with np.errstate(invalid="ignore", over="ignore"):
        per_seq = -(old_logp * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
        return {
            "rollout_corr/training_ppl": float(np.exp(per_seq).mean()),
            "rollout_corr/training_log_ppl": float(per_seq.mean()),
        }


def data_metrics(batch: StepBatch) -> dict[str, float | int]:
    """``critic/*``, ``response_length/*``, ``prompt_length/*`` as ``compute_data_metrics`` computes them."""
    valid = batch.mask.astype(bool)
    token_adv = np.broadcast_to(batch.advantages[:, None], batch.mask.shape)[valid]
    lengths = batch.lengths.astype(np.float64)
    prompts = batch.prompt_lengths.astype(np.float64)
    out: dict[str, float | int] = {}
    out.update(_stats("critic/score", batch.scores))
    out.update(_stats("critic/rewards", batch.scores))
    out.update(_stats("critic/advantages", token_adv))
    out.update(_stats("critic/returns", token_adv))
    for prefix in ("response_length", "response_length_non_aborted"):
        out.update(_stats(prefix, lengths))
        out[f"{prefix}/clip_ratio"] = float(np.mean(lengths == lengths.max()))
    out["response/aborted_ratio"] = float(np.mean(lengths == 0))
    out.update(_stats("prompt_length", prompts))
    out["prompt_length/clip_ratio"] = float(np.mean(prompts == prompts.max()))
    return out


def num_turns(size: int) -> dict[str, object]:
    """Single-turn agent loop: two turns per sample, logged as numpy ints like verl's."""
    turns = np.full(size, 2, dtype=np.int32)
    return {"num_turns/min": turns.min(), "num_turns/max": turns.max(), "num_turns/mean": turns.mean()}


@contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """verl's ``marked_timer``: seconds per stage, accumulated within a step."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def timing_metrics(timing: dict[str, float], batch: StepBatch) -> dict[str, float | int]:
    """``timing_s/*``, ``timing_per_token_ms/*`` and ``perf/*`` (one device: throughput = tokens / time)."""
    response_tokens = int(batch.lengths.sum())
    total_tokens = response_tokens + int(batch.prompt_lengths.sum())
    out: dict[str, float | int] = {f"timing_s/{name}": value for name, value in timing.items()}
    for name in ("update_actor", "gen", "adv"):
        if name in timing:
            tokens = response_tokens if name == "gen" else total_tokens
            out[f"timing_per_token_ms/{name}"] = timing[name] * 1000 / max(tokens, 1)
    out["perf/total_num_tokens"] = total_tokens
    out["perf/time_per_step"] = timing["step"]
    out["perf/throughput"] = total_tokens / max(timing["step"], 1e-9)
    return out


def validation_metrics(rewards: Array, accuracy: Array) -> dict[str, object]:
    """``val-core``/``val-aux`` keys for a float reward function (``acc`` is the core variable), n=1."""
    turns = np.full(rewards.size, 2, dtype=np.int64)
    return {
        f"val-aux/{DATA_SOURCE}/reward/mean@1": np.float64(rewards.mean()),
        f"val-core/{DATA_SOURCE}/acc/mean@1": np.float64(accuracy.mean()),
        f"val-aux/{DATA_SOURCE}/acc_success_only/mean@1": np.float64(accuracy.mean()),
        "val-aux/num_turns/min": turns.min(),
        "val-aux/num_turns/max": turns.max(),
        "val-aux/num_turns/mean": np.float64(turns.mean()),
    }
