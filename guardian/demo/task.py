"""The demo's verifiable toy task: recall a short code, with partial credit, of varied difficulty.

48 fixed prompts ask for a 1-, 3- or 6-letter code, found only by exploration; the score is the matching prefix of
``code + EOS`` over ``len(code) + 1``. A policy that stops exploring makes a group's samples alike, so EGR falls
while the reward stalls short of 1. ``dapo_reward`` is verl's DAPO overlong shaping, sign included.
Why: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

ALPHABET = "abcdef"
EOS = len(ALPHABET)
VOCAB_SIZE = EOS + 1
DATA_SOURCE = "demo_recall"
DATASET_SEED = 20261130
# (code length, number of prompts)
DIFFICULTY_MIX: tuple[tuple[int, int], ...] = ((1, 16), (3, 16), (6, 16))
LETTER_DECAY = 0.8
LETTER_WEIGHTS = LETTER_DECAY ** np.arange(len(ALPHABET), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One dataset row: its index, the prompt text, the code (ground truth) and its token ids."""

    index: int
    text: str
    code: str
    target: tuple[int, ...]  # code token ids followed by EOS


def build_dataset() -> list[Prompt]:
    """The fixed training set, rows shuffled so that difficulties are interleaved."""
    rng = np.random.default_rng(DATASET_SEED)
    rows: list[tuple[int, str]] = []
    for length, count in DIFFICULTY_MIX:
        for _ in range(count):
            letters = rng.choice(len(ALPHABET), size=length, p=LETTER_WEIGHTS / LETTER_WEIGHTS.sum())
            rows.append((length, "".join(ALPHABET[int(i)] for i in letters)))
    order = rng.permutation(len(rows))
    dataset = []
    for index, row in enumerate(int(i) for i in order):
        length, code = rows[row]
        text = f"user:recall the {length}-letter code of item {index:02d}\nassistant:"
        dataset.append(Prompt(index, text, code, (*(ALPHABET.index(c) for c in code), EOS)))
    return dataset


_TEXT = np.array([*ALPHABET, ""])


def decode(tokens: NDArray[np.int64], length: int) -> str:
    """The response text, special tokens skipped (as verl decodes with ``skip_special_tokens``)."""
    return "".join(_TEXT[tokens[:length]].tolist())


def compute_score(tokens: NDArray[np.int64], length: int, prompt: Prompt) -> float:
    """Leading tokens that match ``code + EOS``, as a fraction of ``len(code) + 1``."""
    matched = 0
    for position, want in enumerate(prompt.target):
        if position >= length or int(tokens[position]) != want:
            break
        matched += 1
    return matched / len(prompt.target)


RewardFunction = Callable[..., object]


def load_reward_function(path: str, name: str) -> RewardFunction:
    """verl's ``get_custom_reward_fn``: load ``name`` from the Python file at ``path``."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Reward function file '{path}' not found.")
    spec = importlib.util.spec_from_file_location("custom_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise AttributeError(f"Reward function '{name}' not found in '{path}'.")
    function: RewardFunction = getattr(module, name)
    print(f"using customized reward function '{name}' from '{path}'", flush=True)
    return function


def custom_score(function: RewardFunction, solution_str: str, prompt: Prompt) -> float:
    """Call a verl-style reward function; a dict result must carry ``"score"``."""
    result = function(
        data_source=DATA_SOURCE, solution_str=solution_str, ground_truth=prompt.code, extra_info={"index": prompt.index}
    )
    value = result["score"] if isinstance(result, dict) else result
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"reward function returned {result!r}; expected a number or a dict with 'score'")
    return float(value)


@dataclass(frozen=True, slots=True)
class OverlongBuffer:
    """``reward.reward_kwargs.overlong_buffer_cfg`` and ``reward.reward_kwargs.max_resp_len`` (DAPO)."""

    length: int
    penalty_factor: float
    max_resp_len: int


def dapo_reward(score: float, valid_length: int, buffer: OverlongBuffer | None) -> float:
    """verl's DAPO shaping: ``score + min(-(len - (max_resp_len - buf)) / buf * factor, 0)``.

    Meant to penalise responses that run into the last ``buf`` tokens before the cap. With a negative
    ``penalty_factor`` the ``min(..., 0)`` flips the meaning: every response *shorter* than
    ``max_resp_len - buf`` is penalised in proportion to how short it is.
    """
    if buffer is None:
        return score
    expected = buffer.max_resp_len - buffer.length
    exceed = valid_length - expected
    return score + min(-exceed / buffer.length * buffer.penalty_factor, 0.0)


def score_batch(
    rows: list[Prompt],
    tokens: NDArray[np.int64],
    lengths: NDArray[np.int64],
    overlong: OverlongBuffer | None,
    reward_fn: RewardFunction | None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(reward incl. DAPO shaping, raw score) per response; a custom reward function sees the text."""
    if reward_fn is None:
        raw = [compute_score(tokens[i], int(lengths[i]), row) for i, row in enumerate(rows)]
    else:
        raw = [custom_score(reward_fn, decode(tokens[i], int(lengths[i])), row) for i, row in enumerate(rows)]
    rewards = [dapo_reward(r, int(n), overlong) for r, n in zip(raw, lengths, strict=True)]
    return np.array(rewards, dtype=np.float64), np.array(raw, dtype=np.float64)


class PromptLoader:
    """verl's train dataloader: a fresh random permutation per epoch, ``drop_last``, resumable.

    ``state_dict`` holds the epoch's permutation, the position in it and the generator state, like a
    ``StatefulDataLoader`` over a seeded ``RandomSampler``; verl saves it as ``global_step_N/data.pt``.
    """

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size = size
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.order = np.zeros(0, dtype=np.int64)
        self.position = 0

    @property
    def steps_per_epoch(self) -> int:
        return self.size // self.batch_size

    def next_batch(self) -> NDArray[np.int64]:
        if self.position + self.batch_size > self.order.size:
            self.order = self.rng.permutation(self.size).astype(np.int64)
            self.position = 0
        batch = self.order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, NDArray[np.int64]]:
        state = json.dumps(self.rng.bit_generator.state)
        return {
            "order": self.order,
            "position": np.array(self.position, dtype=np.int64),
            "rng": np.frombuffer(state.encode(), dtype=np.uint8).astype(np.int64),
        }

    def load_state_dict(self, state: dict[str, NDArray[np.int64]]) -> None:
        self.order = np.array(state["order"], dtype=np.int64)
        self.position = int(state["position"])
        self.rng.bit_generator.state = json.loads(bytes(state["rng"].astype(np.uint8)).decode())
