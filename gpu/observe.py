"""What the harness sees while the scenarios run, sampled from outside the guardian (``/proc``, ``nvidia-smi``, files).

Every sample is one JSON line in ``samples.jsonl``:

* ``procs``: per attempt (its ``VERL_FILE_LOGGER_PATH``, inherited by the trainer, Ray's raylet and every Ray
  worker it spawns), the live process ids and how many of them are verl drivers (``verl.trainer.main_ppo``);
* ``guardian``: per guarded scenario, the guardian's CPU seconds (user + system) and RSS;
* ``gpu``: memory in use on each GPU (by index) and the processes holding memory on each, per GPU index;
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

from guardian.core import StepRecord
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


GPU_QUERY = "index,uuid,memory.used,memory.total"
APPS_QUERY = "gpu_uuid,pid,used_memory"


def _mib(text: str) -> float | None:
    """A CSV field of ``nvidia-smi --format=csv,noheader,nounits`` as MiB; None for ``[N/A]`` / ``[Not Supported]``."""
    text = text.strip()
    return float(text) if text.replace(".", "", 1).isdigit() else None


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``--query-gpu=index,uuid,memory.used,memory.total`` rows, by index: ``{"index", "uuid", "used", "total"}``."""
    gpus = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        gpus.append({"index": int(parts[0]), "uuid": parts[1], "used": _mib(parts[2]), "total": _mib(parts[3])})
    return sorted(gpus, key=lambda g: g["index"])


def parse_apps(text: str, index_of: Mapping[str, int]) -> list[dict[str, Any]]:
    """``--query-compute-apps=gpu_uuid,pid,used_memory`` rows: ``{"pid", "mib", "gpu"}`` (``gpu`` is the index; a
    process on two GPUs is two rows). A process whose memory reads ``[N/A]`` is kept with ``mib`` 0: it still holds
    a context on that GPU."""
    apps = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        uuid, pid, used = parts
        apps.append({"pid": int(pid), "mib": _mib(used) or 0.0, "gpu": index_of.get(uuid, -1)})
    return apps


def gpu_memory(
    run: Callable[..., Any] = subprocess.run, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Any] | None:
    """Used GPU memory (MiB) per GPU index and the compute processes on each GPU; None without ``nvidia-smi``.

    ``used_mib[i]`` is GPU ``i``'s memory in use (every process, the driver's own included), ``total_mib[i]`` its
    size, ``apps`` one ``{"pid", "mib", "gpu"}`` per process and GPU (the driver names the GPU by UUID; the index is
    found from ``--query-gpu``)."""
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

    gpus = parse_gpus(query(f"gpu={GPU_QUERY}"))
    apps = parse_apps(query(f"compute-apps={APPS_QUERY}"), {g["uuid"]: g["index"] for g in gpus})
    return {
        "used_mib": [g["used"] for g in gpus],
        "total_mib": [g["total"] for g in gpus],
        "apps": apps,
    }


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
