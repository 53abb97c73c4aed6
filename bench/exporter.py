"""Exporter benchmark: how long a ``/metrics`` scrape takes while the guardian ingests a busy run.

    python bench/exporter.py [--seconds 20] [--rate 50] [--keys 500] [--scrapers 20]
                             [--baseline-ref 237a781] [--json]

For each of two trees - the baseline (``--baseline-ref``, checked out in a temporary git worktree:
the exporter that built every series from the store at scrape time) and this checkout (one snapshot
per tick) - the same load runs in the same invocation:

1. A real ``guardian watch --metrics FILE --no-live --export PORT`` process of that tree follows a
   fresh metrics file on loopback (default config: 0.25 s poll interval, SQLite store in a temp home).
2. A writer thread appends ``--rate`` steps/s of ``--keys`` keys each (compact orjson, one ``write`` per
   line like verl; the keys the guardian reads plus ``perf/...`` fillers).
3. ``--scrapers`` threads scrape ``/metrics`` back to back for ``--seconds``; each scrape's latency is
   measured from the request to the last byte of the reply.

It prints p50/p95/max scrape latency, the scrapes done, and how far the guardian got (the step it
exported at the end against the last step written), per tree, side by side. Target: p95 < 100 ms.
No assertion on timings: the figures are printed next to the target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
from common import json_safe

ROOT = Path(__file__).resolve().parent.parent
TARGET_P95_MS = 100.0
READ_KEYS = ("actor/entropy", "actor/kl_loss", "critic/score/mean", "response_length/mean", "actor/grad_norm")


@dataclass
class Figures:
    tree: str
    scrapes: int
    failed: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    steps_written: int
    step_exported: int | None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def step_line(step: int, keys: int, rng: random.Random) -> bytes:
    data: dict[str, float] = {
        "actor/entropy": 0.6 - 0.00001 * step + rng.gauss(0, 0.005),
        "actor/kl_loss": 0.001 + rng.gauss(0, 0.0001),
        "critic/score/mean": 0.4 + rng.gauss(0, 0.01),
        "response_length/mean": 600.0 + rng.gauss(0, 5),
        "actor/grad_norm": 1.0 + rng.gauss(0, 0.05),
        "actor/lr": 1e-6,
        "timing_s/step": 0.02,
    }
    for i in range(keys - len(data)):
        data[f"perf/filler_{i:04d}"] = rng.random()
    return orjson.dumps({"step": step, "data": data}) + b"\n"


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def exported_step(text: bytes) -> int | None:
    for line in text.decode().splitlines():
        if line.startswith("guardian_step{"):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def measure(tree: Path, label: str, args: argparse.Namespace) -> Figures:
    with tempfile.TemporaryDirectory(prefix="guardian-exporter-bench-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        rng = random.Random(7)
        metrics.write_bytes(step_line(1, args.keys, rng))
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        env = {**os.environ, "GUARDIAN_HOME": str(Path(tmp) / "home"), "PYTHONPATH": str(tree)}
        env.pop("GUARDIAN_DB_URL", None)
        argv = [sys.executable, "-m", "guardian", "watch", "--metrics", str(metrics), "--no-live"]
        proc = subprocess.Popen(
            [*argv, "--export", str(port)], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if exported_step(scrape(url)) is not None:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{label}: the guardian at {tree} never served {url}")
                time.sleep(0.2)

            stop = threading.Event()
            written = [1]

            def write() -> None:
                with open(metrics, "ab", buffering=0) as out:
                    started = time.monotonic()
                    while not stop.is_set():
                        due = started + (written[0] / args.rate)
                        if due > time.monotonic():
                            time.sleep(due - time.monotonic())
                        written[0] += 1
                        out.write(step_line(written[0], args.keys, rng))

            latencies: list[float] = []
            failed = [0]
            lock = threading.Lock()

            def scraper() -> None:
                while not stop.is_set():
                    started = time.perf_counter()
                    try:
                        scrape(url)
                    except OSError:
                        with lock:
                            failed[0] += 1
                        continue
                    elapsed = time.perf_counter() - started
                    with lock:
                        latencies.append(elapsed)

            threads = [threading.Thread(target=write)] + [
                threading.Thread(target=scraper) for _ in range(args.scrapers)
            ]
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            stop.set()
            for thread in threads:
                thread.join()
            time.sleep(1.0)  # one more tick or two: how far behind the guardian was
            final = exported_step(scrape(url))
        finally:
            for _ in range(2):  # the first signal starts the exporter's linger, the second ends it
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
                    time.sleep(0.5)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    ms = sorted(1000.0 * x for x in latencies)
    return Figures(
        tree=label,
        scrapes=len(ms),
        failed=failed[0],
        p50_ms=statistics.median(ms) if ms else math.nan,
        p95_ms=ms[min(len(ms) - 1, math.ceil(0.95 * len(ms)) - 1)] if ms else math.nan,
        max_ms=ms[-1] if ms else math.nan,
        steps_written=written[0],
        step_exported=final,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0, help="steps per second the writer appends")
    parser.add_argument("--keys", type=int, default=500, help="keys per step")
    parser.add_argument("--scrapers", type=int, default=20, help="concurrent scrapers")
    parser.add_argument(
        "--baseline-ref", default="237a781", help="git commit of the baseline (default: before the per-tick snapshot)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="guardian-exporter-base-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline_ref],
            check=True,
            capture_output=True,
        )
        try:
            figures = [measure(base, f"baseline {args.baseline_ref}", args), measure(ROOT, "this tree", args)]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)

    if args.json:
        print(json.dumps(json_safe({"load": vars(args), "figures": [asdict(f) for f in figures]}), indent=2))
        return
    print(
        f"load: {args.rate:g} steps/s x {args.keys} keys ingested, {args.scrapers} scrapers back to back, "
        f"{args.seconds:g} s; target p95 < {TARGET_P95_MS:g} ms"
    )
    print(f"{'':22}" + "".join(f"{f.tree:>22}" for f in figures))
    rows = [
        ("scrapes (failed)", lambda f: f"{f.scrapes} ({f.failed})"),
        ("p50 ms", lambda f: f"{f.p50_ms:.1f}"),
        ("p95 ms", lambda f: f"{f.p95_ms:.1f}"),
        ("max ms", lambda f: f"{f.max_ms:.1f}"),
        ("step exported/written", lambda f: f"{f.step_exported}/{f.steps_written}"),
    ]
    for name, cell in rows:
        print(f"{name:22}" + "".join(f"{cell(f):>22}" for f in figures))


if __name__ == "__main__":
    main()
