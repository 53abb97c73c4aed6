"""The highest-reward rollout samples of a run's end, for a person to read before launching at scale (only
reading them shows a gamed reward).

Reads the active timeline's last steps, each from the newest attempt that dumped it."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from guardian.config import MAX_LINE_BYTES
from guardian.regular_files import open_regular
from guardian.sources.rollouts import dump_rows, sample_score

ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class Sample:
    """One dumped sample: where it is, its score, and its texts cut to the configured length."""

    step: int
    score: float
    prompt: str
    response: str
    ground_truth: str | None
    file: str
    row: int  # the n-th sample read from the file

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "score": self.score,
            "prompt": self.prompt,
            "response": self.response,
            "ground_truth": self.ground_truth,
            "file": self.file,
            "row": self.row,
        }


@dataclass(frozen=True, slots=True)
class SampleReview:
    """What was read: the best samples, the steps whose dumps were read, the lines that could not be."""

    samples: tuple[Sample, ...]
    steps_read: tuple[int, ...]
    problems: tuple[str, ...]


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _cut(value: object, chars: int) -> str:
    text = _text(value)
    return text if len(text) <= chars else text[: chars - 1] + ELLIPSIS


def dump_files(folders: Sequence[Path], steps: Sequence[int], last: int) -> dict[int, Path]:
    """The dumps of the newest ``last`` of ``steps`` that have one, each from the first of ``folders`` (newest
    attempt first) holding it."""
    found: dict[int, Path] = {}
    for step in sorted(steps, reverse=True):
        path = next((f / f"{step}.jsonl" for f in folders if (f / f"{step}.jsonl").is_file()), None)
        if path is not None:
            found[step] = path
            if len(found) == last:
                break
    return found


def top_samples(
    files: dict[int, Path], *, count: int, chars: int, max_line_bytes: int = MAX_LINE_BYTES
) -> SampleReview:
    """The ``count`` highest-scoring samples of ``files`` (step -> dump), best first, one per prompt (a GRPO group
    repeats its prompt: the best of each shows more of what the reward pays for); ties go to the later step. A
    prompt is its whole text (a digest of it), not the ``chars`` shown: prompts that share a long preamble (a
    system prompt, tool schemas) are different prompts."""
    problems: list[str] = []
    best: dict[bytes, tuple[float, int, int, Sample]] = {}  # the prompt's digest -> its best sample, ranked
    order = itertools.count()
    for step, path in files.items():
        try:
            with open_regular(path) as handle:  # never blocks on a FIFO put in its place
                size = os.fstat(handle.fileno()).st_size
                rows = dump_rows(handle, size, path, problems, max_line_bytes=max_line_bytes)
                for number, row in enumerate(rows, start=1):
                    score = sample_score(row)
                    if score is None:
                        continue
                    prompt = _text(row.get("input"))
                    key = hashlib.blake2b(prompt.encode(errors="surrogatepass"), digest_size=16).digest()
                    entry = (score, step, -next(order))
                    if key in best and best[key][:3] >= entry:
                        continue
                    truth = row.get("gts")
                    sample = Sample(
                        step,
                        score,
                        _cut(prompt, chars),
                        _cut(row.get("output"), chars),
                        _cut(truth, chars) if truth is not None else None,
                        str(path),
                        number,
                    )
                    best[key] = (*entry, sample)
        except OSError as exc:
            problems.append(f"{path}: cannot read ({exc.strerror or exc})")
    ranked = heapq.nlargest(count, best.values(), key=lambda e: e[:3])
    return SampleReview(tuple(e[3] for e in ranked), tuple(sorted(files)), tuple(problems))
