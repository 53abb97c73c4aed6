"""The generate contract of the ``hf`` rollout for verl 0.9.1: Hugging Face ``generate()`` with processed log-probs.

verl's agent loop calls a rollout server's ``generate(request_id, prompt_ids, sampling_params, …)`` and expects a
``TokenOutput(token_ids, log_probs, stop_reason)`` (``verl/workers/rollout/replica.py:39``). This module is the part
of that server that needs no verl and no Ray: translating verl's sampling parameters (built in
``verl/experimental/agent_loop/agent_loop.py:590``: temperature, top_p, top_k, repetition_penalty, logprobs) to
``generate()`` keyword arguments, and returning each sampled token with the log-probability of the distribution it
was actually drawn from (log-softmax of the warped scores), EOS included. Like vLLM, it honours ``stop`` strings
(the multi-turn agent loop stops a turn at ``</search>``) and a ``max_tokens`` of each request's own.

The trap it closes: verl's "no top-k" is ``top_k=-1``; HF's is ``top_k=0``. Passing nothing (or -1 filtered out)
leaves HF's default ``top_k=50``, which silently truncates the sampling distribution and makes the rollout
off-policy against the trainer's full-softmax log-probs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class SamplingError(ValueError):
    """verl sampling parameters this rollout cannot honour; the message names the parameter and value."""


@dataclass(frozen=True)
class Generated:
    token_ids: list[int]
    """response tokens, EOS included when generation stopped on it"""
    log_probs: list[float]
    """per token: log-softmax of the processed (temperature/top-k/top-p warped) scores it was sampled from"""
    stop_reason: str
    """'completed' (EOS or a stop string, which the tokens then end with) or 'length' (max_new_tokens reached)"""


class _StopRecorder:
    """A stopping criterion around HF's stop-string one that remembers, per row, how many tokens it had generated
    when a stop string first appeared (HF pads a finished row from then on)."""

    def __init__(self, inner: Any, prompt_width: int) -> None:
        self.inner = inner
        self.prompt_width = prompt_width
        self.stopped_at: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        done: torch.Tensor = self.inner(input_ids, scores, **kwargs)
        for row in done.nonzero().flatten().tolist():
            self.stopped_at.setdefault(int(row), input_ids.shape[1] - self.prompt_width)
        return done


def hf_sampling_kwargs(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """``generate()`` keyword arguments for verl's ``sampling_params``."""
    temperature = float(sampling_params.get("temperature", 1.0))
    top_p = float(sampling_params.get("top_p", 1.0))
    top_k = int(sampling_params.get("top_k", -1))
    repetition_penalty = float(sampling_params.get("repetition_penalty", 1.0))
    if temperature < 0:
        raise SamplingError(f"sampling_params.temperature={temperature}: must be >= 0")
    if not 0 < top_p <= 1:
        raise SamplingError(f"sampling_params.top_p={top_p}: must be in (0, 1]")
    if top_k < -1:
        raise SamplingError(f"sampling_params.top_k={top_k}: must be -1 (off), 0 (off) or positive")
    if repetition_penalty != 1.0:
        # a repetition penalty changes the sampling distribution per sequence; the trainer does not model it
        raise SamplingError(f"sampling_params.repetition_penalty={repetition_penalty}: only 1.0 is supported")
    if temperature == 0:
        return {"do_sample": False, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": max(top_k, 0)}


@torch.no_grad()
def generate_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    sampling_params: Mapping[str, Any],
    *,
    max_new_tokens: int | Sequence[int],
    eos_token_id: int,
    pad_token_id: int,
    stop: Sequence[str] = (),
    tokenizer: Any = None,
) -> list[Generated]:
    """Sample one response per prompt in one ``generate()`` call (prompts left-padded; one set of parameters).

    Each row's log-probs come from its own row of the warped scores; tokens after a row's end are padding and are
    cut off, so a row's result is what ``generate`` of that prompt alone would have drawn from the same scores.
    ``max_new_tokens`` is one budget for all rows or one per row (the call runs to the largest, each row is cut to
    its own). A row ends at EOS, at the first of the ``stop`` strings (which needs the ``tokenizer``), or at its
    budget."""
    if not prompts or any(not p for p in prompts):
        raise ValueError("generate: a prompt is empty")
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts) or min(budgets) < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1, one per prompt")
    if stop and tokenizer is None:
        raise ValueError("generate: stop strings need the tokenizer")
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
    attention = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        attention[row, width - len(prompt) :] = 1
    recorder = None
    extra: dict[str, Any] = {}
    if stop:
        from transformers import StoppingCriteriaList, StopStringCriteria

        recorder = _StopRecorder(StopStringCriteria(tokenizer=tokenizer, stop_strings=list(stop)), width)
        extra["stopping_criteria"] = StoppingCriteriaList([recorder])
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=max(budgets),
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
        **hf_sampling_kwargs(sampling_params),
        **extra,
    )
    sampled = output.sequences[:, width:]
    log_probs = torch.stack([torch.log_softmax(step.float(), dim=-1) for step in output.scores], dim=1)
    chosen = log_probs.gather(-1, sampled[:, : log_probs.shape[1]].unsqueeze(-1)).squeeze(-1).cpu().tolist()
    results = []
    for row, tokens in enumerate(sampled.cpu().tolist()):
        budget = budgets[row]
        stopped = recorder.stopped_at.get(row) if recorder is not None else None
        if stopped is not None and stopped <= budget:
            tokens, budget = tokens[:stopped], stopped
        response = [int(token) for token in tokens[:budget]]
        if eos_token_id in response:
            response = response[: response.index(eos_token_id) + 1]
        ended = bool(response) and (response[-1] == eos_token_id or len(response) == stopped)
        results.append(Generated(response, chosen[row][: len(response)], "completed" if ended else "length"))
    return results


def generate(
    model: Any,
    prompt_ids: Sequence[int],
    sampling_params: Mapping[str, Any],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    generator_seed: int | None = None,
) -> Generated:
    """Sample one response to ``prompt_ids`` with ``model`` (a transformers causal LM)."""
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    (result,) = generate_batch(
        model,
        [prompt_ids],
        sampling_params,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    return result
