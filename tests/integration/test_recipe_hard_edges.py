"""The red-team findings of issue 24 in the recipe: the retrieval server's
request limits and timeouts (S6 body size, S7 slowloris and the connection cap, S10 unknown request keys) and
the data preparation's bad inputs (D2-D7, and D8 for the evaluation that shares its readers).

The server runs in a thread on loopback over a stand-in engine (no index, no numba), with small limits and short
timeouts configured here instead of GiB bodies and minutes of waiting; every socket has a timeout and is closed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from conftest import REPO, fixture_path

from recipe import eval_hotpotqa
from recipe import prepare_data as pd
from recipe.search import server as search_server
from recipe.search.engine import Hit

TWOWIKI = fixture_path("recipe", "2wiki_500_first100.jsonl")


# ---------------------------------------------------------------- the retrieval server


class StandInEngine:
    """What create_app needs of a SearchEngine: one passage per query, scored 1.0 (``padding`` more bytes long)."""

    passages = 1

    def __init__(self, padding: int = 0) -> None:
        self.contents = "Evan Morris\nA lobbyist." + "." * padding

    def hits(self, queries: Sequence[str], topk: int | Sequence[int]) -> list[list[Hit]]:
        return [[Hit(row=0, score=1.0)] for _ in queries]

    def document(self, row: int) -> dict[str, Any]:
        return {"id": "0", "contents": self.contents}

    def info(self) -> dict[str, Any]:
        return {"stand_in": True}


class Live:
    def __init__(self, settings: search_server.Settings, padding: int = 0) -> None:
        import uvicorn

        app = search_server.create_app(StandInEngine(padding), settings)  # type: ignore[arg-type]
        self.server = uvicorn.Server(
            search_server.uvicorn_config(app, settings, host="127.0.0.1", port=0, log_level="critical")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"

    def connections(self) -> int:
        return len(self.server.server_state.connections)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[Live]:
    limits = dict(getattr(request, "param", {}))
    padding = limits.pop("padding", 0)
    server = Live(search_server.Settings(**limits), padding)
    try:
        yield server
    finally:
        server.stop()


def connect(live: Live) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=5)
    sock.settimeout(5)
    return sock


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """All bytes the server sends until it closes the connection, and the seconds that took; fails after
    ``limit_s`` if the server keeps the connection open."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server still holds the connection after {limit_s} s (got {data[:200]!r})")
    except ConnectionResetError:
        pass
    return data, time.monotonic() - started


def head(path: str, length: int | None = None, extra: str = "") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


@pytest.mark.parametrize("live", [dict(max_body_bytes=1024)], indirect=True)
def test_s6_a_declared_body_over_the_limit_is_refused_unread(live: Live) -> None:
    with connect(live) as sock:
        sock.sendall(head("/retrieve", 800 * 1024 * 1024))  # 800 MiB announced, none sent
        data, _ = read_until_closed(sock, 5)
    assert data.startswith(b"HTTP/1.1 413 "), data
    assert b"1024 bytes" in data and b"--max-body-bytes" in data


@pytest.mark.parametrize("live", [dict(max_body_bytes=1024, max_query_chars=100_000)], indirect=True)
def test_s6_a_chunked_body_is_capped_while_it_streams(live: Live) -> None:
    body = json.dumps({"queries": ["x" * 4000]}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 256):
            yield body[start : start + 256]

    response = httpx.post(
        f"{live.base}/retrieve", content=chunks(), headers={"content-type": "application/json"}, timeout=5
    )
    assert response.status_code == 413, response.text
    assert "request body over 1024 bytes" in response.json()["detail"]
    small = httpx.post(f"{live.base}/retrieve", json={"queries": ["Evan Morris"]}, timeout=5)
    assert small.status_code == 200 and small.json()["result"][0][0]["score"] == 1.0


@pytest.mark.parametrize("live", [dict(max_body_bytes=1000, max_body_bytes_in_flight=1500)], indirect=True)
def test_s6_bodies_in_flight_together_are_capped(live: Live) -> None:
    body = json.dumps({"queries": ["Evan Morris " + "x" * 900]}).encode()
    with connect(live) as first, connect(live) as second:
        first.sendall(head("/retrieve", len(body)) + body[:800])  # 800 bytes held, the rest not sent yet
        time.sleep(0.2)
        second.sendall(head("/retrieve", len(body)) + body)  # 800 + 930 > 1500
        refused, _ = read_until_closed(second, 5)
        assert refused.startswith(b"HTTP/1.1 503 "), refused
        assert b"--max-body-bytes-in-flight" in refused
        first.sendall(body[800:])
        answered = first.recv(65536)
        assert answered.startswith(b"HTTP/1.1 200 "), answered
    after = httpx.post(f"{live.base}/retrieve", content=body, headers={"content-type": "application/json"}, timeout=5)
    assert after.status_code == 200  # the budget is given back


@pytest.mark.parametrize("live", [dict(header_timeout_s=0.5)], indirect=True)
def test_s7_an_idle_connection_is_closed_after_the_header_timeout(live: Live) -> None:
    with connect(live) as sock:
        data, took = read_until_closed(sock, 5)
    assert took < 3 and (data == b"" or data.startswith(b"HTTP/1.1 408 ")), data


@pytest.mark.parametrize("live", [dict(header_timeout_s=0.6)], indirect=True)
def test_s7_a_trickled_header_does_not_extend_the_header_timeout(live: Live) -> None:
    with connect(live) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        closed = False
        for n in range(40):  # a header line every 0.1 s, for at most 4 s
            try:
                sock.sendall(f"X-Slow-{n}: 1\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if n > 25:
                break
        if not closed:
            data, _ = read_until_closed(sock, 3)
            assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data
        assert time.monotonic() - started < 3.5


@pytest.mark.parametrize("live", [dict(body_timeout_s=0.5)], indirect=True)
def test_s7_a_partial_body_is_answered_408_after_the_body_timeout(live: Live) -> None:
    with connect(live) as sock:
        sock.sendall(head("/retrieve", 100) + b'{"queries": ')
        data, took = read_until_closed(sock, 5)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert took < 3


@pytest.mark.parametrize("live", [dict(keep_alive_s=0.5)], indirect=True)
def test_s7_a_kept_alive_connection_is_closed_when_idle(live: Live) -> None:
    with connect(live) as sock:
        body = b'{"queries": ["Evan Morris"]}'
        sock.sendall(head("/retrieve", len(body)) + body)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 "), first
        _, took = read_until_closed(sock, 5)
    assert took < 3


@pytest.mark.parametrize("live", [dict(send_timeout_s=0.5, keep_alive_s=0.5, padding=4000)], indirect=True)
def test_s7_a_client_that_never_reads_its_answer_is_dropped(live: Live) -> None:
    body = json.dumps({"queries": [f"q{i}" for i in range(4000)]}).encode()  # a 16 MB answer
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", live.port))
        sock.sendall(head("/retrieve", len(body)) + body)
        deadline = time.monotonic() + 6
        while live.connections() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live.connections() == 0, "the server still holds a connection whose answer is not read"
    finally:
        sock.close()


@pytest.mark.parametrize("live", [dict(max_connections=6, header_timeout_s=30, body_timeout_s=30)], indirect=True)
def test_s7_the_connection_cap_evicts_stalled_connections_and_health_answers(live: Live) -> None:
    held: list[socket.socket] = []
    try:
        for n in range(16):  # idle, partial-header and partial-body connections, over twice the cap
            sock = connect(live)
            held.append(sock)
            if n % 3 == 1:
                sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            elif n % 3 == 2:
                sock.sendall(head("/retrieve", 100) + b"{")
            time.sleep(0.02)
            assert live.connections() <= 6
        health = httpx.get(f"{live.base}/health", timeout=3)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert live.connections() <= 6
    finally:
        for sock in held:
            sock.close()


# the server of the S7 repro under a low open-files limit, in its own process (the limit is per process)
LOW_FD_SERVER = """
import resource, sys, uvicorn
from recipe.search import server
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
class Engine:
    passages = 1
    def info(self): return {}
settings = server.Settings(max_connections=server.default_max_connections(), header_timeout_s=60, body_timeout_s=60)
config = server.uvicorn_config(server.create_app(Engine(), settings), settings, host="127.0.0.1", port=int(sys.argv[1]),
                               log_level="critical")
uvicorn.Server(config).run()
"""


def test_s7_a_low_open_files_limit_still_answers_health_under_300_stalled_connections() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", LOW_FD_SERVER, str(port)], cwd=REPO, env=env)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
                time.sleep(0.1)
        for n in range(300):  # more than the process's 128 open files, half of them mid-head
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(sock)
            if n % 2:
                sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=3)
        assert health.status_code == 200
        assert health.json()["settings"]["max_connections"] == 64  # half the open-files limit
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_s7_limits_are_configurable_on_the_command_line() -> None:
    args = search_server.build_parser().parse_args(
        [
            *("--index", "x", "--max-body-bytes", "2048", "--header-timeout", "3", "--body-timeout", "4"),
            *("--keep-alive", "2", "--max-connections", "50", "--max-body-bytes-in-flight", "9999"),
            *("--send-timeout", "7"),
        ]
    )
    settings = search_server.settings_from(args)
    assert (settings.max_body_bytes, settings.header_timeout_s, settings.body_timeout_s) == (2048, 3.0, 4.0)
    assert (settings.keep_alive_s, settings.max_connections, settings.max_body_bytes_in_flight) == (2.0, 50, 9999)
    assert settings.send_timeout_s == 7.0
    default = search_server.settings_from(search_server.build_parser().parse_args(["--index", "x"]))
    assert default.max_connections == search_server.default_max_connections() >= 1


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"queries": ["Evan Morris"], "top_k": 10}, "top_k"),
        ({"queries": ["Evan Morris"], "return_score": False}, "return_score"),
        ({"queries": ["Evan Morris"], "topk": 1, "query": "x"}, "query"),
        ({"query": "Evan Morris"}, "query"),
    ],
)
def test_s10_an_unknown_request_key_is_a_422_naming_it(live: Live, body: dict[str, Any], key: str) -> None:
    response = httpx.post(f"{live.base}/retrieve", json=body, timeout=5)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(f"{key}: unknown key"), detail
    assert "queries, topk, return_scores" in detail


# ---------------------------------------------------------------- prepare_data and eval_hotpotqa


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def deep_json(depth: int) -> str:
    return '{"question": "q", "answer": "a", "x": ' + "[" * depth + "]" * depth + "}"


def good_pair(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    out = tmp_path / "out"
    assert pd.main(["--2wiki", str(TWOWIKI), "--out", str(out), "--train-size", "50", "--val-size", "5"]) == 0
    return out, (out / "train.parquet").read_bytes(), (out / "val.parquet").read_bytes()


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_d2_deeply_nested_json_is_one_error_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    record = deep_json(100_000)
    path = tmp_path / f"deep{suffix}"
    text = '{"question": "fine", "answer": "a"}\n' + record + "\n"
    path.write_text(text if suffix == ".jsonl" else "[" + text.replace("\n", ",\n", 1) + "]", encoding="utf-8")
    assert pd.main(["--hotpotqa", str(path), "--out", str(tmp_path / "out")]) == 2
    err = one_error(capsys)
    assert f"{path} line 2: JSON nested too deeply" in err
    assert not (tmp_path / "out").exists()


def test_d3_a_lone_surrogate_is_one_error_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for field, record in (
        ("question", '{"question": "who \\ud800?", "answer": "a"}'),
        ("answer", '{"question": "who?", "answer": "\\udfff"}'),
        ("_id", '{"_id": "\\ud800", "question": "who?", "answer": "a"}'),
    ):
        path = tmp_path / f"surrogate_{field}.jsonl"
        path.write_text('{"question": "fine", "answer": "a"}\n' + record + "\n", encoding="utf-8")
        assert pd.main(["--hotpotqa", str(path), "--out", str(tmp_path / "out")]) == 2
        err = one_error(capsys)
        assert f"{path} line 2: '{field}' holds a lone surrogate" in err, err
    assert not (tmp_path / "out").exists()


def test_d4_a_huge_integer_id_is_one_error_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digits = "9" * 5000
    jsonl = tmp_path / "huge_int_id.jsonl"
    jsonl.write_text('{"question": "q0", "answer": "a"}\n{"id": ' + digits + ', "question": "q", "answer": "a"}\n')
    listed = tmp_path / "huge_int_id.json"
    listed.write_text('[{"question": "q0", "answer": "a"},\n{"id": ' + digits + ', "question": "q", "answer": "a"}]')
    for path in (jsonl, listed):
        assert pd.main(["--2wiki", str(path), "--out", str(tmp_path / "out")]) == 2
        err = one_error(capsys)
        assert f"{path} line 2: an integer of more than 4300 digits" in err, err
    nested = tmp_path / "nested_id.jsonl"
    nested.write_text('{"id": [[1]], "question": "q", "answer": "a"}\n{"id": NaN, "question": "q2", "answer": "a"}\n')
    with pytest.raises(pd.DataError, match=r"nested_id.jsonl line 1: 'id' must be a string or an integer, got list"):
        pd.load_items(str(nested), "--2wiki", pd.TWOWIKI)
    nested.write_text('{"id": NaN, "question": "q2", "answer": "a"}\n')
    with pytest.raises(pd.DataError, match=r"nested_id.jsonl line 1: 'id' is not a finite number"):
        pd.load_items(str(nested), "--2wiki", pd.TWOWIKI)
    big = tmp_path / "bigint_id.jsonl"
    big.write_text('{"id": ' + "9" * 400 + ', "question": "q", "answer": "a"}\n')
    assert pd.load_items(str(big), "--2wiki", pd.TWOWIKI)[0].id == "9" * 400


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999", '["ok", NaN]'])
def test_d5_a_nan_or_infinite_answer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    path = tmp_path / "nan.jsonl"
    path.write_text('{"question": "fine", "answer": "a"}\n{"question": "q", "answer": ' + value + "}\n")
    assert pd.main(["--hotpotqa", str(path), "--out", str(tmp_path / "out")]) == 2
    err = one_error(capsys)
    assert f"{path} line 2: 'answer' is not a finite number" in err, err


@pytest.mark.parametrize("content", ["", "\n  \n", "[]"])
def test_d6_an_empty_input_leaves_the_good_pair_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    out, train, val = good_pair(tmp_path)
    capsys.readouterr()
    blank = tmp_path / ("blank.json" if content == "[]" else "blank.jsonl")
    blank.write_text(content)
    assert pd.main(["--hotpotqa", str(blank), "--out", str(out)]) == 2
    err = one_error(capsys)
    assert f"--hotpotqa {blank}: no records" in err and "nothing written" in err
    assert (out / "train.parquet").read_bytes() == train and (out / "val.parquet").read_bytes() == val
    assert sorted(os.listdir(out)) == ["train.parquet", "val.parquet"]


def test_d6_one_empty_input_of_two_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blank = tmp_path / "blank.jsonl"
    blank.write_text("")
    assert pd.main(["--hotpotqa", str(blank), "--2wiki", str(TWOWIKI), "--out", str(tmp_path / "out")]) == 2
    assert f"--hotpotqa {blank}: no records" in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_d7_a_train_that_cannot_be_replaced_leaves_the_old_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _, val = good_pair(tmp_path)
    (out / "train.parquet").unlink()
    (out / "train.parquet").mkdir()
    (out / "train.parquet" / "keep").write_text("x")
    capsys.readouterr()
    assert pd.main(["--2wiki", str(TWOWIKI), "--out", str(out), "--seed", "7"]) != 0
    assert "Traceback" not in capsys.readouterr().err
    assert (out / "val.parquet").read_bytes() == val
    assert sorted(os.listdir(out)) == ["train.parquet", "val.parquet"]


def test_d7_a_failing_second_replace_rolls_the_first_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, train, val = good_pair(tmp_path)
    real_replace = os.replace
    calls: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append(Path(dst).name)
        if Path(dst).name == "train.parquet" and "train.parquet" not in calls[:-1]:
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert pd.main(["--2wiki", str(TWOWIKI), "--out", str(out), "--seed", "7"]) == 1
    monkeypatch.undo()
    assert calls[0] == "val.parquet"  # val first: the rollback below puts the old one back
    assert (out / "train.parquet").read_bytes() == train and (out / "val.parquet").read_bytes() == val
    assert sorted(os.listdir(out)) == ["train.parquet", "val.parquet"]
    assert pd.main(["--2wiki", str(TWOWIKI), "--out", str(out), "--seed", "7"]) == 0
    assert pq.read_table(out / "val.parquet").num_rows == 100 - pq.read_table(out / "train.parquet").num_rows


@pytest.mark.parametrize("kind", ["deep", "huge_int"])
def test_d8_eval_hotpotqa_shares_the_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    data = tmp_path / "dev.jsonl"
    bad = deep_json(100_000) if kind == "deep" else '{"_id": ' + "7" * 5000 + ', "question": "q", "answer": "a"}'
    data.write_text('{"question": "fine", "answer": "a"}\n' + bad + "\n")
    code = eval_hotpotqa.main(["--data", str(data), "--model", "m", "--out", str(tmp_path / "run")])
    err = one_error(capsys)
    assert code == 2
    expected = "JSON nested too deeply" if kind == "deep" else "an integer of more than 4300 digits"
    assert f"{data} line 2: {expected}" in err, err


def test_d3_a_lone_surrogate_from_the_model_does_not_lose_the_evaluation(tmp_path: Path) -> None:
    from recipe import eval_run

    records = [{"id": "1", "prediction": "caf\u00e9 \ud800", "em": 0.0}]
    eval_run.write_outputs(tmp_path, records, {"questions": 1, "note": "\udfff"})
    line = (tmp_path / "predictions.jsonl").read_text(encoding="utf-8")
    assert json.loads(line)["prediction"] == "caf\u00e9 \ud800"  # escaped as \ud800, valid UTF-8 on disk
    assert json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))["note"] == "\udfff"
