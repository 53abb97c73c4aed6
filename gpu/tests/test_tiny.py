"""The tiny model, tokenizer, task and reward load and behave as verl's run of them needs."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gpu import tiny


def load_reward(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("tiny_reward_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_renders_the_prompt_shape_of_the_real_runs_one_token_per_character(tiny_root: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_root / "model")
    messages = [{"role": "user", "content": "copy 9"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "user:copy 9\nassistant:"  # the `input` of verl-0.9.1-run/rollouts/*.jsonl
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    sample = "dh1lusxni m ulst\n76bb\n"  # an `output` of the real rollout dumps
    assert tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample
    assert tokenizer.eos_token_id == tiny.vocabulary()[tiny.EOS]
    assert tokenizer.pad_token_id == tiny.vocabulary()[tiny.PAD]
    assert tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=True) == ""


def test_model_is_a_tiny_qwen2_whose_ids_fit_the_tokenizer(tiny_root: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_root / "model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_root / "model")
    assert model.config.model_type == "qwen2"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
    assert 150_000 < sum(p.numel() for p in model.parameters()) < 250_000
    assert len(tokenizer) <= model.config.vocab_size
    assert model.generation_config.top_k == 0  # a plain generate() samples the full distribution
    ids = torch.tensor([tokenizer.encode("user:copy 3\nassistant:")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_same_seed_same_weights_other_seed_other_weights(tiny_root: Path, tmp_path: Path) -> None:
    def digest(root: Path) -> str:
        return hashlib.sha256((root / "model" / "model.safetensors").read_bytes()).hexdigest()

    assert digest(tiny.build(tmp_path / "again", seed=0).root) == digest(tiny_root)
    assert digest(tiny.build(tmp_path / "other", seed=1).root) != digest(tiny_root)


def test_parquet_rows_are_verl_rl_dataset_rows(tiny_root: Path) -> None:
    train = pq.read_table(tiny_root / "data" / "train.parquet").to_pylist()
    test = pq.read_table(tiny_root / "data" / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (320, 40)
    assert set(train[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for split, rows in (("train", train), ("test", test)):
        for index, row in enumerate(rows):
            digit = row["reward_model"]["ground_truth"]
            assert row["prompt"] == [{"role": "user", "content": f"copy {digit}"}]
            assert row["reward_model"]["style"] == "rule"
            assert row["extra_info"] == {"split": split, "index": index}
            assert row["data_source"] == tiny.DATA_SOURCE
    assert {row["reward_model"]["ground_truth"] for row in train} == set("0123456789")


def test_reward_reproduces_the_scores_of_the_real_rollout_dumps(tiny_root: Path) -> None:
    reward = load_reward(tiny_root / "tiny_reward.py")
    # (output, gts, score) triples from verl-0.9.1-run/rollouts/1.jsonl, scored by verl with the original reward
    for output, truth, score in (
        ("dh1lusxni m ulst", "9", 0.0625),
        ("xviob", "9", 0.0),
        ("vx0s\n76bb\n3ccnnl", "9", 0.1875),
    ):
        assert reward.compute_score(tiny.DATA_SOURCE, output, truth) == score
    assert reward.compute_score(tiny.DATA_SOURCE, "77777777", "7", extra_info={"index": 0}) == 1.0
    assert reward.compute_score(tiny.DATA_SOURCE, "11111111", "7") == 0.5
    assert reward.compute_score(tiny.DATA_SOURCE, "", "7") == 0.0


def test_reward_names_a_malformed_ground_truth(tiny_root: Path) -> None:
    reward = load_reward(tiny_root / "tiny_reward.py")
    try:
        reward.compute_score(tiny.DATA_SOURCE, "1", "12")
    except ValueError as exc:
        assert "'12'" in str(exc) and tiny.DATA_SOURCE in str(exc)
    else:
        raise AssertionError("a two-digit ground truth was accepted")


# --- the search agent's tokenizer and model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.build_search(tmp_path_factory.mktemp("tiny-search")).root


def test_search_tokenizer_has_one_token_per_ascii_character_and_per_protocol_tag(search_root: Path) -> None:
    from recipe import prompt

    tokenizer = AutoTokenizer.from_pretrained(search_root / "model")
    printable = "".join(chr(code) for code in range(32, 127)) + "\n\t"
    ids = tokenizer.encode(printable, add_special_tokens=False)
    assert len(ids) == len(printable) and tokenizer.decode(ids) == printable
    for tag in (prompt.THINK_OPEN, prompt.SEARCH_CLOSE, prompt.RESULT_OPEN, prompt.ANSWER_CLOSE, *tiny.TOOL_CALL_TAGS):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1, tag
    assert set(tiny.protocol_tags()) == {f"<{t}>" for t in ("think", "search", "result", "answer")} | {
        f"</{t}>" for t in ("think", "search", "result", "answer")
    }
    # any text round-trips (non-ASCII as its UTF-8 bytes), and verl's reward decode keeps the tags
    text = "<search>Zürich café</search>\n\n<result>\nDoc 1 (Title: X) y …\n</result>\n\n<answer>B</answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text and tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.convert_ids_to_tokens(ids[0]) == prompt.SEARCH_OPEN


def test_search_tokenizer_is_chatml_with_im_end_as_eos(search_root: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(search_root / "model")
    vocab = tiny.search_vocabulary()
    assert tokenizer.eos_token == tiny.IM_END and tokenizer.eos_token_id == vocab[tiny.IM_END]
    assert tokenizer.pad_token_id == vocab[tiny.SEARCH_PAD]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Question: q"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQuestion: q<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == vocab[tiny.IM_START] and tokenizer.decode(ids) == text
    assert tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=True) == ""
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1  # verl's Qwen builder needs it
    # tools and tool turns render as Qwen2.5's: hermes <tool_call> JSON, results in <tool_response>
    tools = [{"type": "function", "function": {"name": "search"}}]
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}
    turns = [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "r"}]
    rendered = tokenizer.apply_chat_template(turns, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "search"}}\n</tools>' in rendered
    assert (
        '<|im_start|>assistant\n\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
        in rendered
    )
    assert rendered.endswith(
        "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_search_model_is_the_tiny_qwen2_over_the_search_vocabulary(search_root: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(search_root / "model")
    tokenizer = AutoTokenizer.from_pretrained(search_root / "model")
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 128
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == tiny.SEARCH_VOCAB_SIZE
    assert len(tokenizer) <= model.config.vocab_size
    assert model.config.max_position_embeddings == tiny.SEARCH_MAX_POSITIONS
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id and model.generation_config.top_k == 0
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nq<|im_end|>\n<search>", add_special_tokens=False)])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], tiny.SEARCH_VOCAB_SIZE) and torch.isfinite(logits).all()


def test_cli_builds_the_search_model_only(tmp_path: Path) -> None:
    assert tiny.main(["--task", "search", "--out", str(tmp_path / "s"), "--seed", "1"]) == 0
    assert (tmp_path / "s" / "model" / "model.safetensors").is_file()
    assert (tmp_path / "s" / "model" / "tokenizer.json").is_file()
    assert not (tmp_path / "s" / "data").exists()
