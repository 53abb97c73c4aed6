"""What the harness sees while the scenarios run, sampled from outside the guardian (``/proc``, ``nvidia-smi``, files).

Every sample is one JSON line in ``samples.jsonl``:

* ``procs``: per attempt (its ``VERL_FILE_LOGGER_PATH``, inherited by the trainer, Ray's raylet and every Ray
  worker it spawns), the live process ids and how many of them are verl drivers (``verl.trainer.main_ppo``);
* ``guardian``: per guarded scenario, the guardian's CPU seconds (user + system) and RSS;
* ``gpu``: memory in use on the GPU and, where the driver reports them, the processes holding it;
* ``step``: the first time each step line of each metrics file was seen;
* ``ckpt``: the files and sizes of each ``global_step_N`` folder, as soon as it appears and whenever it changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from guardian.history.timeline import StepRecord
from guardian.sources.jsonl import MetricsFile

LOGGER_ENV = b"VERL_FILE_LOGGER_PATH="
VERL_DRIVER = b"verl.trainer.main_ppo"
CPU_DRIVER = b"guardian.demo.trainer"
RUNNER = b"guardian.actions.runner"  # the guardian's launcher wrapper: its argv names the trainer, it is not one
TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # the process ended while being read, or is not ours to read
        return None


def attempt_processes(proc: str = "/proc") -> dict[str, dict[str, list[int]]]:
    """``{metrics path: {"pids": [...], "drivers": [...]}}`` for every live process that carries one."""
    found: dict[str, dict[str, list[int]]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        environ = _read(f"{proc}/{entry}/environ")
        if not environ or LOGGER_ENV not in environ:
            continue
        stat = _read(f"{proc}/{entry}/stat")
        if stat and stat.rsplit(b")", 1)[-1].split()[0] == b"Z":
            continue  # a zombie holds nothing
        path = next(v[len(LOGGER_ENV) :] for v in environ.split(b"\0") if v.startswith(LOGGER_ENV)).decode()
        cmdline = _read(f"{proc}/{entry}/cmdline") or b""
        slot = found.setdefault(path, {"pids": [], "drivers": []})
        slot["pids"].append(int(entry))
        if (VERL_DRIVER in cmdline or CPU_DRIVER in cmdline) and RUNNER not in cmdline:
            slot["drivers"].append(int(entry))
    return found


def process_usage(pid: int, proc: str = "/proc") -> dict[str, float] | None:
    """CPU seconds (user + system) and RSS in MB of one process, or None once it has ended."""
    stat, status = _read(f"{proc}/{pid}/stat"), _read(f"{proc}/{pid}/status")
    if stat is None or status is None:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of proc(5))
    rss_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith(b"VmRSS:")), 0)
    return {"cpu_s": cpu, "rss_mb": rss_kb / 1024}


def gpu_memory(
    run: Callable[..., Any] = subprocess.run, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Any] | None:
    """Used GPU memory (MiB) per GPU and the compute processes the driver lists; None without ``nvidia-smi``."""
    if which("nvidia-smi") is None:
        return None

    def query(what: str) -> str:
        done = run(
            ["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return str(done.stdout)

    used, apps = query("gpu=memory.used"), query("compute-apps=pid,used_memory")
    per_gpu = [float(x) for x in used.split() if x.strip().replace(".", "", 1).isdigit()]
    holders = [
        {"pid": int(p), "mib": float(m)}
        for line in apps.splitlines()
        if len(parts := [x.strip() for x in line.split(",")]) == 2 and parts[0].isdigit()
        for p, m in [parts]
        if m.replace(".", "", 1).isdigit()
    ]
    return {"used_mib": per_gpu, "apps": holders}


def checkpoint_manifest(folder: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file under one ``global_step_N`` folder."""
    manifest: dict[str, int] = {}
    for path in sorted(folder.rglob("*")):
        try:
            if path.is_file():
                manifest[str(path.relative_to(folder))] = path.stat().st_size
        except OSError:
            continue
    return manifest


class Sampler:
    """Writes one sample of everything each ``sample()``; the driver calls it about once a second."""

    def __init__(self, out: TextIO, runs: Mapping[str, Path], clock: Callable[[], float] = time.time) -> None:
        self.out, self.runs, self.clock = out, runs, clock
        self.guardians: dict[str, int] = {}  # scenario → live guardian pid (the driver updates it)
        self._tails: dict[Path, MetricsFile] = {}  # each metrics file tailed as it grows, never re-read
        self._steps_seen: set[tuple[str, int]] = set()
        self._manifests: dict[str, dict[str, int]] = {}
        self._gpu_ok = True

    def _emit(self, kind: str, **fields: Any) -> None:
        self.out.write(json.dumps({"t": round(self.clock(), 3), "kind": kind, **fields}) + "\n")

    def sample(self) -> None:
        self._emit("procs", attempts=attempt_processes())
        for name, pid in list(self.guardians.items()):
            usage = process_usage(pid)
            if usage is not None:
                self._emit("guardian", scenario=name, pid=pid, **usage)
        if self._gpu_ok:
            try:
                memory = gpu_memory()
            except (OSError, subprocess.SubprocessError) as exc:
                memory, self._gpu_ok = None, False
                self._emit("gpu_error", error=str(exc))
            if memory is not None:
                self._emit("gpu", **memory)
        for name, run_dir in self.runs.items():
            for metrics in sorted(run_dir.rglob("metrics.jsonl")):
                tail = self._tails.setdefault(metrics, MetricsFile(metrics))
                key = str(metrics)
                for item in tail.poll().items:
                    if isinstance(item, StepRecord) and (key, item.step) not in self._steps_seen:
                        self._steps_seen.add((key, item.step))  # a step's second line adds nothing new
                        self._emit("step", scenario=name, file=key, step=item.step)
            for folder in sorted((run_dir / "ckpt").glob("global_step_*")):
                manifest = checkpoint_manifest(folder)
                if manifest and manifest != self._manifests.get(str(folder)):
                    self._manifests[str(folder)] = manifest
                    self._emit("ckpt", scenario=name, folder=str(folder), files=manifest)
        self.out.flush()
