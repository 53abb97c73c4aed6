"""Build a persisted BM25 index over a wiki-18 style corpus.

    python -m recipe.search.index --corpus wiki-18.jsonl --out indexes/bm25 [--force] [--skip-bad-lines]

The corpus is JSON lines ``{"id": ..., "contents": "\"Title\"\ntext"}`` (Search-R1, FlashRAG). It is read once,
as a stream: each line is parsed, written (normalised to ``{"id", "contents"}``) to the index's own
``corpus.jsonl`` with its byte offset, and its ``contents`` (title line included, as Pyserini indexes it) are
tokenized in chunks into compact int32 arrays; no raw line is kept in memory. The scores are then computed by
``bm25s`` and saved beside the corpus copy, so the engine memory-maps both.

Analysis: lower case, the ``\\b\\w\\w+\\b`` splitter, bm25s's English stopwords, the Snowball English stemmer
(PyStemmer). Scoring: bm25s ``method="lucene"`` with k1=0.9, b=0.4 by default, the values of Pyserini's
``LuceneSearcher``, which is the BM25 retriever of Search-R1 and FlashRAG (Lucene's own 1.2 / 0.75 is one flag
away: ``--k1 1.2 --b 0.75``).

A malformed line (not JSON, not an object, no string ``contents``, no ``id``) stops the build with its file and
line number, unless ``--skip-bad-lines``: then it is skipped, counted, the first few are named, and the count is
in the summary and the manifest. A corpus with no passage is an error either way.

The index is written atomically: built in ``OUT.tmp-XXXX`` beside ``OUT``, then renamed; an existing ``OUT`` is
refused unless ``--force`` (then it is replaced only once the new one is complete).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import orjson

CORPUS_FILE: Final = "corpus.jsonl"
OFFSETS_FILE: Final = "corpus.offsets.npy"
MANIFEST_FILE: Final = "manifest.json"
ENGINE: Final = "bm25s"
DEFAULT_METHOD: Final = "lucene"
DEFAULT_K1: Final = 0.9
DEFAULT_B: Final = 0.4
STOPWORDS: Final = "en"
STEMMER: Final = "english"
CHUNK_PASSAGES: Final = 20_000
BAD_LINES_NAMED: Final = 5


class CorpusError(ValueError):
    """The corpus cannot be indexed: the message names the file, the line and what to do."""


class IndexExistsError(FileExistsError):
    """The output folder already exists and ``force`` was not given."""


def make_tokenizer() -> Any:
    """The analyzer the index and its queries share (a fresh vocabulary)."""
    import bm25s
    import Stemmer

    return bm25s.tokenization.Tokenizer(stopwords=STOPWORDS, stemmer=Stemmer.Stemmer(STEMMER))


@dataclass
class TokenStore:
    """Every passage's token ids, flat in int32 chunks: a 21M-passage corpus as ~5 GB of arrays instead of
    Python lists. Iterating yields one passage's ids as a list, which is what bm25s's index build reads."""

    chunks: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    count: int = 0

    def add(self, docs: Sequence[list[int]]) -> None:
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        flat = np.fromiter((t for d in docs for t in d), dtype=np.int32, count=int(lengths.sum()))
        self.chunks.append(flat)
        self.lengths.append(lengths)
        self.count += len(docs)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[list[int]]:
        for flat, lengths in zip(self.chunks, self.lengths, strict=True):
            ends = np.cumsum(lengths)
            starts = ends - lengths
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                yield flat[start:end].tolist()


@dataclass
class BuildStats:
    passages: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


def parse_line(raw: bytes, path: Path, lineno: int) -> tuple[str, str]:
    """(id, contents) of one corpus line, or CorpusError naming the file and line."""
    where = f"{path}:{lineno}"
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise CorpusError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object with 'id' and 'contents', got {type(row).__name__}")
    contents = row.get("contents")
    if not isinstance(contents, str):
        raise CorpusError(f"{where}: 'contents' is missing or not a string")
    doc_id = row.get("id")
    if doc_id is None or isinstance(doc_id, dict | list | bool):
        raise CorpusError(f"{where}: 'id' is missing or not a string/number")
    return str(doc_id), contents


def stream_corpus(
    source: IO[bytes], path: Path, stats: BuildStats, *, skip_bad: bool, digest: Any
) -> Iterator[tuple[str, str]]:
    """(id, contents) per line of ``source``; blank lines are ignored. Malformed lines raise or are counted."""
    for lineno, raw in enumerate(source, start=1):
        digest.update(raw)
        if not raw.strip():
            continue
        try:
            parsed = parse_line(raw, path, lineno)
        except CorpusError as error:
            if not skip_bad:
                raise CorpusError(f"{error}; fix the line or rerun with --skip-bad-lines") from None
            stats.bad_lines += 1
            if len(stats.bad_examples) < BAD_LINES_NAMED:
                stats.bad_examples.append(str(error))
            continue
        yield parsed


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM), in MB; None where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        return None
    return None


def _progress(total: int | None, desc: str, enabled: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # progress is optional
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, disable=not enabled)


def _write_index(
    corpus: Path,
    out: Path,
    *,
    method: str,
    k1: float,
    b: float,
    skip_bad: bool,
    progress: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import bm25s

    started = time.perf_counter()
    tokenizer = make_tokenizer()
    tokens = TokenStore()
    stats = BuildStats()
    digest = hashlib.sha256()
    offsets: list[np.ndarray] = []
    size = corpus.stat().st_size
    bar = _progress(size, "read+tokenize", progress)
    with open(corpus, "rb") as source, open(out / CORPUS_FILE, "wb") as copy:
        position = 0
        chunk_texts: list[str] = []
        chunk_offsets: list[int] = []
        last = 0

        def flush() -> None:
            tokens.add(list(tokenizer.streaming_tokenize(chunk_texts, update_vocab=True, allow_empty=True)))
            offsets.append(np.asarray(chunk_offsets, dtype=np.int64))
            chunk_texts.clear()
            chunk_offsets.clear()

        for doc_id, contents in stream_corpus(source, corpus, stats, skip_bad=skip_bad, digest=digest):
            line = orjson.dumps({"id": doc_id, "contents": contents}) + b"\n"
            copy.write(line)
            chunk_offsets.append(position)
            position += len(line)
            chunk_texts.append(contents)
            stats.passages += 1
            if len(chunk_texts) >= CHUNK_PASSAGES:
                flush()
                if bar is not None:
                    bar.update(source.tell() - last)
                    last = source.tell()
        if chunk_texts:
            flush()
        if bar is not None:
            bar.update(size - last)
            bar.close()
    if stats.passages == 0:
        detail = f" ({stats.bad_lines} malformed lines skipped)" if stats.bad_lines else ""
        raise CorpusError(f"{corpus}: no passage to index{detail}; give a non-empty wiki-18 style JSONL corpus")
    read_s = time.perf_counter() - started
    log(f"index: read {stats.passages} passages in {read_s:.1f}s ({stats.bad_lines} malformed lines skipped)")

    retriever = bm25s.BM25(method=method, k1=k1, b=b, backend="numba")
    retriever.index(bm25s.tokenization.Tokenized(ids=tokens, vocab=tokenizer.get_vocab_dict()), show_progress=progress)
    tokens.chunks.clear()  # free the token ids before saving
    tokens.lengths.clear()
    retriever.save(str(out), show_progress=progress)
    np.save(out / OFFSETS_FILE, np.concatenate(offsets))
    build_s = time.perf_counter() - started
    manifest: dict[str, Any] = {
        "corpus": {"path": str(corpus.resolve()), "bytes": size, "sha256": digest.hexdigest()},
        "passages": stats.passages,
        "bad_lines_skipped": stats.bad_lines,
        "engine": ENGINE,
        "engine_version": bm25s.__version__,
        "params": {"method": method, "k1": k1, "b": b, "stopwords": STOPWORDS, "stemmer": STEMMER},
        "vocabulary": len(retriever.vocab_dict),
        "build_seconds": round(build_s, 3),
        "peak_rss_mb": peak_rss_mb(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / MANIFEST_FILE).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    for example in stats.bad_examples:
        log(f"index: skipped {example}")
    return manifest


def build_index(
    corpus: Path,
    out: Path,
    *,
    method: str = DEFAULT_METHOD,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    force: bool = False,
    skip_bad: bool = False,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Build the index of ``corpus`` into ``out`` atomically; returns the manifest."""
    if not corpus.is_file():
        raise CorpusError(f"{corpus}: no such corpus file; give a wiki-18 style JSONL file with --corpus")
    if out.exists() and not force:
        raise IndexExistsError(f"{out} already exists; pass --force to replace it, or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would survive the rename
    try:
        manifest = _write_index(corpus, tmp, method=method, k1=k1, b=b, skip_bad=skip_bad, progress=progress, log=log)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.search.index",
        description="Build a BM25 index (bm25s, English stopwords, Snowball stemmer) over a wiki-18 style JSONL "
        'corpus of {"id", "contents"} lines. A malformed line stops the build, naming the file and line, '
        "unless --skip-bad-lines (skipped, counted, reported). An empty corpus is an error.",
    )
    parser.add_argument("--corpus", type=Path, required=True, help="wiki-18 style JSONL file")
    parser.add_argument("--out", type=Path, required=True, help="index folder to create")
    parser.add_argument("--force", action="store_true", help="replace an existing --out once the new index is built")
    parser.add_argument(
        "--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of stopping"
    )
    parser.add_argument("--method", default=DEFAULT_METHOD, choices=("lucene", "robertson", "atire", "bm25l", "bm25+"))
    parser.add_argument("--k1", type=float, default=DEFAULT_K1, help="default 0.9 (Pyserini's LuceneSearcher)")
    parser.add_argument("--b", type=float, default=DEFAULT_B, help="default 0.4 (Pyserini's LuceneSearcher)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        manifest = build_index(
            args.corpus,
            args.out,
            method=args.method,
            k1=args.k1,
            b=args.b,
            force=args.force,
            skip_bad=args.skip_bad_lines,
            progress=not args.no_progress,
            log=log,
        )
    except (CorpusError, IndexExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: {error.filename or args.out}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(
        f"index: built {args.out} passages={manifest['passages']} vocabulary={manifest['vocabulary']} "
        f"bad_lines_skipped={manifest['bad_lines_skipped']} seconds={manifest['build_seconds']} "
        f"peak_rss_mb={manifest['peak_rss_mb']:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
