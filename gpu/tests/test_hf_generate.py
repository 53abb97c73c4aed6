"""The generate contract on the real tiny model: log-probs agree with a forward pass; verl's top_k=-1 is honoured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gpu.hf_generate import SamplingError, generate, hf_sampling_kwargs

PROMPT = "user:copy 4\nassistant:"


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_root: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(tiny_root / "model", attn_implementation="sdpa").eval()
    return model, AutoTokenizer.from_pretrained(tiny_root / "model")


def forward_log_probs(model: Any, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """What the trainer computes: log-softmax(logits / T) of the full vocabulary at each response position."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    log_probs = torch.log_softmax(logits[positions] / temperature, dim=-1)
    return log_probs[torch.arange(len(response)), torch.tensor(response)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_full_distribution_log_probs_match_the_forward_pass(
    model_and_tokenizer: tuple[Any, Any], temperature: float
) -> None:
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode(PROMPT)
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    for seed in range(8):
        out = generate(
            model, prompt, params, max_new_tokens=16, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, generator_seed=seed,
        )  # fmt: skip
        assert len(out.token_ids) == len(out.log_probs) >= 1
        expected = forward_log_probs(model, prompt, out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-4, rtol=1e-4)
        if out.stop_reason == "completed":
            assert out.token_ids[-1] == tokenizer.eos_token_id
        else:
            assert out.stop_reason == "length" and len(out.token_ids) == 16


def test_hf_default_top_k_would_be_off_policy(model_and_tokenizer: tuple[Any, Any]) -> None:
    """The same sampling under HF's default top_k=50 gives log-probs that no longer match the trainer's."""
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode(PROMPT)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}
    gaps = []
    for seed in range(4):
        out = generate(
            model, prompt, params, max_new_tokens=16, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, generator_seed=seed,
        )  # fmt: skip
        expected = forward_log_probs(model, prompt, out.token_ids, 1.0)
        gaps.append(float((torch.tensor(out.log_probs) - expected).min()))
    # renormalising over 50 of 64 tokens raises every sampled token's log-prob
    assert min(gaps) > 1e-3


def test_greedy_is_the_argmax_of_the_forward_pass(model_and_tokenizer: tuple[Any, Any]) -> None:
    model, tokenizer = model_and_tokenizer
    prompt = tokenizer.encode(PROMPT)
    out = generate(
        model, prompt, {"temperature": 0.0, "top_k": -1}, max_new_tokens=8,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0]
    greedy = logits[len(prompt) - 1 : len(prompt) + len(out.token_ids) - 1].argmax(-1).tolist()
    assert out.token_ids == greedy


def test_sampling_kwargs_map_verl_conventions() -> None:
    assert hf_sampling_kwargs({"temperature": 1.0, "top_p": 1.0, "top_k": -1})["top_k"] == 0
    assert hf_sampling_kwargs({})["top_k"] == 0
    assert hf_sampling_kwargs({"top_k": 5})["top_k"] == 5
    assert hf_sampling_kwargs({"temperature": 0})["do_sample"] is False
    for bad, name in (({"top_k": -2}, "top_k"), ({"top_p": 0}, "top_p"), ({"repetition_penalty": 1.1}, "repetition")):
        with pytest.raises(SamplingError, match=name):
            hf_sampling_kwargs(bad)


def test_a_batch_of_prompts_of_different_lengths_matches_the_forward_pass_row_by_row(
    model_and_tokenizer: tuple[Any, Any],
) -> None:
    """Left padding changes nothing a row draws or reports: each row's log-probs are its own forward pass's."""
    from gpu.hf_generate import generate_batch

    model, tokenizer = model_and_tokenizer
    prompts = [tokenizer.encode(p) for p in (PROMPT, "user:copy 12\nassistant:", "user:x\nassistant:")]
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    torch.manual_seed(3)
    results = generate_batch(
        model,
        prompts,
        params,
        max_new_tokens=12,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    assert len(results) == 3
    for prompt, out in zip(prompts, results, strict=True):
        assert out.token_ids and len(out.log_probs) == len(out.token_ids)
        expected = forward_log_probs(model, prompt, out.token_ids, 1.0)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)
        if out.stop_reason == "completed":
            assert out.token_ids[-1] == tokenizer.eos_token_id
            assert tokenizer.eos_token_id not in out.token_ids[:-1]


def test_each_row_keeps_its_own_budget_and_ends_at_the_first_stop_string(
    model_and_tokenizer: tuple[Any, Any],
) -> None:
    """The multi-turn agent loop sends turns with different budgets left and ``stop=["</search>", …]``: one
    batched call serves them all, each row cut to its own budget or just after its first stop string."""
    from gpu.hf_generate import generate_batch

    model, tokenizer = model_and_tokenizer
    prompts = [tokenizer.encode(p) for p in (PROMPT, "user:copy 12\nassistant:", "user:x\nassistant:")] * 4
    budgets = [3, 9, 40] * 4
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    torch.manual_seed(5)
    results = generate_batch(
        model,
        prompts,
        params,
        max_new_tokens=budgets,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        stop=["1", "7"],
        tokenizer=tokenizer,
    )
    endings = set()
    for prompt, budget, out in zip(prompts, budgets, results, strict=True):
        text = tokenizer.decode(out.token_ids)
        assert 0 < len(out.token_ids) <= budget
        assert torch.allclose(
            torch.tensor(out.log_probs), forward_log_probs(model, prompt, out.token_ids, 1.0), atol=1e-4
        )
        body = text[:-1]
        assert "1" not in body and "7" not in body  # nothing past the first stop string
        if out.stop_reason == "length":
            assert len(out.token_ids) == budget and text[-1] not in "17"
            endings.add("budget")
        elif out.token_ids[-1] == tokenizer.eos_token_id:
            endings.add("eos")
        else:
            assert text[-1] in "17"
            endings.add("stop")
    assert {"budget", "stop"} <= endings  # the draw exercised both cuts
    with pytest.raises(ValueError, match="stop strings need the tokenizer"):
        generate_batch(model, prompts[:1], params, max_new_tokens=4, eos_token_id=0, pad_token_id=0, stop=["1"])
