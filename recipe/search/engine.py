"""Search a BM25 index built by ``recipe.search.index``: memory-mapped, one batched call per search.

The score matrix and the corpus copy are memory-mapped (``mmap=True``; a document is read from ``corpus.jsonl`` at
its offset when it is returned), so loading a 21M-passage index costs its vocabulary, not its size. Queries go
through the analyzer the index was built with; a batch of queries is scored in one call: ``recipe.search.topk``'s
kernel over the postings the queries touch (the same scores as bm25s, at a cost that does not grow with the
corpus), or bm25s's own numba ``retrieve`` for the two methods that shift every document's score.
A query that is empty, whitespace only, or has no indexed term (all stopwords or unknown words) gets ``[]``, and
hits with score 0 (no query term in the passage) are dropped, so a query never gets filler.

``search`` is thread-safe (a lock serialises calls: the analyzer caches words and numba's thread pool is one);
the server runs it on a single worker thread anyway.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson

from recipe.search.index import CORPUS_FILE, MANIFEST_FILE, OFFSETS_FILE, make_tokenizer
from recipe.search.passage import Passage
from recipe.search.topk import METHODS_WITHOUT_SHIFT, Scratch, batch_topk

MAX_TOPK: Final = 50
BM25S_FILES: Final = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "vocab.index.json")


class IndexLoadError(RuntimeError):
    """The folder is not a usable index: the message names it and says how to build one."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage as the engine finds it: its row in the corpus copy and its score."""

    row: int
    score: float


def _missing(path: Path, what: str) -> IndexLoadError:
    return IndexLoadError(
        f"no BM25 index at {path}: {what}; build one with python -m recipe.search.index --corpus FILE --out {path}"
    )


class SearchEngine:
    def __init__(self, index_dir: Path | str, *, max_topk: int = MAX_TOPK, n_threads: int = 1) -> None:
        path = Path(index_dir)
        if not path.is_dir():
            raise _missing(path, "the folder does not exist")
        manifest_path = path / MANIFEST_FILE
        if not manifest_path.is_file():
            raise _missing(path, f"{MANIFEST_FILE} not found")
        for name in (*BM25S_FILES, CORPUS_FILE, OFFSETS_FILE):
            if not (path / name).is_file():
                raise _missing(path, f"{name} not found (an incomplete index?)")
        try:
            self.manifest: dict[str, Any] = orjson.loads(manifest_path.read_bytes())
        except orjson.JSONDecodeError as error:
            raise IndexLoadError(f"{manifest_path}: not valid JSON ({error}); rebuild the index") from None
        if max_topk < 1:
            raise ValueError(f"max_topk must be >= 1, got {max_topk}")

        import bm25s

        self.path = path
        self.retriever = bm25s.BM25.load(str(path), mmap=True, load_corpus=False, backend="numba")
        self.passages = int(self.retriever.scores["num_docs"])
        self._offsets = np.load(path / OFFSETS_FILE, mmap_mode="r")
        if len(self._offsets) != self.passages or self.manifest.get("passages") != self.passages:
            raise IndexLoadError(
                f"{path}: the corpus copy has {len(self._offsets)} rows, the scores {self.passages}, the manifest "
                f"{self.manifest.get('passages')}; rebuild the index"
            )
        self._file = open(path / CORPUS_FILE, "rb")  # noqa: SIM115 (held for the mmap's life)
        self._corpus = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._tokenizer = make_tokenizer()
        self._tokenizer.stem_to_sid = dict(self.retriever.vocab_dict)
        self.max_topk = max_topk
        self.n_threads = n_threads
        self.postings_kernel = self.retriever.method in METHODS_WITHOUT_SHIFT
        self._scratch: Scratch | None = None  # the kernel's per-thread buffers, made on first use
        self._lock = threading.Lock()

    # -- queries -------------------------------------------------------------------------------------------------

    def effective_k(self, topk: int) -> int:
        """``topk`` capped at ``max_topk`` and at the corpus size; ValueError below 1."""
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        return min(topk, self.max_topk, self.passages)

    def hits(self, queries: Sequence[str], topk: int | Sequence[int]) -> list[list[Hit]]:
        """The best hits per query, best first. ``topk`` is one k for all, or one per query (a coalesced batch
        of requests); the batch is scored in one retrieve call with the largest k."""
        ks = [topk] * len(queries) if isinstance(topk, int) else list(topk)
        if len(ks) != len(queries):
            raise ValueError(f"{len(queries)} queries but {len(ks)} topk values")
        ks = [self.effective_k(k) for k in ks]
        results: list[list[Hit]] = [[] for _ in queries]
        if not queries:
            return results
        with self._lock:
            token_ids = [
                ids if text.strip() else []
                for text, ids in zip(
                    queries,
                    self._tokenizer.streaming_tokenize(list(queries), update_vocab=False, allow_empty=False),
                    strict=True,
                )
            ]
            live = [i for i, ids in enumerate(token_ids) if ids]
            if not live:
                return results
            ranked = self._rank([token_ids[i] for i in live], max(ks[i] for i in live))
        for (row_ids, row_scores), i in zip(ranked, live, strict=True):
            results[i] = [Hit(r, s) for r, s in zip(row_ids[: ks[i]], row_scores[: ks[i]], strict=True) if s > 0.0]
        return results

    def _rank(self, queries: list[list[int]], k: int) -> list[tuple[list[int], list[float]]]:
        if self.postings_kernel:
            if self._scratch is None or self._scratch.n_threads < self.n_threads:
                self._scratch = Scratch(self.passages, self.n_threads)
            scores = self.retriever.scores
            return batch_topk(
                scores["indptr"],
                scores["indices"],
                scores["data"],
                self.passages,
                queries,
                k,
                self.n_threads,
                self._scratch,
            )
        rows, values = self.retriever.retrieve(queries, k=k, show_progress=False, n_threads=self.n_threads)
        return [(r.tolist(), v.tolist()) for r, v in zip(rows, values, strict=True)]

    def document(self, row: int) -> dict[str, Any]:
        """The corpus row ``{"id", "contents"}`` at ``row``."""
        start = int(self._offsets[row])
        end = int(self._offsets[row + 1]) if row + 1 < self.passages else len(self._corpus)
        document: dict[str, Any] = orjson.loads(self._corpus[start:end])
        return document

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Up to ``topk`` passages per query (capped at ``max_topk`` and the corpus size), best first."""
        return [[Passage.from_row(self.document(h.row), h.score) for h in hits] for hits in self.hits(queries, topk)]

    def warmup(self) -> float:
        """Compile the numba kernels with one query (the first call otherwise pays it); seconds it took."""
        started = time.perf_counter()
        with self._lock:
            self._rank([[0]], 1)
        return time.perf_counter() - started

    def info(self) -> dict[str, Any]:
        return {
            "index": str(self.path),
            "passages": self.passages,
            "engine": self.manifest.get("engine"),
            "engine_version": self.manifest.get("engine_version"),
            "params": self.manifest.get("params"),
            "corpus": self.manifest.get("corpus"),
            "max_topk": self.max_topk,
            "n_threads": self.n_threads,
        }

    def close(self) -> None:
        self._corpus.close()
        self._file.close()
