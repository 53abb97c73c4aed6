"""Build the tiny random-initialised Qwen2 models and their tokenizers: the copy-digit task, and the search agent.

    python -m gpu.tiny --out gpu/.tiny                              # copy task
    python -m gpu.tiny --task search --out gpu/.tiny/search   # search agent: model only
    python -m gpu.tiny --task search --shape qwen2.5-7b --layers 4 --out /tmp/shape   # Qwen2.5-7B's shape

The copy task writes ``model/`` (config, weights, tokenizer, generation config), ``data/train.parquet`` and
``data/test.parquet``, and ``tiny_reward.py`` (the rule reward). Its tokenizer has one token per character; its chat
template renders ``user:copy 7\\nassistant:``, the prompt shape of the real verl 0.9.1 runs
(``verl-0.9.1-run/rollouts``).

The search task writes ``model/`` only (``python -m recipe.prepare_data`` makes the data, ``recipe/reward.py`` is the
reward): a tokenizer with one token per byte (so every printable ASCII character is one token and any text
round-trips), the protocol tags of ``recipe.prompt`` as single non-special tokens, and Qwen's chat special tokens
``<|im_start|>``/``<|im_end|>`` with a Qwen-like chat template; eos is ``<|im_end|>``. A random model of that vocabulary
writes a tag token with probability about 1/vocab per token, so random rollouts do contain ``<search>q</search>``.

``--shape qwen2.5-7b`` gives the search task a random-initialised model of Qwen2.5-7B's shape instead of the 2-layer
one (``QWEN25_7B``: every dimension of the real config, ``--layers`` of its 28 layers, the real 152064-token
vocabulary of which the byte tokenizer uses the first 269 ids; ids above decode to nothing). Built on the GPU when
there is one, warm-started there in place, saved in bf16.

Deterministic for a given seed. Needs torch, transformers, tokenizers, pyarrow (the ``.venv-gpu`` of gpu/README.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def build_model(
    out: Path,
    seed: int,
    *,
    vocab_size: int = VOCAB_SIZE,
    pad_id: int | None = None,
    eos_id: int | None = None,
    max_positions: int = 256,
) -> int:
    """A 2-layer Qwen2 with hidden size 128, random weights from ``seed``; returns the parameter count. The defaults
    are the copy task's (its vocabulary, pad and eos)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = vocabulary()
    pad = vocab[PAD] if pad_id is None else pad_id
    eos = vocab[EOS] if eos_id is None else eos_id
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        pad_token_id=pad, eos_token_id=eos, do_sample=True, top_k=0, top_p=1.0, temperature=1.0
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


# --- the search agent's tokenizer and model ---------------------------------------------------------------------

SEARCH_PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SEARCH_SPECIALS = (SEARCH_PAD, IM_START, IM_END)
# Qwen2.5's tool-call markers (added, not special, as in Qwen2.5): verl's hermes parser looks for them in the text
TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")
SEARCH_VOCAB_SIZE = 288
"""Search vocabulary: 3 chat specials, the protocol and tool-call tags, 256 bytes, padded to a multiple of 32."""
SEARCH_MAX_POSITIONS = 8192
"""Context of the search model: the system prompt alone is about 800 one-character tokens (RoPE has no weights
tied to it, so a long context costs nothing)."""


def protocol_tags() -> tuple[str, ...]:
    """The search protocol's tags, from recipe.prompt (the one place they are written)."""
    from recipe import prompt

    return (
        prompt.THINK_OPEN,
        prompt.THINK_CLOSE,
        prompt.SEARCH_OPEN,
        prompt.SEARCH_CLOSE,
        prompt.RESULT_OPEN,
        prompt.RESULT_CLOSE,
        prompt.ANSWER_OPEN,
        prompt.ANSWER_CLOSE,
    )


def search_tags() -> tuple[str, ...]:
    """Every added (non-special) token of the search tokenizer: the protocol tags, then the tool-call tags."""
    return (*protocol_tags(), *TOOL_CALL_TAGS)


def search_vocabulary() -> dict[str, int]:
    """Chat specials, tags, then the 256 byte-level symbols in byte order (ids as saved in tokenizer.json)."""
    tokens = [*SEARCH_SPECIALS, *search_tags(), *(byte_level_char(chr(code)) for code in range(256))]
    if len(tokens) > SEARCH_VOCAB_SIZE:
        raise ValueError(f"gpu.tiny: {len(tokens)} tokens do not fit SEARCH_VOCAB_SIZE={SEARCH_VOCAB_SIZE}")
    return {token: index for index, token in enumerate(tokens)}


# transformers renders chat templates with trim_blocks: a newline right after a block tag is dropped, so those are
# written as an expression
NEWLINE = "{{ '\\n' }}"


def _turn(role: str, content: str) -> str:
    return IM_START + role + "\n" + content + IM_END + "\n"


SEARCH_CHAT_TEMPLATE = (
    # the system turn, with Qwen2.5's tool listing when tools are given
    "{% if tools %}" + IM_START + "system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}" + NEWLINE + "{{ tool | tojson }}{% endfor %}" + NEWLINE + "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' + IM_END + "\n"
    "{% elif messages[0]['role'] == 'system' %}" + _turn("system", "{{ messages[0]['content'] }}") + "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'tool' %}"
    + _turn("user", "<tool_response>\n{{ message['content'] }}\n</tool_response>")
    + "{% elif message['role'] == 'assistant' %}"
    + IM_START
    + "assistant\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}" + NEWLINE + "<tool_call>"
    '\n{"name": "{{ call.function.name }}", "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}" + IM_END + "\n"
    "{% else %}" + _turn("{{ message['role'] }}", "{{ message['content'] }}") + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)
"""Qwen2.5's ChatML shape: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, tools listed in the system turn,
tool results as user turns in ``<tool_response>``, assistant tool calls as ``<tool_call>`` JSON, and
``<|im_start|>assistant\\n`` as the generation prompt."""


def build_search_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer without merges over all 256 bytes (one token per ASCII character; other text as
    its UTF-8 bytes, so any string round-trips), the tags as added non-special tokens (``skip_special_tokens`` keeps
    them: verl decodes the response that way for the reward) and the chat specials as special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab=search_vocabulary(), merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SEARCH_SPECIALS])
    core.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in search_tags()])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        pad_token=SEARCH_PAD,
        eos_token=IM_END,
        chat_template=SEARCH_CHAT_TEMPLATE,
        padding_side="left",
    )
    tokenizer.save_pretrained(out)


def build_search(root: Path, *, seed: int = 0) -> TinyPaths:
    """Write the search agent's tiny model and tokenizer to ``root/model`` (replacing an earlier build there)."""
    paths = TinyPaths(root)
    if paths.model.exists():
        shutil.rmtree(paths.model)
    build_search_tokenizer(paths.model)
    vocab = search_vocabulary()
    build_model(
        paths.model,
        seed,
        vocab_size=SEARCH_VOCAB_SIZE,
        pad_id=vocab[SEARCH_PAD],
        eos_id=vocab[IM_END],
        max_positions=SEARCH_MAX_POSITIONS,
    )
    return paths


WARM_START_QUERIES = ("film",)
"""What the warm-started model learns to search: a word frequent in HotpotQA's paragraphs, so that its searches
return passages. A 2-layer model learns neither to copy a title out of the question nor several query strings
exactly in a few hundred steps, and sampled at temperature 1 a misspelt query finds nothing."""

Piece = tuple[str, bool]
"""a stretch of a response and whether it is the model's own (trained) or the environment's (the result block)"""


def warm_start_transcripts(records: Sequence[dict[str, Any]]) -> list[tuple[list[dict[str, str]], list[Piece]]]:
    """(messages, response pieces) per HotpotQA record: think, search one of ``WARM_START_QUERIES``, read the
    record's first supporting paragraph, answer - in the protocol's own formatting (recipe.agent.protocol)."""
    from recipe.agent.protocol import format_observation
    from recipe.prompt import build_messages
    from recipe.search.passage import Passage

    transcripts = []
    for number, record in enumerate(records):
        title = str(record["supporting_facts"][0][0])
        query = WARM_START_QUERIES[number % len(WARM_START_QUERIES)]
        sentences = next((s for t, s in record["context"] if t == title), [])
        observation = format_observation([Passage("0", title, " ".join(sentences).strip(), 1.0)], 3000)
        pieces = [
            (f"<think>I should look this up.</think><search>{query}</search>", True),
            (observation, False),
            (f"<think>The passage answers it.</think><answer>{record['answer']}</answer>", True),
        ]
        transcripts.append((build_messages(str(record["question"])), pieces))
    return transcripts


def warm_start_model(
    model: Any,
    tokenizer: Any,
    records_path: Path,
    *,
    steps: int,
    seed: int = 0,
    lr: float = 3e-3,
    clip: float | None = None,
    bf16: bool = False,
) -> float:
    """Teach a search model (in memory, on its device) the protocol's shape with a short supervised run on
    ``records_path`` (HotpotQA records with contexts): the model's own text is trained, the result block is not (as in
    the RL loss). Its rollouts then search with real words, so the retriever returns passages; what it answers stays
    mostly wrong. ``bf16``: the forward under bf16 autocast on CUDA (the shape model). Returns the last step's loss."""
    import torch

    device = next(model.parameters()).device
    examples = []
    for messages, pieces in warm_start_transcripts(json.loads(records_path.read_text(encoding="utf-8"))):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        ids, trained = list(prompt), [False] * len(prompt)
        for text, learn in pieces:
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            trained += [learn] * len(piece)
        ids.append(tokenizer.eos_token_id)
        trained.append(True)
        examples.append((torch.tensor(ids, device=device), torch.tensor(trained, device=device)))
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda")
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        ids, trained = examples[step % len(examples)]
        with autocast:
            logits = model(ids[None, :-1]).logits[0]
        losses = torch.nn.functional.cross_entropy(logits.float(), ids[1:], reduction="none")
        loss = losses[trained[1:]].mean()
        optimizer.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    model.eval()
    return float(loss.detach())


def warm_start(model_dir: Path, records_path: Path, *, steps: int, seed: int = 0) -> float:
    """``warm_start_model`` on the tiny search model saved in ``model_dir`` (on the GPU when there is one), saved
    back in place. Returns the last step's loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
    loss = warm_start_model(model, tokenizer, records_path, steps=steps, seed=seed)
    model.cpu().save_pretrained(model_dir, safe_serialization=True)
    return loss


# --- the search agent on a model of Qwen2.5-7B's shape ----------------------------------------------------------

QWEN25_7B: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 131072,
    "max_window_layers": 28,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
}
"""Qwen/Qwen2.5-7B-Instruct's config.json, the fields that give the architecture its shape (head_dim 3584 / 28 = 128,
grouped-query attention with 4 KV heads, q/k/v biases: Qwen2's own). Only the token ids differ: the byte tokenizer's."""
SHAPES = {"qwen2.5-7b": QWEN25_7B}
SHAPE_LAYERS = 4
"""Layers kept of the 28: 4 x 233 M per-layer parameters + 2 x 545 M embedding and output layer = 2.02 B parameters
(bf16 4 GB). Every per-layer and per-token cost of the real model (hidden and MLP width, attention heads, the
152064-wide logits that dominate the actor's activation memory and the entropy computation) is the real one; depth
is a quarter and a seventh. The full 7.6 B does not fit the budget: eight hf rollout servers hold a full copy each
and every step sends each one the whole state dict, its warm start needs 122 GB of AdamW state on one GPU, and its
start-up alone would eat most of a 10-minute call."""
SHAPE_WARM_LR = 3e-4
"""AdamW learning rate of the shape model's warm start (the tiny model's 3e-3 is too high for a 3584-wide model)."""


def shape_config(shape: str, layers: int, **overrides: Any) -> Any:
    """The Qwen2Config of ``shape`` with ``layers`` layers and the search tokenizer's pad/eos (``overrides`` shrink
    any field, for a CPU rehearsal of the same code)."""
    from transformers import Qwen2Config

    vocab = search_vocabulary()
    fields = {**SHAPES[shape], "num_hidden_layers": layers, **overrides}
    fields["max_window_layers"] = min(fields["max_window_layers"], layers)
    return Qwen2Config(**fields, pad_token_id=vocab[SEARCH_PAD], eos_token_id=vocab[IM_END], bos_token_id=None)


def build_search_shape(
    root: Path,
    *,
    shape: str = "qwen2.5-7b",
    layers: int = SHAPE_LAYERS,
    seed: int = 0,
    warm_start_records: Path | None = None,
    warm_steps: int = 300,
    warm_lr: float = SHAPE_WARM_LR,
    device: str | None = None,
    **overrides: Any,
) -> tuple[TinyPaths, int, float | None]:
    """Write the search tokenizer and a random ``shape`` model with ``layers`` layers to ``root/model``, warm-started
    in place (on the GPU when there is one) when records are given; saved in bf16. Returns (paths, parameters, the
    warm start's last loss)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    paths = TinyPaths(root)
    if paths.model.exists():
        shutil.rmtree(paths.model)
    build_search_tokenizer(paths.model)
    config = shape_config(shape, layers, **overrides)
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    with where:
        model = Qwen2ForCausalLM(config)
    loss = None
    if warm_start_records is not None:
        tokenizer = AutoTokenizer.from_pretrained(paths.model)
        loss = warm_start_model(
            model, tokenizer, warm_start_records, steps=warm_steps, seed=seed, lr=warm_lr, clip=1.0, bf16=True
        )
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
    )
    count = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).cpu().save_pretrained(paths.model, safe_serialization=True)
    return paths, count, loss


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("copy", "search"), default="copy", help="what to build (default copy)")
    parser.add_argument("--out", type=Path, help="output folder (default gpu/.tiny, or gpu/.tiny/search)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start", type=Path, help="search: HotpotQA records to teach the protocol's shape")
    parser.add_argument("--warm-steps", type=int, default=400, help="search: supervised steps of the warm start")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="search: a model of this real architecture's shape")
    parser.add_argument("--layers", type=int, default=SHAPE_LAYERS, help="--shape: layers kept (default 4)")
    parser.add_argument("--warm-lr", type=float, default=SHAPE_WARM_LR, help="--shape: the warm start's learning rate")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    if args.task == "search" and args.shape:
        import time

        begun = time.time()
        paths, count, loss = build_search_shape(
            args.out or here / ".tiny" / args.shape,
            shape=args.shape,
            layers=args.layers,
            seed=args.seed,
            warm_start_records=args.warm_start,
            warm_steps=args.warm_steps,
            warm_lr=args.warm_lr,
        )
        warm = f", warm start {args.warm_steps} steps, last loss {loss:.3f}" if loss is not None else ""
        print(
            f"gpu.tiny: {args.shape} shape, {args.layers} layers, {count} parameters{warm}, "
            f"{time.time() - begun:.0f} s: {paths.model}"
        )
        return 0
    if args.task == "search":
        paths = build_search(args.out or here / ".tiny" / "search", seed=args.seed)
        print(f"gpu.tiny: search model and tokenizer {paths.model}")
        if args.warm_start is not None:
            loss = warm_start(paths.model, args.warm_start, steps=args.warm_steps, seed=args.seed)
            print(f"gpu.tiny: warm start on {args.warm_start}: {args.warm_steps} steps, last loss {loss:.3f}")
        return 0
    paths = build(args.out or here / ".tiny", seed=args.seed)
    print(f"gpu.tiny: model {paths.model}, data {paths.train.parent}, reward {paths.reward}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
