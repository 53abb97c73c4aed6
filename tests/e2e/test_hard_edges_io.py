"""Issue 24's I/O findings (shared/docs/hard-edges-2026-12.md): each test failed before its fix.

H1/H2/H3: the tail on a symlink loop, a FIFO renamed over the metrics file, a symlink to /dev/zero.
H11/HR5: one capped line reader for rollout dumps (replay --rollouts, report, the live guardian).
HR3: finite extremes in the report's plots. HR4: ``report -o`` refuses non-regular paths.
H12: the exporter's connections are capped and time out. H13: stored trainer text is escaped for the terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path

import orjson
import pytest
from conftest import events

from guardian.cli import EXIT_ERROR, EXIT_OK, main
from guardian.config import ChecksConfig, GuardianConfig, SourcesConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.keys import SAMPLES_KEY, Signal
from guardian.report.series import Plot, Trace
from guardian.report.svg import nice_ticks, plot_svg
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE
from guardian.sinks import exposition
from guardian.sinks.prometheus import serve, shutdown
from guardian.sources.jsonl import MetricsFile
from guardian.sources.rollouts import RolloutDir, dump_rows, read_finished
from guardian.sources.tail import LineTail, NewSegment
from guardian.store import Store

NOW = 1_800_000_000.0
LINE = b'{"step":%d,"data":{"actor/entropy":0.5}}\n'


def polled_in_a_thread(tail: LineTail | MetricsFile, fifo: Path, seconds: float = 5.0) -> object:
    """``tail.poll()`` from a thread; fails (and unblocks the thread) if it does not return in ``seconds``."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(tail.poll()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # a writer lets the blocked open() return
        os.close(fd)
        thread.join(5)
        pytest.fail("poll() blocked on a FIFO")
    return result[0]


# ------------------------------------------------------------------------------------------------ H1: loops


def test_h1_a_symlink_loop_is_an_error_naming_it_and_no_exception(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    loop_a, loop_b = tmp_path / "loopA", tmp_path / "loopB"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    tail = LineTail(loop_a)
    for _ in range(3):
        assert tail.poll().items == []
    (line,) = events(logs, "metrics_file_unusable")  # said once, not once a poll
    assert str(loop_a) in line and "symlink loop" in line
    assert tail.problem is not None and "symlink loop" in tail.problem


def test_h1_watch_on_a_symlink_loop_is_one_line_not_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    (tmp_path / "loopA").symlink_to(tmp_path / "loopB")
    (tmp_path / "loopB").symlink_to(tmp_path / "loopA")
    code = main(["watch", "--metrics", str(tmp_path / "loopA"), "--no-live", "--max-ticks", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert "internal_error" not in err and "symlink loop" in err and str(tmp_path / "loopA") in err


# ------------------------------------------------------------------------------------------------ H2: FIFOs


def test_h2_a_fifo_renamed_over_the_metrics_file_never_blocks_and_is_reported(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(LINE % 1 + LINE % 2)
    source = MetricsFile(metrics)
    first = source.poll()
    assert [r.step for r in first.items if isinstance(r, StepRecord)] == [1, 2]
    fifo = tmp_path / "f2"
    with metrics.open("ab") as out:
        out.write(LINE % 3)  # written before the rename: still read from the old file
    os.mkfifo(fifo)
    os.replace(fifo, metrics)
    second = polled_in_a_thread(source, metrics)
    assert [r.step for r in second.items if isinstance(r, StepRecord)] == [3]  # type: ignore[attr-defined]
    for _ in range(3):
        assert polled_in_a_thread(source, metrics).items == []  # type: ignore[attr-defined]
    (line,) = events(logs, "metrics_file_unusable")
    assert str(metrics) in line and "FIFO" in line
    # a regular file comes back: read on, as a new segment
    metrics.unlink()
    metrics.write_bytes(LINE % 4)
    back = source.poll()
    assert isinstance(back.items[0], NewSegment) and [r.step for r in back.items[1:]] == [4]  # type: ignore[union-attr]


def test_h2_a_fifo_at_the_start_is_refused_without_blocking(tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    tail = LineTail(fifo)
    assert polled_in_a_thread(tail, fifo).items == []  # type: ignore[attr-defined]
    (line,) = events(logs, "metrics_file_unusable")
    assert str(fifo) in line and "FIFO" in line


def test_h2_guardian_watch_on_a_metrics_file_replaced_by_a_fifo_stops_on_sigterm(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(b"".join(LINE % step for step in range(1, 4)))
    config = tmp_path / "g.yaml"
    config.write_text("sources:\n  poll_interval_s: 0.05\n  idle_poll_max_s: 0.1\n")
    home = tmp_path / "home"
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    command = [sys.executable, "-m", "guardian", "watch", "--config", str(config), "--metrics", str(metrics)]
    watch = subprocess.Popen(
        [*command, "--run-id", "fifo", "--no-live"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (home / "guardian.db").exists():
                with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
                    if store.count_steps("fifo") >= 3:
                        break
            time.sleep(0.1)
        fifo = tmp_path / "m.jsonl.fifo"
        os.mkfifo(fifo)
        os.replace(fifo, metrics)
        time.sleep(1.0)  # several polls with the FIFO in place
        watch.send_signal(signal.SIGTERM)
        try:
            _, err = watch.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            watch.kill()  # only SIGKILL ends an open() blocked on a FIFO
            watch.communicate(timeout=10)
            pytest.fail("guardian watch ignored SIGTERM while its metrics path was a FIFO")
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
    text = err.decode()
    assert "event=metrics_file_unusable" in text and "FIFO" in text, text[-2000:]
    assert "Traceback" not in text


# ------------------------------------------------------------------------------------------------ H3: devices


def test_h3_a_symlink_to_dev_zero_makes_no_segments_and_reads_nothing(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(LINE % 1)
    tail = LineTail(metrics, max_poll_bytes=4096)
    assert [type(i) for i in tail.poll().items] == [NewSegment, bytes]
    link = tmp_path / "z2"
    link.symlink_to("/dev/zero")
    os.replace(link, metrics)
    items = [item for _ in range(20) for item in tail.poll().items]
    assert not any(isinstance(item, NewSegment) for item in items)  # no attempt row per poll
    assert items == []
    (line,) = events(logs, "metrics_file_unusable")
    assert str(metrics) in line and "character device" in line


# ------------------------------------------------------------------------------------------------ H11/HR5: dumps


def _dump_with_a_long_line(folder: Path, step: int, long_bytes: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{step}.jsonl"
    rows = [{"uid": f"g_{i}_0", "input": "q", "score": float(i % 2)} for i in range(4)]
    with path.open("wb") as out:
        out.write(orjson.dumps(rows[0]) + b"\n" + orjson.dumps(rows[1]) + b"\n")
        out.write(b'{"input": "' + b"x" * long_bytes + b'", "score": 1.0}\n')
        out.write(orjson.dumps(rows[2]) + b"\n" + orjson.dumps(rows[3]) + b"\n")
    return path


def test_h11_a_dump_line_over_the_cap_is_skipped_naming_file_and_line_never_held_whole(tmp_path: Path) -> None:
    path = _dump_with_a_long_line(tmp_path / "dumps", 7, 16 << 20)
    problems: list[str] = []
    tracemalloc.start()
    try:
        with path.open("rb") as handle:
            rows = list(dump_rows(handle, path.stat().st_size, path, problems, max_line_bytes=64 << 10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 4  # the rows around it are kept
    assert problems == [f"{path}:3: line longer than {64 << 10} bytes, skipped"]
    assert peak < 4 << 20, peak  # reads go by 1 MiB chunks: the 16 MiB line is never in memory


def test_h11_replay_rollouts_reads_dumps_with_the_configured_line_cap(tmp_path: Path) -> None:
    from guardian.incidents.replay import replay_file

    dumps = tmp_path / "dumps"
    _dump_with_a_long_line(dumps, 1, 8 << 10)
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(LINE % 1)
    result = replay_file(metrics, ChecksConfig(), rollouts=dumps, sources=SourcesConfig(max_line_bytes=4096))
    assert any("1.jsonl:3: line longer than 4096 bytes" in p for p in result.rollout_problems)
    stats, problems = read_finished(dumps, max_line_bytes=4096)
    assert stats[1][SAMPLES_KEY] == 4.0 and len(problems) == 1
    live = RolloutDir(dumps, max_line_bytes=4096)
    live.poll()
    assert len(live.poll().bad) == 1


def test_h11_the_report_reads_dumps_with_the_configured_line_cap(tmp_path: Path) -> None:
    from guardian.report.trajectories import DumpFolder, highest_reward

    dumps = tmp_path / "dumps"
    _dump_with_a_long_line(dumps, 1, 8 << 10)
    sample = highest_reward([DumpFolder(dumps, "run", None)], None, {}, 3, max_line_bytes=4096)
    assert [p for p in sample.problems if "line longer than 4096 bytes" in p]
    assert sample.scored_rows == 4


# ------------------------------------------------------------------------------------------------ HR3: extremes


@pytest.mark.parametrize(
    "values",
    [(0.0, 1.7e308), (-1e308, 1e308), (1.7e308, 1.7e308), (-1.7e308, 0.5), (sys.float_info.max, -sys.float_info.max)],
)
def test_hr3_finite_extremes_plot_without_overflow(values: tuple[float, float]) -> None:
    points = ((1, values[0]), (2, 0.5), (3, values[1]))
    plot = Plot(Signal.LENGTH_MEAN, "Response length", "response_length/mean", (Trace("kept", False, points),))
    svg = plot_svg(plot, (), (1, 3))
    assert "inf" not in svg and "nan" not in svg.lower()
    assert "clipped" in svg  # the plot says some values were drawn at its edge
    assert nice_ticks(-sys.float_info.max, sys.float_info.max)  # no OverflowError


def test_hr3_a_run_logging_1_7e308_gets_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    config = GuardianConfig.model_validate({"home": str(home)})
    with Store.open(config.database_url()) as store:
        store.ensure_run(
            "big2", name="big2", metrics_path="m", rollouts_dir="", checkpoints_dir=None, mode="observe", now=NOW
        )
        attempt = store.start_attempt("big2", metrics_path="m", now=NOW)
        steps = [StepRecord(s, {"response_length/mean": 1.7e308 if s == 3 else 100.0}) for s in range(1, 6)]
        store.write_steps("big2", attempt.id, 0, steps, NOW)
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    out = tmp_path / "r.html"
    assert main(["report", "--run", "big2", "-o", str(out)]) == EXIT_OK, capsys.readouterr().err
    assert "clipped" in out.read_text()


# ------------------------------------------------------------------------------------------------ HR4: -o


@pytest.fixture
def report_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    config = GuardianConfig.model_validate({"home": str(home)})
    with Store.open(config.database_url()) as store:
        store.ensure_run(
            "r1", name="r1", metrics_path="m", rollouts_dir="", checkpoints_dir=None, mode="observe", now=NOW
        )
        attempt = store.start_attempt("r1", metrics_path="m", now=NOW)
        store.write_steps("r1", attempt.id, 0, [StepRecord(s, {"actor/entropy": 0.5}) for s in range(1, 4)], NOW)
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    return home


def _make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "symlink-to-file":
        target = path.parent / "target.html"
        target.write_text("keep me")
        path.symlink_to(target)
    elif kind == "symlink-to-stdout":
        path.symlink_to("/proc/self/fd/1")


@pytest.mark.parametrize("kind", ["fifo", "device", "socket", "symlink-to-file", "symlink-to-stdout"])
def test_hr4_report_refuses_an_output_path_that_is_not_a_regular_file(
    report_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    out = tmp_path / "out" / kind
    out.parent.mkdir()
    _make(kind, out)
    before = os.lstat(out)
    assert main(["report", "--run", "r1", "-o", str(out)]) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "not a regular file" in err
    after = os.lstat(out)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
    if kind == "symlink-to-file":
        assert (out.parent / "target.html").read_text() == "keep me"


def test_hr4_report_still_replaces_a_regular_file(report_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    assert main(["report", "--run", "r1", "-o", str(out)]) == EXIT_OK
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_hr4_dashboards_export_refuses_a_fifo_or_symlink_among_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from guardian.dashboards.export import expected

    out = tmp_path / "dash"
    out.mkdir()
    (path,) = list(expected(out))
    for kind in ("symlink", "fifo"):
        if kind == "symlink":
            path.symlink_to(tmp_path / "elsewhere.json")  # a write would replace the link
        else:
            path.unlink()
            os.mkfifo(path)  # a read of it would block for good
        for check in ([], ["--check"]):
            assert main(["dashboards", "export", "-o", str(out), *check]) == EXIT_ERROR
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "not a regular file" in err
        assert os.path.islink(path) if kind == "symlink" else stat.S_ISFIFO(os.lstat(path).st_mode)
    assert not (tmp_path / "elsewhere.json").exists()


# ------------------------------------------------------------------------------------------------ H12: exporter


class _Empty:
    def snapshot(self) -> list[object]:
        return []


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_h12_idle_and_partial_connections_are_capped_and_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exposition.BoundedServer, "max_connections", 4)
    monkeypatch.setattr(exposition.TimedHandler, "request_timeout_s", 0.5)
    server, thread = serve(_Empty(), "127.0.0.1", 0)  # type: ignore[arg-type]
    address = ("127.0.0.1", server.server_port)
    before = threading.active_count()
    held: list[socket.socket] = []
    try:
        for i in range(40):
            sock = socket.create_connection(address, timeout=5)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a partial header, never finished
            held.append(sock)
        time.sleep(0.2)
        assert threading.active_count() <= before + 4  # not a thread per connection
        assert all(_closed_by_server(sock, 3) for sock in held)  # refused beyond the cap, or timed out
        deadline = time.monotonic() + 3
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() == before
        # a drip-fed request (a byte every 0.1 s) does not outlive its deadline either
        drip = socket.create_connection(address, timeout=5)
        held.append(drip)
        started = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"y" * 100:
                drip.sendall(bytes([byte]))
                time.sleep(0.1)
        assert _closed_by_server(drip, 3) and time.monotonic() - started < 4
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            assert response.status == 200  # scrapes are still answered
    finally:
        for sock in held:
            sock.close()
        shutdown(server, thread)


# ------------------------------------------------------------------------------------------------ H13: ESC


ESCAPES = "\x1b[2J\x1b]0;FAKE\x07\x1b]52;c;cGF5bG9hZA==\x07\x9b31m"


def test_h13_incidents_show_escapes_stored_trainer_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        store.ensure_run(
            "crash", name="crash", metrics_path="m", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=NOW
        )
        evidence = {"exit_code": 1, CRASH_OUTPUT_EVIDENCE: f"Traceback\n{ESCAPES}boom\nlast"}
        finding = Finding("crash", Severity.CRITICAL, 3, f"trainer ended: exit 1: {ESCAPES}", evidence=evidence)
        incident = store.open_incident("crash", finding, NOW)
        store.add_finding("crash", None, finding, NOW, incident_id=incident.id)
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    for argv in (["incidents", "show", str(incident.id)], ["incidents", "list"]):
        assert main(["--log-level", "ERROR", *argv]) == EXIT_OK
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert main(["--log-level", "ERROR", "incidents", "show", str(incident.id)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "| \\x1b[2J\\x1b]0;FAKE\\x07" in out and "boom" in out  # visible, not acted on


def test_h13_terminal_text_escapes_controls_but_keeps_text() -> None:
    from guardian.cli.incidents import terminal_text

    assert terminal_text("ok: a\tb é ✓") == "ok: a\tb é ✓"
    assert terminal_text("\x1b[31mred\x7f\x00\u202e") == "\\x1b[31mred\\x7f\\x00\\u202e"


def test_a_config_file_that_is_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    """``--config``, a fleet file and a run's .hydra/config.yaml are read through one small-file reader."""
    from guardian.config import ConfigError, read_small_text

    fifo = tmp_path / "guardian.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO, not a regular file"):
        read_small_text(fifo, f"config {fifo}", limit=1 << 20, expected="a guardian.yaml")
