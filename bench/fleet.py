"""Fleet benchmark: one guardian process guarding 1, 4 and 16 runs, against as many ``guardian run`` processes.

    python bench/fleet.py [--runs 1,4,16] [--seconds 30] [--rate 2] [--keys 300] [--separate 16] [--json]

Each run's trainer is a writer (a python script, as ``guardian run`` expects) appending ``--rate`` verl-style steps
per second of ``--keys`` keys to its ``VERL_FILE_LOGGER_PATH`` for ``--seconds``, then exiting 0. For each fleet
size a real ``guardian fleet FILE --export PORT`` process (this checkout, SQLite store in a temporary home,
default config) guards that many writers. Every 0.5 s the benchmark reads the guardian process's own CPU time
and resident memory from /proc (its trainers are not counted) and scrapes ``/metrics`` once, timing the scrape and
reading every run's ``guardian_tick_duration_seconds`` and ``guardian_step``.

Printed per setting: guardian CPU (% of one core, over the writers' lifetime), peak RSS, tick duration p50/p95/max
over all runs' samples, scrape p50/p95, and the last step each run had exported (summed) against the steps written.
The baseline, in the same invocation: ``--separate`` runs each guarded by its own ``guardian run`` process
(CPU and RSS summed over the processes). No assertion on figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import json_safe

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

WRITER = """import json, os, random, sys, time
rate, keys, seconds = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(os.getpid())
path = os.environ["VERL_FILE_LOGGER_PATH"]
start = time.monotonic()
step = 0
with open(path, "a") as out:
    while time.monotonic() - start < seconds:
        step += 1
        data = {"actor/entropy": 0.6 - 0.0001 * step + rng.gauss(0, 0.005), "actor/kl_loss": 0.001,
                "critic/score/mean": 0.4 + rng.gauss(0, 0.01), "response_length/mean": 600.0 + rng.gauss(0, 5),
                "actor/grad_norm": 1.0 + rng.gauss(0, 0.05), "actor/lr": 1e-6, "timing_s/step": 1 / rate}
        data.update({f"perf/filler_{i:04d}": rng.random() for i in range(keys - len(data))})
        out.write(json.dumps({"step": step, "data": data}) + "\\n")
        out.flush()
        time.sleep(max(0.0, start + step / rate - time.monotonic()))
print(f"wrote {step} steps", flush=True)
"""


@dataclass
class Figures:
    setting: str
    runs: int
    processes: int
    cpu_percent: float
    peak_rss_mib: float
    tick_p50_ms: float
    tick_p95_ms: float
    tick_max_ms: float
    scrape_p50_ms: float
    scrape_p95_ms: float
    steps_written: int
    steps_seen: int
    failed_runs: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """The process's own user + system CPU time (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def label(line: str, name: str) -> str:
    return line.split(f'{name}="', 1)[1].split('"', 1)[0]


class Sampler:
    """Samples guardian processes and their exporters until told to stop."""

    def __init__(self, pids: list[int], urls: list[str]) -> None:
        self.pids, self.urls = pids, urls
        self.cpu_start = {pid: cpu_seconds(pid) for pid in pids}
        self.cpu_last = dict(self.cpu_start)
        self.peak_rss = 0
        self.ticks: list[float] = []
        self.scrapes: list[float] = []
        self.steps: dict[str, float] = {}
        self.stop = threading.Event()

    def __call__(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            rss = 0
            for pid in self.pids:
                try:
                    self.cpu_last[pid] = cpu_seconds(pid)
                    rss += rss_bytes(pid)
                except (FileNotFoundError, ProcessLookupError):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            for url in self.urls:
                self.scrape(url)

    def scrape(self, url: str) -> None:
        started = time.perf_counter()
        try:
            body = urllib.request.urlopen(url, timeout=10).read().decode()
        except OSError:
            return
        self.scrapes.append(time.perf_counter() - started)
        for line in body.splitlines():
            if line.startswith("guardian_tick_duration_seconds{"):
                self.ticks.append(float(line.rsplit(" ", 1)[1]))
            elif line.startswith("guardian_step{"):
                self.steps[label(line, "run_id")] = float(line.rsplit(" ", 1)[1])

    @property
    def cpu(self) -> float:
        return sum(self.cpu_last[pid] - self.cpu_start[pid] for pid in self.pids)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def config_text(home: Path) -> str:
    return f"home: {home}\nexporter:\n  linger_s: 0\n"


def measure(setting: str, runs: int, separate: bool, args: argparse.Namespace, work: Path) -> Figures:
    home = work / setting
    home.mkdir(parents=True)
    writer = work / "writer.py"
    config = home / "guardian.yaml"
    config.write_text(config_text(home))
    writes = [sys.executable, str(writer), str(args.rate), str(args.keys), str(args.seconds)]

    def command(name: str) -> list[str]:  # each run its own checkpoint dir: one guardian per dir (the dir lock)
        return [*writes, f"trainer.default_local_dir={home / 'ckpt' / name}"]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    names = [f"{setting}-{i:02d}" for i in range(runs)]
    procs: list[subprocess.Popen[bytes]] = []
    errors = (home / "guardian.stderr").open("wb")  # every guardian's log lines: the tail is printed on a failure
    urls: list[str] = []
    if separate:
        for name in names:
            port = free_port()
            argv = [sys.executable, "-m", "guardian", "run", "--config", str(config), "--export", str(port)]
            argv += ["--run-id", name, "--no-live", "--", *command(name)]
            procs.append(
                subprocess.Popen(argv, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            urls.append(f"http://127.0.0.1:{port}/metrics")
    else:
        fleet = home / "fleet.yaml"
        fleet.write_text("runs:\n" + "".join(f"  - run_id: {name}\n    command: {command(name)!r}\n" for name in names))
        port = free_port()
        argv = [sys.executable, "-m", "guardian", "fleet", "--config", str(config), "--export", str(port), str(fleet)]
        procs.append(subprocess.Popen(argv, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=errors))
        urls.append(f"http://127.0.0.1:{port}/metrics")
    time.sleep(0.3)  # the interpreter is up: CPU from here on includes start-up imports
    sampler = Sampler([p.pid for p in procs], urls)
    thread = threading.Thread(target=sampler, daemon=True)
    started = time.monotonic()
    thread.start()
    codes = [p.wait(timeout=args.seconds + 120) for p in procs]
    errors.close()
    if any(codes):
        lines = (home / "guardian.stderr").read_text(errors="replace").splitlines()
        worst = [line for line in lines if " ERROR " in line or " CRITICAL " in line][:15] or lines[-15:]
        print(f"{setting}: a guardian exited non-zero; its errors:\n" + "\n".join(worst), file=sys.stderr)
    elapsed = time.monotonic() - started
    sampler.stop.set()
    thread.join()
    written = int(args.seconds * args.rate) * runs
    stored = int(sum(sampler.steps.get(name, 0) for name in names))
    return Figures(
        setting=setting,
        runs=runs,
        processes=len(procs),
        cpu_percent=100 * sampler.cpu / elapsed,
        peak_rss_mib=sampler.peak_rss / 2**20,
        tick_p50_ms=1000 * quantile(sampler.ticks, 0.5),
        tick_p95_ms=1000 * quantile(sampler.ticks, 0.95),
        tick_max_ms=1000 * max(sampler.ticks, default=float("nan")),
        scrape_p50_ms=1000 * quantile(sampler.scrapes, 0.5),
        scrape_p95_ms=1000 * quantile(sampler.scrapes, 0.95),
        steps_written=written,
        steps_seen=stored,
        failed_runs=[f"{names[i] if separate else setting}: exit {code}" for i, code in enumerate(codes) if code],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="1,4,16", help="fleet sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each writer writes")
    parser.add_argument("--rate", type=float, default=2.0, help="steps per second per run")
    parser.add_argument("--keys", type=int, default=300, help="keys per step")
    parser.add_argument("--separate", type=int, default=16, help="the baseline: this many guardian run processes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        (work / "writer.py").write_text(WRITER)
        for runs in (int(n) for n in args.runs.split(",")):
            results.append(measure(f"fleet-{runs}", runs, False, args, work))
        if args.separate:
            results.append(measure(f"separate-{args.separate}", args.separate, True, args, work))
    if args.json:
        print(json.dumps(json_safe([asdict(r) for r in results]), indent=2))
        return 0
    print(f"{args.rate:g} steps/s per run, {args.keys} keys per step, {args.seconds:g} s; guardian processes only")
    header = (
        f"{'setting':<12} {'procs':>5} {'cpu %':>6} {'rss MiB':>8} {'tick p50':>9} {'p95':>7} {'max':>7}"
        f" {'scrape p50':>10} {'p95':>7} {'seen/written':>15}"
    )
    print(header)
    for r in results:
        print(
            f"{r.setting:<12} {r.processes:>5} {r.cpu_percent:>6.1f} {r.peak_rss_mib:>8.1f} {r.tick_p50_ms:>7.1f}ms"
            f" {r.tick_p95_ms:>5.1f}ms {r.tick_max_ms:>5.0f}ms {r.scrape_p50_ms:>8.1f}ms {r.scrape_p95_ms:>5.1f}ms"
            f" {r.steps_seen:>7}/{r.steps_written:<7}" + (f"  FAILED {r.failed_runs}" if r.failed_runs else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
