"""The tiny model, tokenizer, task and reward load and behave as verl's run of them needs."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
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
