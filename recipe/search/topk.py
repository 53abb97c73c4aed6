"""Top-k BM25 over the postings a query touches, not over the whole corpus.

bm25s stores an index as a sparse matrix in CSC layout: for every vocabulary term ``t``, ``indices[indptr[t]:
indptr[t+1]]`` are the documents holding it and ``data[…]`` their precomputed BM25 contributions. A document's score
for a query is the sum of the contributions of the query's terms. bm25s's own retrieval adds them into a dense array
of every document's score and then selects the top k from all of them, which costs O(corpus) per query: ~3 ms at 1M
passages, so a training step's 4,096 searches take 10-15 s on 2 cores, and 21M passages are 20x worse.

This kernel reads exactly the same arrays and produces the same scores, but keeps the list of documents it touched:
the top-k selection and the reset of the score buffer run over those only, so a query costs its postings (a few
thousand to a few hundred thousand entries once stopwords are gone), not the corpus. Queries run in parallel over
numba threads, each thread with its own score buffer; the buffers (:class:`Scratch`) live as long as the engine,
so a call allocates and clears nothing of corpus size.

Valid for the scoring methods whose untouched documents score 0 (``lucene``, ``robertson``, ``atire``: bm25s has
no non-occurrence shift for them); ``bm25l`` and ``bm25+`` add a constant to every document and use bm25s's own
retrieval instead (``engine.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
import numpy.typing as npt

METHODS_WITHOUT_SHIFT = frozenset({"lucene", "robertson", "atire"})


@numba.njit(nogil=True)
def _query_topk(
    indptr: npt.NDArray[np.integer],
    indices: npt.NDArray[np.integer],
    data: npt.NDArray[np.floating],
    terms: npt.NDArray[np.int64],
    k: int,
    scores: npt.NDArray[np.float32],
    seen: npt.NDArray[np.uint8],
    touched: npt.NDArray[np.int32],
    out_rows: npt.NDArray[np.int64],
    out_scores: npt.NDArray[np.float32],
) -> int:
    """Fill ``out_rows``/``out_scores`` (length k) with the query's best documents with a score above 0, best
    first; returns how many were written. ``scores`` and ``seen`` are all zeros on entry and on exit. A document is
    listed once however many of its terms contribute, and whatever they contribute: bm25s stores zero entries (a
    term in every passage has idf 0 with ``atire``) and negative ones (``robertson``, a term in most passages)."""
    n_touched = 0
    for t in terms:
        for j in range(indptr[t], indptr[t + 1]):
            doc = indices[j]
            if seen[doc] == 0:
                seen[doc] = 1
                touched[n_touched] = doc
                n_touched += 1
            scores[doc] += data[j]
    filled = 0
    for i in range(n_touched):
        doc = touched[i]
        s = scores[doc]
        scores[doc] = 0.0
        seen[doc] = 0
        if s <= 0.0:
            continue
        if filled == k and (s < out_scores[k - 1] or (s == out_scores[k - 1] and doc > out_rows[k - 1])):
            continue
        # insertion into the sorted top list (k <= 50: cheaper than a heap); ties keep the lower document first
        position = filled if filled < k else k - 1
        while position > 0 and (
            out_scores[position - 1] < s or (out_scores[position - 1] == s and out_rows[position - 1] > doc)
        ):
            if position < k:
                out_scores[position] = out_scores[position - 1]
                out_rows[position] = out_rows[position - 1]
            position -= 1
        out_scores[position] = s
        out_rows[position] = doc
        if filled < k:
            filled += 1
    return filled


@numba.njit(parallel=True, nogil=True)
def _batch_topk(
    indptr: npt.NDArray[np.integer],
    indices: npt.NDArray[np.integer],
    data: npt.NDArray[np.floating],
    terms: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    k: int,
    n_chunks: int,
    scores: npt.NDArray[np.float32],
    seen: npt.NDArray[np.uint8],
    touched: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    n_queries = len(offsets) - 1
    rows = np.full((n_queries, k), -1, dtype=np.int64)
    best = np.zeros((n_queries, k), dtype=np.float32)
    found = np.zeros(n_queries, dtype=np.int64)
    per_chunk = (n_queries + n_chunks - 1) // n_chunks
    for chunk in numba.prange(n_chunks):
        for q in range(chunk * per_chunk, min(n_queries, (chunk + 1) * per_chunk)):
            found[q] = _query_topk(
                indptr,
                indices,
                data,
                terms[offsets[q] : offsets[q + 1]],
                k,
                scores[chunk],
                seen[chunk],
                touched[chunk],
                rows[q],
                best[q],
            )
    return rows, best, found


class Scratch:
    """One score buffer and one seen-flag buffer (zeros between calls: the kernel clears what it touched) and one
    touched-list per thread, for a corpus of ``n_docs``: 9 bytes per passage per thread (378 MB for wiki-18's 21M
    passages on 2 threads)."""

    def __init__(self, n_docs: int, n_threads: int) -> None:
        if n_docs >= 2**31:
            raise ValueError(f"{n_docs} passages: the kernel numbers them with int32")
        self.n_docs = n_docs
        self.scores = np.zeros((max(1, n_threads), n_docs), dtype=np.float32)
        self.seen = np.zeros((max(1, n_threads), n_docs), dtype=np.uint8)
        self.touched = np.empty((max(1, n_threads), n_docs), dtype=np.int32)

    @property
    def n_threads(self) -> int:
        return int(self.scores.shape[0])


def batch_topk(
    indptr: npt.NDArray[np.integer],
    indices: npt.NDArray[np.integer],
    data: npt.NDArray[np.floating],
    n_docs: int,
    queries: Sequence[Sequence[int]],
    k: int,
    n_threads: int = 1,
    scratch: Scratch | None = None,
) -> list[tuple[list[int], list[float]]]:
    """(documents, scores) per query: its up to ``k`` best documents with a score above 0, best first (ties: lower
    document first). ``queries`` are term ids of the index's vocabulary; repeated terms count repeatedly, as in
    bm25s. ``scratch`` (for ``n_docs`` and at least ``n_threads``) is reused; without it one is made for the call.
    Not reentrant on one ``scratch``: the caller serialises calls (the engine holds a lock)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if scratch is None:
        scratch = Scratch(n_docs, n_threads)
    elif scratch.n_docs != n_docs or scratch.n_threads < n_threads:
        raise ValueError(
            f"scratch for {scratch.n_docs} passages x {scratch.n_threads} threads, not {n_docs} x {n_threads}"
        )
    lengths = np.array([len(q) for q in queries], dtype=np.int64)
    offsets = np.zeros(len(queries) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    terms = np.fromiter((t for q in queries for t in q), dtype=np.int64, count=int(offsets[-1]))
    n_chunks = max(1, min(n_threads, len(queries)))
    rows, best, found = _batch_topk(
        np.asarray(indptr),
        np.asarray(indices),
        np.asarray(data),
        terms,
        offsets,
        k,
        n_chunks,
        scratch.scores,
        scratch.seen,
        scratch.touched,
    )
    return [
        (rows[q, :found_q].tolist(), best[q, :found_q].tolist())
        for q, found_q in enumerate(np.minimum(found, k).tolist())
    ]
