"""Build the tiny random-initialised Qwen2 model, its tokenizer and the copy-digit task in verl's parquet format.

    python -m gpu.tiny --out gpu/.tiny

writes ``model/`` (config, weights, tokenizer, generation config), ``data/train.parquet`` and ``data/test.parquet``,
and ``tiny_reward.py`` (the rule reward). Deterministic for a given seed. Needs torch, transformers, tokenizers,
pyarrow (the ``.venv-gpu`` of gpu/README.md).

The tokenizer has one token per character; its chat template renders ``user:copy 7\\nassistant:``, the prompt shape
of the real verl 0.9.1 runs (``verl-0.9.1-run/rollouts``).
"""

from __future__ import annotations

import argparse
import shutil
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "tiny_copy"
PAD, EOS = "<pad>", "<eos>"
CHARACTERS = string.ascii_lowercase + string.digits + " \n:"
VOCAB_SIZE = 64
"""Model vocabulary: the characters and the two special tokens, padded to a multiple of 32."""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}:{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass(frozen=True)
class TinyPaths:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def train(self) -> Path:
        return self.root / "data" / "train.parquet"

    @property
    def test(self) -> Path:
        return self.root / "data" / "test.parquet"

    @property
    def reward(self) -> Path:
        return self.root / "tiny_reward.py"


def vocabulary() -> dict[str, int]:
    tokens = [PAD, EOS, *CHARACTERS]
    if len(tokens) > VOCAB_SIZE:
        raise ValueError(f"gpu.tiny: {len(tokens)} tokens do not fit VOCAB_SIZE={VOCAB_SIZE}")
    return {token: index for index, token in enumerate(tokens)}


def byte_level_char(ch: str) -> str:
    """The byte-level symbol of one ASCII character (GPT-2's ``bytes_to_unicode``)."""
    code = ord(ch)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if code in printable:
        return ch
    others = [b for b in range(256) if b not in printable]
    return chr(256 + others.index(code))


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer without merges: every character of CHARACTERS is one token.

    Byte-level on purpose: transformers 5 loads any ``model_type=qwen2`` tokenizer as ``Qwen2Tokenizer``, which
    re-applies Qwen2's byte-level pre-tokenizer to the saved vocabulary; a vocabulary in byte-level symbols gives the
    same one-token-per-character ids under that class and under a plain tokenizers load.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {byte_level_char(t) if len(t) == 1 else t: i for t, i in vocabulary().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([PAD, EOS])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, chat_template=CHAT_TEMPLATE, padding_side="left"
    )
    tokenizer.save_pretrained(out)


def build_model(out: Path, seed: int) -> int:
    """A 2-layer Qwen2 with hidden size 128, random weights from ``seed``; returns the parameter count."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = vocabulary()
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=vocab[PAD],
        eos_token_id=vocab[EOS],
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        pad_token_id=vocab[PAD], eos_token_id=vocab[EOS], do_sample=True, top_k=0, top_p=1.0, temperature=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def task_rows(split: str, repeats: int) -> list[dict[str, object]]:
    """verl's RL parquet rows: data_source, prompt (chat messages), ability, reward_model, extra_info."""
    rows: list[dict[str, object]] = []
    for index in range(repeats * 10):
        digit = str(index % 10)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"copy {digit}"}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_parquet(rows: Sequence[dict[str, object]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)


def build(root: Path, *, seed: int = 0, train_repeats: int = 32, test_repeats: int = 4) -> TinyPaths:
    """Write the model, tokenizer, data and reward under ``root`` (replacing an earlier build there)."""
    paths = TinyPaths(root)
    if paths.model.exists():
        shutil.rmtree(paths.model)
    build_tokenizer(paths.model)
    build_model(paths.model, seed)
    write_parquet(task_rows("train", train_repeats), paths.train)
    write_parquet(task_rows("test", test_repeats), paths.test)
    shutil.copyfile(Path(__file__).with_name("tiny_reward.py"), paths.reward)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / ".tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = build(args.out, seed=args.seed)
    print(f"gpu.tiny: model {paths.model}, data {paths.train.parent}, reward {paths.reward}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
