"""recipe.search: the BM25 index builder, the engine, the /retrieve server and its async client.

One index (a mini-corpus of the HotpotQA fixture's context paragraphs, 994 passages) and one engine are shared by
the module: numba compiles the retrieval kernel once per process (~10 s on 2 cores), and every server test runs a
real uvicorn on loopback in a thread over that same engine.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import free_port

from recipe.search.client import RetrievalClient, RetrievalError
from recipe.search.engine import IndexLoadError, SearchEngine
from recipe.search.hotpot_corpus import write_corpus
from recipe.search.index import CorpusError, IndexExistsError, build_index, make_tokenizer
from recipe.search.server import Settings, create_app, uvicorn_config
from recipe.search.topk import Scratch, batch_topk

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "recipe"
HOTPOTQA = FIXTURES / "hotpotqa_train_100.json"
WIKI18 = FIXTURES / "wiki18_sample_1000.jsonl"

# measured on this fixture with the defaults (lucene, k1=0.9, b=0.4): both supporting titles in the top 10 for
# 77 of 100 questions, at least one in the top 3 for 96; asserted with a margin
RECALL_BOTH_AT_10 = 0.72
RECALL_ANY_AT_3 = 0.90


def _records() -> list[dict]:
    return json.loads(HOTPOTQA.read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "hotpotqa_passages.jsonl"
    write_corpus(str(HOTPOTQA), path)
    return path


@pytest.fixture(scope="module")
def index_dir(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("index") / "bm25"
    build_index(corpus, out)
    return out


@pytest.fixture(scope="module")
def engine(index_dir: Path) -> Iterator[SearchEngine]:
    engine = SearchEngine(index_dir)
    engine.warmup()
    yield engine
    engine.close()


class LiveServer:
    def __init__(self, engine: SearchEngine, settings: Settings) -> None:
        import uvicorn

        self.app = create_app(engine, settings)
        config = uvicorn_config(self.app, settings, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/retrieve"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(engine: SearchEngine) -> Iterator[LiveServer]:
    live = LiveServer(engine, Settings(max_queries=200, max_query_chars=1000, batch_wait_ms=5.0))
    yield live
    live.stop()


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


# -- retrieval quality -------------------------------------------------------------------------------------------


def test_hotpotqa_supporting_titles_are_retrieved(engine: SearchEngine) -> None:
    records = _records()
    at_10 = engine.search([r["question"] for r in records], 10)
    at_3 = engine.search([r["question"] for r in records], 3)
    both = anyone = 0
    for record, hits10, hits3 in zip(records, at_10, at_3, strict=True):
        gold = {title for title, _ in record["supporting_facts"]}
        both += gold <= {p.title for p in hits10}
        anyone += bool(gold & {p.title for p in hits3})
    recall_both, recall_any = both / len(records), anyone / len(records)
    print(f"hotpotqa recall: both supporting titles @10 = {recall_both:.2f}, any @3 = {recall_any:.2f}")
    assert recall_both >= RECALL_BOTH_AT_10
    assert recall_any >= RECALL_ANY_AT_3


def test_scores_match_rank_bm25(corpus: Path) -> None:
    """bm25s atire (tf) + robertson (idf) is rank_bm25's BM25Okapi with epsilon=0, fed the same tokens."""
    import bm25s
    from rank_bm25 import BM25Okapi

    texts = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()[:300]]
    tokenizer = make_tokenizer()
    docs = tokenizer.tokenize(texts, update_vocab=True, return_as="string", show_progress=False)
    reference = BM25Okapi(docs, k1=1.5, b=0.75, epsilon=0)
    ours = bm25s.BM25(method="atire", idf_method="robertson", k1=1.5, b=0.75)
    ours.index(docs, show_progress=False)
    queries = [r["question"] for r in _records()[:20]]
    for query in tokenizer.tokenize(queries, update_vocab=False, return_as="string", show_progress=False):
        expected = reference.get_scores(query)
        got = ours.get_scores(query)
        assert np.abs(expected).max() > 1
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


# -- engine --------------------------------------------------------------------------------------------------------


def test_postings_kernel_gives_bm25s_own_scores(engine: SearchEngine) -> None:
    """The engine's kernel over the touched postings and bm25s's dense retrieve over every passage agree on every
    question of the sample: the same scores, and the same passages wherever the scores are not tied."""
    questions = [record["question"] for record in _records()]
    queries = [list(ids) for ids in engine._tokenizer.streaming_tokenize(questions, update_vocab=False)]
    scores = engine.retriever.scores
    ours = batch_topk(scores["indptr"], scores["indices"], scores["data"], engine.passages, queries, 10, n_threads=2)
    rows, values = engine.retriever.retrieve(queries, k=10, show_progress=False)
    for (our_rows, our_scores), their_rows, their_scores in zip(ours, rows, values, strict=True):
        theirs = [(int(r), float(v)) for r, v in zip(their_rows, their_scores, strict=True) if v > 0]
        assert np.allclose(our_scores, [v for _, v in theirs], rtol=1e-6)
        untied = [r for r, v in theirs if [u for _, u in theirs].count(v) == 1]
        assert set(untied) <= set(our_rows)


def test_postings_kernel_ties_order_and_small_cases() -> None:
    """Hand-made CSC postings: term 0 in documents 1, 3 (0.5 each), term 1 in documents 0, 3 (0.25, 1.0)."""
    indptr, indices = np.array([0, 2, 4]), np.array([1, 3, 0, 3])
    data = np.array([0.5, 0.5, 0.25, 1.0], dtype=np.float32)
    assert batch_topk(indptr, indices, data, 5, [[0]], 1) == [([1], [0.5])]  # a tie: the lower document
    assert batch_topk(indptr, indices, data, 5, [[0, 1]], 5) == [([3, 1, 0], [1.5, 0.5, 0.25])]  # 3 found of 5
    assert batch_topk(indptr, indices, data, 5, [[0, 0]], 2) == [([1, 3], [1.0, 1.0])]  # a repeated term counts twice
    assert batch_topk(indptr, indices, data, 5, [[], [1]], 2, n_threads=2) == [([], []), ([3, 0], [1.0, 0.25])]
    with pytest.raises(ValueError, match="k must be >= 1"):
        batch_topk(indptr, indices, data, 5, [[0]], 0)


def test_postings_kernel_lists_each_passage_once_whatever_its_terms_contribute() -> None:
    """bm25s stores zero contributions (``atire``: a term in every passage has idf 0) and negative ones
    (``robertson``: a term in most passages): repeated such terms once counted a passage as new on every visit,
    past the end of the per-thread list. Term 0 is in every passage with 0.0, term 1 adds 1.0 to passage 0 and
    -0.5 to passage 2."""
    indptr, indices = np.array([0, 3, 5]), np.array([0, 1, 2, 0, 2])
    data = np.array([0.0, 0.0, 0.0, 1.0, -0.5], dtype=np.float32)
    scratch = Scratch(3, 1)
    for _ in range(3):  # the buffers are clean again after every call
        assert batch_topk(indptr, indices, data, 3, [[0, 0, 0, 0, 1, 1]], 3, scratch=scratch) == [([0], [2.0])]
        assert batch_topk(indptr, indices, data, 3, [[0] * 10], 3, scratch=scratch) == [([], [])]
    assert not scratch.scores.any() and not scratch.seen.any()


@pytest.mark.parametrize("method", ["atire", "robertson"])
def test_the_engine_with_methods_that_store_zero_or_negative_weights(tmp_path: Path, method: str) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": str(i), "contents": f'"Doc {i}"\ncommonword {"rare" if i == 3 else "filler"} text {i}'}
        for i in range(50)
    ]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    build_index(corpus, tmp_path / "index", method=method)
    engine = SearchEngine(tmp_path / "index")
    try:
        assert engine.postings_kernel
        (hits,) = engine.hits(["commonword commonword rare"], 5)
        assert [engine.document(h.row)["id"] for h in hits][:1] == ["3"] and all(h.score > 0 for h in hits)
    finally:
        engine.close()


def test_engine_edge_cases(engine: SearchEngine) -> None:
    results = engine.search(["", "   \n\t", "the of and is", "Radio City Music Hall", "xqzvw kbrrt"], 5)
    assert results[0] == [] and results[1] == [] and results[2] == [] and results[4] == []
    assert 1 <= len(results[3]) <= 5
    assert [p.score for p in results[3]] == sorted((p.score for p in results[3]), reverse=True)
    assert len(engine.search(["film"], 10_000)[0]) <= engine.max_topk
    with pytest.raises(ValueError, match="topk must be >= 1"):
        engine.search(["film"], 0)
    assert engine.search([], 3) == []


def test_topk_capped_at_corpus_size(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": i, "contents": f'"T{i}"\napple pie number {i}'}) + "\n" for i in range(3))
    )
    build_index(corpus, tmp_path / "idx")
    small = SearchEngine(tmp_path / "idx")
    try:
        hits = small.search(["apple"], 10)[0]
        assert sorted(p.doc_id for p in hits) == ["0", "1", "2"]
        assert hits[0].title.startswith("T")
    finally:
        small.close()


def test_engine_refuses_missing_index(tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError, match="no BM25 index at"):
        SearchEngine(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    with pytest.raises(IndexLoadError, match=r"manifest\.json not found"):
        SearchEngine(tmp_path / "half")


# -- index builder ----------------------------------------------------------------------------------------------


def test_index_manifest_and_atomic_layout(index_dir: Path, corpus: Path) -> None:
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["passages"] == 994
    assert manifest["engine"] == "bm25s" and manifest["engine_version"] == "0.3.16"
    assert manifest["params"] == {"method": "lucene", "k1": 0.9, "b": 0.4, "stopwords": "en", "stemmer": "english"}
    assert manifest["corpus"]["bytes"] == corpus.stat().st_size and len(manifest["corpus"]["sha256"]) == 64
    assert not [p for p in index_dir.parent.iterdir() if ".tmp-" in p.name]
    with pytest.raises(IndexExistsError, match="already exists; pass --force"):
        build_index(corpus, index_dir)


def test_index_builds_the_wiki18_sample(tmp_path: Path) -> None:
    manifest = build_index(WIKI18, tmp_path / "wiki")
    assert manifest["passages"] == 1000
    wiki = SearchEngine(tmp_path / "wiki")
    try:
        first = json.loads(WIKI18.read_text().splitlines()[0])
        top = wiki.search(["Evan Morris lobbyist Genentech Roche"], 3)[0][0]
        assert top.doc_id == first["id"] and top.title == "Evan Morris"
    finally:
        wiki.close()


def test_index_skip_bad_lines_and_empty_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"A\\"\\nalpha beta"}\n{broken\n\n{"id": "2"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: not valid JSON"):
        build_index(corpus, tmp_path / "strict")
    assert not (tmp_path / "strict").exists()
    manifest = build_index(corpus, tmp_path / "lenient", skip_bad=True)
    assert manifest["passages"] == 1 and manifest["bad_lines_skipped"] == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CorpusError, match="no passage to index"):
        build_index(empty, tmp_path / "e")
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "no such corpus file"),
        ("malformed", "bad.jsonl:2: 'contents' is missing or not a string; fix the line or rerun with --skip-bad"),
        ("exists", "already exists; pass --force"),
    ],
)
def test_index_cli_errors(tmp_path: Path, setup: str, expected: str) -> None:
    corpus = tmp_path / "bad.jsonl"
    out = tmp_path / "out"
    if setup == "malformed":
        corpus.write_text('{"id": 1, "contents": "x"}\n{"id": 2, "text": "no contents"}\n')
    elif setup == "exists":
        corpus.write_text('{"id": 1, "contents": "x"}\n')
        out.mkdir()
    done = run_module("recipe.search.index", "--corpus", str(corpus), "--out", str(out), "--no-progress")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], done.stderr


def test_server_cli_missing_index(tmp_path: Path) -> None:
    done = run_module("recipe.search.server", "--index", str(tmp_path / "nowhere"), "--port", str(free_port()))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no BM25 index at {tmp_path / 'nowhere'}" in lines[0], done.stderr


# -- server ------------------------------------------------------------------------------------------------------


def test_health(server: LiveServer) -> None:
    body = httpx.get(f"{server.base}/health").json()
    assert body["status"] == "ok" and body["passages"] == 994
    assert body["index"]["params"]["method"] == "lucene"


def test_retrieve_shape(server: LiveServer, engine: SearchEngine) -> None:
    queries = ["Radio City Music Hall", "", "Arthur's Magazine"]
    body = httpx.post(server.url, json={"queries": queries, "topk": 2, "return_scores": True}).json()
    assert list(body) == ["result"] and len(body["result"]) == 3
    assert body["result"][1] == []
    for hits, expected in zip(body["result"], engine.search(queries, 2), strict=True):
        assert [set(h) for h in hits] == [{"document", "score"}] * len(hits)
        assert [set(h["document"]) for h in hits] == [{"id", "contents"}] * len(hits)
        assert [h["document"]["id"] for h in hits] == [p.doc_id for p in expected]
        assert [h["score"] for h in hits] == pytest.approx([p.score for p in expected])
    bare = httpx.post(server.url, json={"queries": queries[:1], "topk": 2, "return_scores": False}).json()
    assert bare["result"] == [[h["document"] for h in body["result"][0]]]
    default = httpx.post(server.url, json={"queries": ["Radio City Music Hall"]}).json()
    assert len(default["result"][0]) == 3  # --default-topk


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "request body is not valid JSON"),
        (b"[1, 2]", 422, "request body: expected a JSON object"),
        (b'{"topk": 3}', 422, "queries: Field required"),
        (b'{"queries": "one string"}', 422, "queries: Input should be a valid list"),
        (b'{"queries": ["ok", 7]}', 422, "queries[1]: Input should be a valid string"),
        (b'{"queries": ["q"], "topk": 0}', 422, "topk: must be between 1 and 50"),
        (b'{"queries": ["q"], "topk": 51}', 422, "topk: must be between 1 and 50"),
        (b'{"queries": ["q"], "topk": "3"}', 422, "topk: Input should be a valid integer"),
        (json.dumps({"queries": ["q"] * 201}).encode(), 413, "queries: 201 queries in one request, the limit is 200"),
        (json.dumps({"queries": ["ok", "x" * 1001]}).encode(), 413, "queries[1]: 1001 characters, the limit is 1000"),
    ],
)
def test_retrieve_rejects_bad_requests(server: LiveServer, body: bytes, status: int, message: str) -> None:
    response = httpx.post(server.url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]


def test_concurrent_requests_are_coalesced(server: LiveServer, engine: SearchEngine) -> None:
    questions = [r["question"] for r in _records()]
    stats = server.app.state.batcher.stats
    before_batches, before_requests = stats.batches, stats.requests

    async def one_each() -> list[dict]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(
                *(client.post(server.url, json={"queries": [q], "topk": 5}) for q in questions)
            )
        return [r.json() for r in responses]

    answers = asyncio.run(one_each())
    expected = engine.search(questions, 5)
    for answer, passages in zip(answers, expected, strict=True):
        assert [h["document"]["id"] for h in answer["result"][0]] == [p.doc_id for p in passages]
    batches, requests = stats.batches - before_batches, stats.requests - before_requests
    print(f"coalescing: {requests} concurrent requests in {batches} engine calls")
    assert requests == len(questions)
    assert batches < requests / 4


# -- client ------------------------------------------------------------------------------------------------------


def test_client_results_and_several_loops(server: LiveServer, engine: SearchEngine) -> None:
    client = RetrievalClient(server.url)
    queries = ["Radio City Music Hall", "  ", "Arthur's Magazine"]

    async def search() -> list:
        try:
            return await client.search(queries, 3)
        finally:
            await client.aclose()

    first = asyncio.run(search())
    second = asyncio.run(search())  # a new event loop: a new httpx client under the hood
    assert first == second
    expected = engine.search(queries, 3)
    assert [[p.doc_id for p in hits] for hits in first] == [[p.doc_id for p in hits] for hits in expected]
    assert first[1] == []
    assert first[0][0].title and first[0][0].text and first[0][0].score == pytest.approx(expected[0][0].score)


def test_client_does_not_retry_4xx(server: LiveServer) -> None:
    client = RetrievalClient(server.url, retries=3, backoff_s=5.0)

    async def search() -> None:
        try:
            await client.search(["q"], 0)
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(RetrievalError, match=r"rejected with 422: topk: must be between 1 and 50 \(--max-topk\)"):
        asyncio.run(search())
    assert time.monotonic() - started < 2  # a retry would have slept 5 s


def test_client_retries_5xx(server: LiveServer, engine: SearchEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine.hits
    calls = {"n": 0}

    def flaky(queries: list[str], topk: list[int]) -> list:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("disk hiccup")
        return real(queries, topk)

    monkeypatch.setattr(engine, "hits", flaky)
    client = RetrievalClient(server.url, retries=2, backoff_s=0.01)

    async def search() -> list:
        try:
            return await client.search(["Radio City Music Hall"], 1)
        finally:
            await client.aclose()

    assert len(asyncio.run(search())[0]) == 1
    assert calls["n"] == 2


def test_client_gives_up_on_refused_connection() -> None:
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    client = RetrievalClient(url, retries=2, backoff_s=0.01)

    async def search() -> None:
        try:
            await client.search(["q"], 3)
        finally:
            await client.aclose()

    with pytest.raises(RetrievalError) as caught:
        asyncio.run(search())
    message = str(caught.value)
    assert url in message and "connection failed (ConnectError" in message and "gave up after 3 attempts" in message
