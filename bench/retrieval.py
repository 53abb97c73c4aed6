"""Retrieval benchmark: bm25s (numba) against rank_bm25, in process and through the /retrieve server.

    python bench/retrieval.py [--passages 1000000] [--queries 4096] [--baseline-passages 20000]
                              [--baseline-queries 256] [--requests 2000] [--concurrency 100] [--json]

1. Corpus: real wiki-18 at 1M passages is not here, so a synthetic one is generated whose statistics resemble
   it: ``"Title"\\nTitle text`` passages of 100 words, the words drawn from a Zipf-Mandelbrot law (s=1.07)
   over a 1M-word vocabulary whose head is the real words of ``tests/fixtures/recipe/wiki18_sample_1000.jsonl``
   in their frequency order (so stopwords and common words sit where they do in Wikipedia) and whose tail is
   made-up words. Queries resemble an LLM's search calls: 3-8 content words, half taken from one passage
   (with its title half the time), half drawn from the mid-frequency vocabulary.
2. Index: ``python -m recipe.search.index`` in a child process (build seconds and peak RSS from its manifest).
3. In process: load time, numba JIT warm-up, ``--queries`` queries in one ``SearchEngine.search`` call
   (documents included) with numba ``n_threads`` 1 and 2, and one-query calls (p50 / p95) - for the engine's
   postings kernel (``recipe.search.topk``) and, beside it, bm25s's own dense ``retrieve`` on the same index.
4. Baseline, same run: rank_bm25 ``BM25Okapi`` is a Python loop over every passage per query term, far too slow
   at 1M, so it runs on the first ``--baseline-passages`` passages with ``--baseline-queries`` queries, beside
   bm25s on that same small corpus and the same analyzer's tokens.
5. Server: ``python -m recipe.search.server`` in a child process; ``--queries`` queries in batched requests
   of 256, and ``--requests`` one-query requests at ``--concurrency`` (verl's tool), with the micro-batcher
   and with ``--no-coalesce``. The client runs in this process, on the same 2 cores as the server.

Target: one training step's 4,096 queries over 1M passages in < 5 s on 2 cores. No assertion: figures are printed
beside it with PASS / MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import json_safe  # noqa: E402
from recipe.search.engine import SearchEngine  # noqa: E402
from recipe.search.index import build_index, make_tokenizer  # noqa: E402

SAMPLE = REPO / "tests" / "fixtures" / "recipe" / "wiki18_sample_1000.jsonl"
TARGET_SECONDS = 5.0
TARGET_QUERIES = 4096
TARGET_PASSAGES = 1_000_000
WORDS_PER_PASSAGE = 100
VOCABULARY = 1_000_000
ZIPF_S = 1.07
ZIPF_Q = 2.7
CONTENT_RANK = 60  # ranks below this are (mostly) stopwords
TOPK = 3
CHUNK = 50_000


# -- synthetic corpus ----------------------------------------------------------------------------------------------


def vocabulary(sample: Path, size: int) -> np.ndarray:
    """Real words of the sample by frequency, then made-up 7-letter words up to ``size``."""
    counts: Counter[str] = Counter()
    for line in sample.read_text(encoding="utf-8").splitlines():
        text = orjson.loads(line)["contents"].partition("\n")[2]
        counts.update(re.findall(r"\w+", text))
    head = [w for w, _ in counts.most_common()]
    seen = {w.lower() for w in head}
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    tail: list[str] = []
    number = 0
    while len(head) + len(tail) < size:
        code = (number * 1_000_003 + 12_345) % 26**7  # a bijection on 7-letter words: unique, scattered
        digits = [(code // 26**i) % 26 for i in range(7)]
        word = "".join(letters[digits])
        if word not in seen:
            tail.append(word)
        number += 1
    return np.array(head + tail, dtype=object)


def zipf_probabilities(size: int) -> np.ndarray:
    weights = 1.0 / (np.arange(1, size + 1) + ZIPF_Q) ** ZIPF_S
    return weights / weights.sum()


def write_corpus(path: Path, passages: int, queries: int, seed: int) -> tuple[list[str], dict[str, Any]]:
    """Write ``passages`` synthetic wiki-18 lines to ``path``; returns the queries and the corpus's figures."""
    rng = np.random.default_rng(seed)
    words = vocabulary(SAMPLE, VOCABULARY)
    cdf = np.cumsum(zipf_probabilities(len(words)))
    from_passage = queries // 2
    picks = set(rng.choice(passages, size=min(from_passage, passages), replace=False).tolist())
    out: list[str] = []
    started = time.perf_counter()
    with open(path, "wb") as f:
        for start in range(0, passages, CHUNK):
            n = min(CHUNK, passages - start)
            ranks = np.searchsorted(cdf, rng.random((n, WORDS_PER_PASSAGE)))
            titles = rng.integers(CONTENT_RANK, 200_000, size=(n, 2))
            title_len = rng.integers(1, 3, size=n)
            lines = []
            for i in range(n):
                title = " ".join(words[titles[i, : title_len[i]]]).title()
                text = " ".join(words[ranks[i]])
                lines.append(orjson.dumps({"id": str(start + i), "contents": f'"{title}"\n{title} {text}'}))
                if start + i in picks:
                    content = [w for r, w in zip(ranks[i], words[ranks[i]], strict=True) if r >= CONTENT_RANK]
                    k = int(rng.integers(3, 9))
                    chosen = list(rng.choice(content, size=min(k, len(content)), replace=False))
                    if rng.random() < 0.5:
                        chosen = [title, *chosen[: max(2, k - 2)]]
                    out.append(" ".join(chosen))
            f.write(b"\n".join(lines) + b"\n")
    mid = np.arange(CONTENT_RANK, 200_000)
    mid_p = zipf_probabilities(200_000)[CONTENT_RANK:]
    mid_p /= mid_p.sum()
    while len(out) < queries:
        k = int(rng.integers(3, 9))
        out.append(" ".join(words[rng.choice(mid, size=k, p=mid_p)]))
    rng.shuffle(out)
    figures = {
        "passages": passages,
        "bytes": path.stat().st_size,
        "seconds": round(time.perf_counter() - started, 1),
        "vocabulary": len(words),
    }
    return out[:queries], figures


def head_lines(source: Path, dest: Path, n: int) -> None:
    with open(source, "rb") as f, open(dest, "wb") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)


# -- measurements --------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def single_latencies(search: Any, queries: list[str]) -> list[float]:
    latencies = []
    for query in queries:
        started = time.perf_counter()
        search(query)
        latencies.append(time.perf_counter() - started)
    return latencies


KERNELS = {"postings": True, "dense": False}
"""the engine's postings kernel (recipe.search.topk), and bm25s's own retrieve over every passage (the baseline)"""


def in_process(index: Path, queries: list[str], singles: int) -> dict[str, Any]:
    started = time.perf_counter()
    engine = SearchEngine(index)
    load_s = time.perf_counter() - started
    figures: dict[str, Any] = {"load_s": load_s}
    answers: dict[str, list[list[tuple[str, float]]]] = {}
    for kernel, postings in KERNELS.items():
        engine.postings_kernel = postings
        measured: dict[str, Any] = {"warmup_s": {}, "batch_s": {}}
        for threads in (1, 2):
            engine.n_threads = threads
            measured["warmup_s"][threads] = engine.warmup()
            started = time.perf_counter()
            results = engine.search(queries, TOPK)
            measured["batch_s"][threads] = time.perf_counter() - started
            measured.setdefault("empty_results", sum(1 for r in results if not r))
            answers[kernel] = [[(p.doc_id, round(p.score, 3)) for p in r] for r in results]
        engine.n_threads = 1
        latencies = single_latencies(lambda q: engine.search([q], TOPK), queries[:singles])
        measured["single_p50_ms"] = percentile(latencies, 50) * 1000
        measured["single_p95_ms"] = percentile(latencies, 95) * 1000
        figures[kernel] = measured
    # the same passages and scores from both (ties at the k-th score may pick different passages)
    figures["same_scores"] = sum(
        [s for _, s in a] == [s for _, s in b] for a, b in zip(answers["postings"], answers["dense"], strict=True)
    ) / max(1, len(queries))
    figures["rss_mb"] = rss_mb(os.getpid())
    engine.close()
    return figures


def baseline(corpus: Path, work: Path, passages: int, queries: list[str]) -> dict[str, Any]:
    """rank_bm25 and bm25s on the same small corpus, the same analyzer, the same queries."""
    from rank_bm25 import BM25Okapi

    small = work / "small.jsonl"
    head_lines(corpus, small, passages)
    texts = [orjson.loads(line)["contents"] for line in small.read_bytes().splitlines()]
    tokenizer = make_tokenizer()
    started = time.perf_counter()
    docs = tokenizer.tokenize(texts, update_vocab=True, return_as="string", show_progress=False)
    reference = BM25Okapi(docs, k1=0.9, b=0.4)
    rank_build = time.perf_counter() - started
    query_tokens = tokenizer.tokenize(queries, update_vocab=False, return_as="string", show_progress=False)

    def rank_search(tokens: list[str]) -> np.ndarray:
        scores = reference.get_scores(tokens)
        top = np.argpartition(-scores, TOPK)[:TOPK]
        return top[np.argsort(-scores[top])]

    started = time.perf_counter()
    for tokens in query_tokens:
        rank_search(tokens)
    rank_total = time.perf_counter() - started
    rank_lat = single_latencies(rank_search, query_tokens)

    started = time.perf_counter()
    build_index(small, work / "small-index")
    ours_build = time.perf_counter() - started
    engine = SearchEngine(work / "small-index")
    engine.warmup()
    started = time.perf_counter()
    engine.search(queries, TOPK)
    ours_total = time.perf_counter() - started
    ours_lat = single_latencies(lambda q: engine.search([q], TOPK), queries)
    engine.close()
    n = len(queries)
    return {
        "passages": passages,
        "queries": n,
        "rank_bm25": {
            "build_s": rank_build,
            "qps": n / rank_total,
            "p50_ms": percentile(rank_lat, 50) * 1000,
            "p95_ms": percentile(rank_lat, 95) * 1000,
        },
        "bm25s": {
            "build_s": ours_build,
            "qps": n / ours_total,
            "p50_ms": percentile(ours_lat, 50) * 1000,
            "p95_ms": percentile(ours_lat, 95) * 1000,
        },
    }


def rss_mb(pid: int) -> dict[str, float]:
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            figures[key] = int(line.split()[1]) * 1024 / 1e6
    return figures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, index: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        command = [sys.executable, "-m", "recipe.search.server", "--index", str(index), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning", *extra], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT
        )
        started = time.perf_counter()
        while True:
            if self.process.poll() is not None:
                self.log.seek(0)
                sys.exit(f"server exited with {self.process.returncode}: {self.log.read().decode()[-2000:]}")
            try:
                httpx.get(f"{self.url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        self.start_s = time.perf_counter() - started

    def stop(self) -> dict[str, float]:
        memory = rss_mb(self.process.pid)
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()
        return memory


async def batched_requests(url: str, queries: list[str], size: int) -> float:
    async with httpx.AsyncClient(timeout=120) as client:
        started = time.perf_counter()
        for start in range(0, len(queries), size):
            response = await client.post(url, json={"queries": queries[start : start + size], "topk": TOPK})
            response.raise_for_status()
        return time.perf_counter() - started


async def _connection(host: str, port: int, work: asyncio.Queue[str], latencies: list[float]) -> None:
    """One keep-alive HTTP/1.1 connection sending one-query requests back to back. A raw client: httpx's
    connection pool is itself the bottleneck at 100 concurrent requests on 2 cores (~70 requests/s)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while not work.empty():
            body = orjson.dumps({"queries": [work.get_nowait()], "topk": TOPK})
            head = f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            started = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            header = await reader.readuntil(b"\r\n\r\n")
            status = header.split(b" ", 2)[1]
            length = next(
                int(v)
                for k, _, v in (h.partition(b":") for h in header.split(b"\r\n"))
                if k.lower() == b"content-length"
            )
            await reader.readexactly(length)
            if status != b"200":
                raise RuntimeError(f"server answered {status.decode()}")
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def one_per_request(url: str, queries: list[str], concurrency: int) -> dict[str, float]:
    parsed = httpx.URL(url)
    work: asyncio.Queue[str] = asyncio.Queue()
    for query in queries:
        work.put_nowait(query)
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(*(_connection(parsed.host, parsed.port or 80, work, latencies) for _ in range(concurrency)))
    total = time.perf_counter() - started
    return {
        "qps": len(queries) / total,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
    }


def through_server(index: Path, queries: list[str], requests: int, concurrency: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for mode, extra in (("coalesced", ()), ("per_request", ("--no-coalesce",))):
        server = ServerProcess(index, *extra)
        url = f"{server.url}/retrieve"
        batch_s = asyncio.run(batched_requests(url, queries, 256))
        singles = asyncio.run(one_per_request(url, (queries * (requests // len(queries) + 1))[:requests], concurrency))
        served = httpx.get(f"{server.url}/health").json()["served"]
        figures[mode] = {
            "start_s": server.start_s,
            "batched_s": batch_s,
            "single": singles,
            "engine_calls": served["batches"],
            "requests": served["requests"],
            "memory_mb": server.stop(),
        }
    return figures


# -- report ----------------------------------------------------------------------------------------------------


def report(result: dict[str, Any]) -> None:
    c, b, p, s = result["corpus"], result["build"], result["in_process"], result["server"]
    n, q = c["passages"], result["queries"]
    print(f"retrieval bench: {n:,} synthetic wiki-18-like passages, {q:,} queries, top-{TOPK}, {os.cpu_count()} cores")
    print(f"  corpus: {c['bytes'] / 1e6:,.0f} MB generated in {c['seconds']:.0f} s")
    print(
        f"  index build (python -m recipe.search.index): {b['build_seconds']:.0f} s, "
        f"peak RSS {b['peak_rss_mb']:,.0f} MB, {b['index_mb']:,.0f} MB on disk, vocabulary {b['vocabulary']:,}"
    )
    for kernel in KERNELS:
        w = p[kernel]["warmup_s"]
        print(
            f"  engine load {p['load_s']:.2f} s; {kernel} kernel numba JIT warm-up: {w[1]:.1f} s (n_threads=1), "
            f"{w[2]:.1f} s more for the parallel kernel (n_threads=2)"
        )
    print(f"  engine RSS after the run: {p['rss_mb'].get('VmRSS', float('nan')):,.0f} MB (bench process, mmap'd index)")
    print()
    base = result["baseline"]
    rb, ob = base["rank_bm25"], base["bm25s"]
    print(f"baseline on the first {base['passages']:,} passages, {base['queries']} queries, in process:")
    print(f"  {'':22} {'rank_bm25 0.2.2':>16} {'recipe engine':>16} {'ratio':>8}")
    print(f"  {'build s':22} {rb['build_s']:16.2f} {ob['build_s']:16.2f} {rb['build_s'] / ob['build_s']:7.1f}x")
    print(f"  {'queries/s (sequential)':22} {rb['qps']:16,.0f} {ob['qps']:16,.0f} {ob['qps'] / rb['qps']:7.0f}x")
    print(f"  {'p50 ms (one query)':22} {rb['p50_ms']:16.2f} {ob['p50_ms']:16.3f}")
    print(f"  {'p95 ms (one query)':22} {rb['p95_ms']:16.2f} {ob['p95_ms']:16.3f}")
    print()
    print(f"in process at {n:,} passages: the postings kernel beside bm25s's dense retrieve (same index, same run)")
    print(f"  {'':42} {'postings s':>10} {'dense s':>8} {'speed-up':>8}")
    for threads in (1, 2):
        ours, theirs = p["postings"]["batch_s"][threads], p["dense"]["batch_s"][threads]
        label = f"{q:,} queries in one call, n_threads={threads}"
        print(f"  {label:42} {ours:10.2f} {theirs:8.2f} {theirs / ours:7.1f}x")
    for pct in (50, 95):
        ours, theirs = p["postings"][f"single_p{pct}_ms"], p["dense"][f"single_p{pct}_ms"]
        print(f"  {f'one query per call, p{pct} ms':42} {ours:10.2f} {theirs:8.2f} {theirs / ours:7.1f}x")
    print(f"  queries whose top-{TOPK} scores agree between the two: {p['same_scores']:.1%}")
    print()
    print(f"through the server at {n:,} passages (postings kernel):")
    print(f"  {'':42} {'seconds':>8} {'queries/s':>10} {'p50 ms':>8} {'p95 ms':>8}")
    for mode in ("coalesced", "per_request"):
        m = s[mode]
        label = "micro-batcher" if mode == "coalesced" else "--no-coalesce"
        print(f"  {f'server ({label}), batches of 256':42} {m['batched_s']:8.2f} {q / m['batched_s']:10,.0f}")
        single = m["single"]
        concurrency = result["concurrency"]
        print(
            f"  {f'server ({label}), 1 query/request x{concurrency}':42} {'':8} {single['qps']:10,.0f} "
            f"{single['p50_ms']:8.1f} {single['p95_ms']:8.1f}   ({m['requests']:,} requests, "
            f"{m['engine_calls']:,} engine calls)"
        )
    mem = s["coalesced"]["memory_mb"]
    print(
        f"  server RSS {mem.get('VmRSS', 0):,.0f} MB (peak {mem.get('VmHWM', 0):,.0f} MB); "
        f"start-up incl. load + JIT {s['coalesced']['start_s']:.1f} s"
    )
    print()
    best = min(p["postings"]["batch_s"].values())
    served = s["coalesced"]["batched_s"]
    at_scale = n >= TARGET_PASSAGES and q >= TARGET_QUERIES
    verdict = "PASS" if best < TARGET_SECONDS and served < TARGET_SECONDS else "MISS"
    scope = "" if at_scale else f" (measured at {n:,} passages / {q:,} queries, not the target's size)"
    print(
        f"target: {TARGET_QUERIES:,} queries over {TARGET_PASSAGES:,} passages < {TARGET_SECONDS:.0f} s on 2 cores: "
        f"in process {best:.2f} s, through the server {served:.2f} s -> {verdict}{scope}"
    )


def build_the_index(corpus: Path, index: Path) -> None:
    argv = [sys.executable, "-m", "recipe.search.index", "--corpus", str(corpus), "--out", str(index), "--no-progress"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"index build failed: {done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=TARGET_PASSAGES)
    parser.add_argument("--queries", type=int, default=TARGET_QUERIES)
    parser.add_argument("--baseline-passages", type=int, default=20_000)
    parser.add_argument("--baseline-queries", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2000, help="one-query requests sent to the server")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--singles", type=int, default=500, help="one-query engine calls timed in process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep the generated corpus, queries and index in this folder and reuse them when their settings match "
        "(the 1M build takes minutes)",
    )
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-retrieval-")))
        work.mkdir(parents=True, exist_ok=True)
        corpus, index, saved = work / "corpus.jsonl", work / "index", work / "generated.json"
        settings = {"passages": args.passages, "queries": args.queries, "seed": args.seed}
        previous = json.loads(saved.read_text()) if saved.exists() else {}
        if previous.get("settings") == settings and (index / "manifest.json").exists():
            queries, corpus_figures = previous["queries"], previous["corpus"]
            print(f"reusing the corpus and index in {work}", file=sys.stderr)
            shutil.rmtree(work / "small-index", ignore_errors=True)
        else:
            shutil.rmtree(index, ignore_errors=True)
            shutil.rmtree(work / "small-index", ignore_errors=True)
            queries, corpus_figures = write_corpus(corpus, args.passages, args.queries, args.seed)
            build_the_index(corpus, index)
            saved.write_text(json.dumps({"settings": settings, "queries": queries, "corpus": corpus_figures}))
        manifest = json.loads((index / "manifest.json").read_text())
        build = {
            "build_seconds": manifest["build_seconds"],
            "peak_rss_mb": manifest["peak_rss_mb"],
            "vocabulary": manifest["vocabulary"],
            "index_mb": sum(f.stat().st_size for f in index.iterdir()) / 1e6,
        }
        base_queries = queries[: args.baseline_queries]
        result = {
            "queries": len(queries),
            "concurrency": args.concurrency,
            "corpus": corpus_figures,
            "build": build,
            "in_process": in_process(index, queries, args.singles),  # first: its warm-up is the JIT's cost
            "baseline": baseline(corpus, work, min(args.baseline_passages, args.passages), base_queries),
            "server": through_server(index, queries, args.requests, args.concurrency),
        }
    if args.json:
        print(json.dumps(json_safe(result)))
    else:
        report(result)


if __name__ == "__main__":
    main()
