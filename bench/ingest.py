"""Ingest benchmark: how fast the guardian reads and judges a large verl metrics file, how soon it
sees a step after verl writes it, and how much memory a replay takes.

    python bench/ingest.py [--steps 10000] [--keys 300] [--rate 20] [--seconds 10] [--nan-every 25]
                           [--db-url postgresql+psycopg://USER:PASSWORD@HOST/DB] [--json] [--profile]

1. Writes a synthetic but realistic verl ``file`` logger JSONL (``{"step":N,"data":{...}}``, compact
   orjson, full-precision floats, a few nulls) into a temp dir: the ~95 keys a real verl 0.9.1 GRPO run
   logs (names copied from tests/fixtures/verl-0.9.1-run), ``actor/kl_loss``, and realistic filler keys
   (``val-aux/...``, ``timing_s/...``, ``perf/...``) up to ``--keys``. Values are a healthy run: smooth
   trends plus noise, entropy slowly falling, reward slowly rising.
2. Full replay: ``guardian.incidents.replay.replay_file`` with the default checks (parse + every check after
   every step), in a fresh subprocess so that its peak RSS is the replay's alone; next to it the time to
   merely parse the file line by line with orjson, and the RSS of a subprocess that only imports guardian.
3. Ingest with the store: a ``IncidentTick`` with a SQLite store in a temp dir tails the file from the
   start, ``tick()`` until every step is in. With ``--db-url`` the same again on that database (PostgreSQL:
   point it at a scratch database; each bench adds two runs with fresh ids), printed beside SQLite. Beside
   its time, the replay's (target: within 2x); beside the database's growth, that of the same steps stored
   with every key of every line, one write per poll (the store's design before it kept only the keys the
   checks read; target: 20 MB for 10,000 x 300).
4. Tail latency: a writer thread appends steps at ``--rate`` steps/s for ``--seconds`` while a
   ``IncidentTick`` with the default config (poll interval ``sources.poll_interval_s``) runs in ``guardian
   watch``'s loop (``WatchLoop``) in another thread. Per step: append -> read (the poll returned it),
   append -> judged and stored (the end of the tick that read it; checks run on a step in the tick that
   reads it), and, for the steps where the writer logged ``actor/grad_norm`` as null (two in a row every
   ``--nan-every`` steps), append -> the ``non_finite`` finding (an ``on_transition`` callback). With
   ``--db-url`` it runs again on that database.

``--profile`` also times one in-process replay phase by phase (parsing, history, each check) and runs it
under cProfile, printing the top functions.
No assertion on timings: figures are printed next to their targets (issue 27's: replay within 3x the parse
floor measured in the same run, ingest within 2x the replay, a store of at most 20 MB).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import math
import pstats
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from common import json_safe
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from guardian.checks import CheckContext, build_checks
from guardian.checks.policy import apply, read_progress
from guardian.commands.watch.end import FileState
from guardian.commands.watch.loop import FollowedFile, WatchLoop
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.config import GuardianConfig
from guardian.core import StepRecord
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import replay_file
from guardian.incidents.tick import IncidentTick, TickResult
from guardian.incidents.tracker import Change, StatusTracker, Transition
from guardian.keys import CHECKED_KEYS
from guardian.sinks.snapshot import RunSnapshot
from guardian.sources.jsonl import MetricsBatch, MetricsFile, iter_records
from guardian.store import Store, StoreError, mask_url

# Targets printed next to the figures (not asserted).
TARGET_REPLAY_S = 5.0
TARGET_P95_LATENCY_S = 0.5
TARGET_RSS_MB = 200.0
TARGET_REPLAY_OVER_PARSE = 3.0  # issue 27: replay within 3x the orjson parse floor of the same run
TARGET_INGEST_OVER_REPLAY = 2.0  # issue 27: ingest with the store within 2x the replay
TARGET_DB_MB = 20.0  # issue 27: the store of the 10,000 x 300 run

NULL_RATE = 1e-4  # share of filler values written as null (verl writes NaN as null)
SEED = 20261130


# -- the synthetic run ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Trend:
    """A metric that moves linearly from ``start`` to ``end`` over the run, plus Gaussian noise."""

    start: float
    end: float
    sd: float = 0.0
    integer: bool = False
    floor: float | None = None

    def at(self, progress: float, rng: random.Random) -> float | int:
        value = self.start + (self.end - self.start) * progress
        if self.sd:
            value += rng.gauss(0.0, self.sd)
        if self.floor is not None:
            value = max(value, self.floor)
        return round(value) if self.integer else value


def _const(value: float, integer: bool = False) -> Trend:
    return Trend(value, value, 0.0, integer)


# The keys a real verl 0.9.1 GRPO run logs on a training step (tests/fixtures/verl-0.9.1-run/metrics-30-steps.jsonl)
# plus actor/kl_loss (use_kl_loss). Levels are those of a healthy mid-size run.
CORE: dict[str, Trend] = {
    "actor/entropy": Trend(0.62, 0.38, 0.012),
    "actor/kl_loss": Trend(0.001, 0.006, 0.0003, floor=0.0),
    "actor/pg_loss": Trend(0.0, 0.0, 0.02),
    "actor/loss": Trend(0.0, 0.0, 0.02),
    "actor/pg_clipfrac": Trend(0.004, 0.002, 0.0005, floor=0.0),
    "actor/ppo_kl": Trend(0.0, 0.0, 0.0002),
    "actor/pg_clipfrac_lower": _const(0.0),
    "actor/grad_norm": Trend(0.30, 0.22, 0.03, floor=0.01),
    "actor/lr": _const(1e-6),
    "actor/perf/max_memory_allocated_gb": Trend(61.2, 61.9, 0.2),
    "actor/perf/max_memory_reserved_gb": Trend(70.4, 71.0, 0.1),
    "actor/perf/cpu_memory_used_gb": Trend(92.0, 97.0, 0.5),
    "perf/mfu/actor": Trend(0.31, 0.33, 0.01),
    "perf/total_num_tokens": Trend(2.1e6, 3.0e6, 4e4, integer=True),
    "perf/time_per_step": Trend(62.0, 75.0, 2.5),
    "perf/throughput": Trend(4200.0, 4900.0, 120.0),
    "training/global_step": _const(0, integer=True),  # overwritten with the step
    "training/epoch": _const(0, integer=True),
    "critic/score/mean": Trend(0.25, 0.66, 0.02),
    "critic/score/max": _const(1.0),
    "critic/score/min": _const(0.0),
    "critic/rewards/mean": Trend(0.25, 0.66, 0.02),
    "critic/rewards/max": _const(1.0),
    "critic/rewards/min": _const(0.0),
    "critic/advantages/mean": Trend(0.0, 0.0, 0.01),
    "critic/advantages/max": Trend(1.79, 1.79, 0.05),
    "critic/advantages/min": Trend(-1.79, -1.79, 0.05),
    "critic/returns/mean": Trend(0.0, 0.0, 0.01),
    "critic/returns/max": Trend(1.79, 1.79, 0.05),
    "critic/returns/min": Trend(-1.79, -1.79, 0.05),
    "response_length/mean": Trend(610.0, 880.0, 18.0),
    "response_length/max": _const(2048.0),
    "response_length/min": Trend(38.0, 52.0, 6.0, floor=1.0),
    "response_length/clip_ratio": Trend(0.012, 0.02, 0.003, floor=0.0),
    "response_length_non_aborted/mean": Trend(610.0, 880.0, 18.0),
    "response_length_non_aborted/max": _const(2048.0),
    "response_length_non_aborted/min": Trend(38.0, 52.0, 6.0, floor=1.0),
    "response_length_non_aborted/clip_ratio": Trend(0.012, 0.02, 0.003, floor=0.0),
    "response/aborted_ratio": _const(0.0),
    "prompt_length/mean": Trend(182.0, 182.0, 4.0),
    "prompt_length/max": _const(512.0),
    "prompt_length/min": Trend(71.0, 71.0, 3.0),
    "prompt_length/clip_ratio": _const(0.0),
    "num_turns/min": _const(2, integer=True),
    "num_turns/max": _const(2, integer=True),
    "num_turns/mean": _const(2.0),
    "global_seqlen/min": Trend(2.5e5, 3.5e5, 5e3),
    "global_seqlen/max": Trend(2.7e5, 3.8e5, 5e3),
    "global_seqlen/minmax_diff": Trend(2e4, 3e4, 2e3),
    "global_seqlen/balanced_min": Trend(2.6e5, 3.7e5, 5e3),
    "global_seqlen/balanced_max": Trend(2.6e5, 3.7e5, 5e3),
    "global_seqlen/mean": Trend(2.6e5, 3.7e5, 5e3),
    "training/rollout_probs_diff_valid": _const(1.0),
    "training/rollout_probs_diff_max": Trend(0.6, 0.6, 0.05),
    "training/rollout_probs_diff_mean": Trend(0.0015, 0.0015, 0.0001),
    "training/rollout_probs_diff_std": Trend(0.009, 0.009, 0.0005),
    "training/rollout_actor_probs_pearson_corr": Trend(0.9991, 0.9991, 0.0002),
    "rollout_corr/training_ppl": Trend(1.74, 1.50, 0.02),
    "rollout_corr/training_log_ppl": Trend(0.55, 0.40, 0.01),
    "rollout_corr/kl": Trend(0.0, 0.0, 0.0001),
    "rollout_corr/k3_kl": Trend(1.5e-5, 1.5e-5, 2e-6),
    "rollout_corr/rollout_ppl": Trend(1.74, 1.50, 0.02),
    "rollout_corr/rollout_log_ppl": Trend(0.55, 0.40, 0.01),
    "rollout_corr/log_ppl_diff": Trend(0.0, 0.0, 0.0001),
    "rollout_corr/log_ppl_abs_diff": Trend(0.001, 0.001, 0.0001),
    "rollout_corr/log_ppl_diff_max": Trend(0.004, 0.004, 0.0005),
    "rollout_corr/log_ppl_diff_min": Trend(-0.004, -0.004, 0.0005),
    "rollout_corr/ppl_ratio": Trend(1.0, 1.0, 0.0001),
    "rollout_corr/chi2_token": Trend(0.0, 0.0, 0.0002),
    "rollout_corr/chi2_seq": Trend(0.0, 0.0, 0.003),
    "timing_s/gen": Trend(31.0, 38.0, 1.5),
    "timing_s/old_log_prob": Trend(6.1, 7.5, 0.3),
    "timing_s/ref": Trend(5.9, 7.2, 0.3),
    "timing_s/reward": Trend(1.2, 1.4, 0.1),
    "timing_s/adv": Trend(0.07, 0.08, 0.005),
    "timing_s/update_actor": Trend(17.5, 21.0, 0.8),
    "timing_s/update_weights": Trend(1.9, 2.0, 0.05),
    "timing_s/step": Trend(62.0, 75.0, 2.5),
    "timing_per_token_ms/update_actor": Trend(0.0083, 0.0070, 0.0003),
    "timing_per_token_ms/gen": Trend(0.0147, 0.0127, 0.0005),
    "timing_per_token_ms/adv": Trend(3.3e-5, 2.7e-5, 2e-6),
    "timing_per_token_ms/ref": Trend(0.0028, 0.0024, 0.0001),
    "training/num_turns/mean": _const(2.0),
    "training/num_turns/max": _const(2, integer=True),
    "training/num_turns/min": _const(2, integer=True),
    "training/off_policy/trajectory_spans/mean": _const(1.0),
    "training/off_policy/trajectory_spans/max": _const(1, integer=True),
    "training/off_policy/trajectory_spans/min": _const(1, integer=True),
    "training/off_policy/trajectory_staleness/mean": _const(0.0),
    "training/off_policy/trajectory_staleness/max": _const(0, integer=True),
    "training/off_policy/trajectory_staleness/min": _const(0, integer=True),
    "training/off_policy/trajectory_staleness_worst/mean": _const(0.0),
    "training/off_policy/trajectory_staleness_worst/max": _const(0, integer=True),
    "training/off_policy/trajectory_staleness_worst/min": _const(0, integer=True),
}

_VAL_SETS = ("openai/gsm8k", "lighteval/MATH", "math500", "aime_2024", "amc23", "olympiadbench")
_VAL_METRICS = ("reward", "acc", "score", "pred_len", "format_ok")
_VAL_STATS = (
    "mean@1",
    "mean@4",
    "std@4",
    "best@2/mean",
    "best@2/std",
    "worst@2/mean",
    "worst@2/std",
    "maj@2/mean",
    "maj@2/std",
    "best@4/mean",
    "best@4/std",
    "worst@4/mean",
    "worst@4/std",
    "maj@4/mean",
    "maj@4/std",
)
_EXTRA_FILLER = (
    "timing_s/testing",
    "timing_s/save_checkpoint",
    "timing_s/start_profile",
    "timing_s/stop_profile",
    "timing_s/reshard",
    "timing_s/values",
    "timing_per_token_ms/old_log_prob",
    "perf/mfu/actor_infer",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/cpu_memory_used_gb",
    "actor/kl_coef",
)


def filler_keys(count: int) -> list[str]:
    """``count`` realistic names beyond the core keys: extra timings and perf, then validation metrics."""
    names = list(_EXTRA_FILLER)
    names += [f"val-aux/{d}/{m}/{s}" for d in _VAL_SETS for m in _VAL_METRICS for s in _VAL_STATS]
    if count > len(names):
        names += [f"perf/extra/metric_{i}" for i in range(count - len(names))]
    return names[:count]


class SyntheticRun:
    """A healthy verl run of ``steps`` steps (1..steps) with ``keys`` keys per line; deterministic."""

    def __init__(self, steps: int, keys: int, seed: int = SEED) -> None:
        if keys < len(CORE):
            raise ValueError(f"--keys must be at least {len(CORE)} (the verl keys the guardian reads and their kin)")
        self.steps = steps
        self.keys = keys
        self._rng = random.Random(seed)
        rng = random.Random(seed + 1)
        self._filler = [(name, rng.uniform(0.01, 100.0)) for name in filler_keys(keys - len(CORE))]
        self.nulls = 0

    def record(self, step: int) -> dict[str, float | int | None]:
        rng = self._rng
        progress = (step - 1) / max(self.steps - 1, 1)
        data: dict[str, float | int | None] = {key: trend.at(progress, rng) for key, trend in CORE.items()}
        data["training/global_step"] = step
        random_ = rng.random
        for name, base in self._filler:
            if random_() < NULL_RATE:
                data[name] = None
                self.nulls += 1
            else:
                data[name] = base * (0.98 + 0.04 * random_())
        return data

    def line(self, step: int, *, nan_grad: bool = False) -> bytes:
        data = self.record(step)
        if nan_grad:
            data["actor/grad_norm"] = None  # how verl's file logger writes a NaN
        return orjson.dumps({"step": step, "data": data}) + b"\n"


def write_run(path: Path, run: SyntheticRun) -> int:
    """Write the whole run to ``path``; returns its size in bytes."""
    with path.open("wb") as out:
        for step in range(1, run.steps + 1):
            out.write(run.line(step))
    return path.stat().st_size


# -- measurements -----------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass(frozen=True)
class Spread:
    n: int
    p50: float
    p95: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(len(values), percentile(values, 50), percentile(values, 95), max(values, default=math.nan))

    def __str__(self) -> str:
        return f"{self.p50:.3f} / {self.p95:.3f} / {self.max:.3f} s  (n={self.n})"


def parse_only(path: Path) -> float:
    """Seconds to read ``path`` line by line and orjson-parse each line (the floor for any reader)."""
    start = time.perf_counter()
    with path.open("rb") as handle:
        for line in handle:
            orjson.loads(line)
    return time.perf_counter() - start


# The replay runs in a fresh interpreter that imports only what `guardian replay` needs.
_CHILD_PRELUDE = """
import json, resource, sys, time
from pathlib import Path
from typing import Any
from guardian.checks import CheckContext, build_checks
from guardian.config import GuardianConfig
from guardian.incidents.replay import replay_file
checks = GuardianConfig().checks


def memory():
    with open("/proc/self/status") as status:
        hwm = next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), None)
    return {"rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "hwm_kib": hwm}
"""
_CHILD_IMPORT_ONLY = _CHILD_PRELUDE + "print(json.dumps(memory()))\n"
_CHILD_REPLAY = (
    _CHILD_PRELUDE
    + """
start = time.perf_counter()
result = replay_file(Path(sys.argv[1]), checks)
seconds = time.perf_counter() - start
raised = [f"{f.check}:{f.severity.label}@{f.step}" for f in result.raised]
print(json.dumps({"seconds": seconds, "steps": result.steps, "bad_lines": len(result.bad_lines),
                  "raised": raised, **memory()}))
"""
)
# ru_maxrss survives execve: a child exec'd straight from this (large) process reports at least this
# process's peak. A small launcher in between starts the child from a fresh, small address space.
_LAUNCHER = "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', *sys.argv[1:]]).returncode)"


def run_child(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (via the launcher) and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, code, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@dataclass(frozen=True)
class Memory:
    rss_kib: int  # ru_maxrss
    hwm_kib: int | None  # VmHWM from /proc/self/status, a cross-check

    @property
    def mb(self) -> float:
        return self.rss_kib * 1024 / 1e6


@dataclass(frozen=True)
class ReplayFigures:
    seconds: float
    steps: int
    bad_lines: int
    raised: list[str]
    memory: Memory

    @property
    def verdict(self) -> str:
        return "unhealthy" if any(":critical@" in r for r in self.raised) else "healthy"


def replay_in_subprocess(path: Path) -> ReplayFigures:
    out = run_child(_CHILD_REPLAY, str(path))
    memory = Memory(out.pop("rss_kib"), out.pop("hwm_kib"))
    return ReplayFigures(memory=memory, **out)


def import_only_memory() -> Memory:
    out = run_child(_CHILD_IMPORT_ONLY)
    return Memory(out["rss_kib"], out["hwm_kib"])


def profile_replay(path: Path, top: int = 20) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(replay_file, path, GuardianConfig().checks)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def replay_breakdown(path: Path) -> dict[str, float]:
    """Seconds per phase of a replay: the loop of ``guardian.incidents.replay.replay_records``, timed piece by piece."""
    config = GuardianConfig().checks
    checks = build_checks(config)
    history = RunHistory()
    ctx = CheckContext(history, config.baseline)
    tracker = StatusTracker()
    spent: dict[str, float] = {"read+parse (iter_records)": 0.0, "history.add": 0.0, "tracker": 0.0}
    spent["decision policy"] = 0.0
    spent.update({f"check {c.name}": 0.0 for c in checks})
    clock = time.perf_counter
    records = iter_records(path)
    while True:
        start = clock()
        chunk = next(records, None)
        spent["read+parse (iter_records)"] += clock() - start
        if chunk is None:
            break
        for record in chunk[0]:
            start = clock()
            history.add(record)
            spent["history.add"] += clock() - start
            findings = []
            for check in checks:
                start = clock()
                findings.append(check.evaluate(ctx))
                spent[f"check {check.name}"] += clock() - start
            start = clock()
            findings = apply(findings, read_progress(history, config.policy, config.reward_collapse, config.baseline))
            spent["decision policy"] += clock() - start
            start = clock()
            tracker.update(findings)
            spent["tracker"] += clock() - start
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def every_key_db_mb(path: Path, home: Path) -> float:
    """The baseline of the store's size: the same steps stored with every key of every line (what the store kept
    before it kept only the keys the checks read), one write per poll as the guard loop writes them."""
    url = sqlite_url(home)
    run_id = fresh_run_id("bench-every-key")
    with _open_store(url, run_id, path) as store:
        before = database_bytes(url)
        attempt = store.start_attempt(run_id, metrics_path=str(path), now=time.time())
        for records, _bad in iter_records(path):
            store.write_steps(run_id, attempt.id, 0, records, time.time())
    return (database_bytes(url) - before) / 1e6


def guarded_file(path: Path) -> MetricsFile:
    """The metrics file as ``guardian run`` and ``watch`` read it: the keys the checks read (keys.CHECKED_KEYS)."""
    return MetricsFile(path, keys=CHECKED_KEYS)


def _open_store(url: str, run_id: str, metrics: Path) -> Store:
    store = Store.open(url)
    store.ensure_run(
        run_id,
        name=run_id,
        metrics_path=str(metrics),
        rollouts_dir="",
        checkpoints_dir=None,
        mode="observe",
        now=time.time(),
    )
    return store


def database_bytes(url: str) -> int:
    """What the database holds: the SQLite file with its WAL, or PostgreSQL's ``pg_database_size``."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = Path(parsed.database or "")
        return sum(p.stat().st_size for p in db.parent.glob(f"{db.name}*"))
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    finally:
        engine.dispose()


def sqlite_url(home: Path) -> str:
    """The store a guardian with ``home`` opens by default: a fresh SQLite file."""
    return GuardianConfig(home=home).database_url()


def fresh_run_id(prefix: str) -> str:
    """A run id no earlier bench left in a shared database (re-reading a stored run would merge, not insert)."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{random.randrange(16**6):06x}"


@dataclass(frozen=True)
class IngestFigures:
    seconds: float
    ticks: int
    steps_stored: int
    db_mb: float  # how much the database grew


def ingest_with_store(path: Path, home: Path, url: str, last_step: int) -> IngestFigures:
    """An IncidentTick with the store at ``url`` reads the finished file from the start, ticking until all is in."""
    config = GuardianConfig(home=home)
    run_id = fresh_run_id("bench-ingest")
    with _open_store(url, run_id, path) as store:
        before = database_bytes(url)
        guardian = IncidentTick(config=config, store=store, run_id=run_id, metrics=guarded_file(path), clock=time.time)
        ticks = 0
        start = time.perf_counter()
        while guardian.history.last_step != last_step:
            ticks += 1
            if guardian.tick().new_steps == 0:
                break  # nothing more to read before the last step: reported as steps_stored < steps
        seconds = time.perf_counter() - start
        stored = store.count_steps(run_id)
    return IngestFigures(seconds, ticks, stored, (database_bytes(url) - before) / 1e6)


@dataclass
class _TimedSource:
    """A MetricsFile that notes when a poll first returned each step's line."""

    inner: MetricsFile
    read_at: dict[int, float] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.inner.path

    def poll(self, *, final: bool = False) -> MetricsBatch:
        batch = self.inner.poll(final=final)
        now = time.monotonic()
        for item in batch.items:
            if isinstance(item, StepRecord):
                self.read_at.setdefault(item.step, now)
        return batch


@dataclass(frozen=True)
class TailFigures:
    steps: int
    rate: float
    poll_interval_s: float
    nan_steps: list[int]
    read: Spread
    judged: Spread
    finding: Spread
    other_findings: list[str]
    missing: int


def nan_steps_for(count: int, every: int) -> set[int]:
    """Pairs of steps (k*every, k*every+1) that fit in 1..count: a warning, then a critical."""
    if every <= 0:
        return set()
    return {s for k in range(every, count, every) for s in (k, k + 1)}


def tail_latency(home: Path, url: str, keys: int, rate: float, seconds: float, nan_every: int) -> TailFigures:
    """A writer thread appends steps at ``rate``/s while an IncidentTick (store at ``url``) runs in guardian watch's
    loop in another."""
    count = max(1, round(rate * seconds))
    run = SyntheticRun(count, keys, seed=SEED + 7)
    nan_steps = nan_steps_for(count, nan_every)
    lines = [run.line(step, nan_grad=step in nan_steps) for step in range(1, count + 1)]  # made before timing
    home.mkdir(parents=True, exist_ok=True)
    path = home / "live.jsonl"
    path.touch()
    config = GuardianConfig(home=home)
    run_id = fresh_run_id("bench-live")
    appended: dict[int, float] = {}
    judged: dict[int, float] = {}
    findings: dict[int, float] = {}
    others: list[str] = []
    source = _TimedSource(guarded_file(path))
    followed = FollowedFile(source)
    with _open_store(url, run_id, path) as store:
        guardian = IncidentTick(config=config, store=store, run_id=run_id, metrics=followed, clock=time.time)
        seen = 0

        class Judged:
            """The watch's display: runs in the guardian's thread right after the tick that read, judged and stored
            the steps."""

            def show(self, result: TickResult, file: FileState, snapshot: RunSnapshot) -> None:
                nonlocal seen
                now = time.monotonic()
                steps = guardian.history.steps
                for step in steps[seen:]:
                    judged.setdefault(step, now)
                seen = len(steps)

            def finish(self, snapshot: RunSnapshot) -> None:
                return None

        def on_transition(_run_id: str, t: Transition) -> None:
            now = time.monotonic()
            f = t.finding
            if t.change not in (Change.RAISED, Change.ESCALATED):
                return
            if f.check == "non_finite" and f.step is not None:
                findings.setdefault(f.step, now)
            else:
                others.append(f"{f.check}:{f.severity.label}@{f.step}")

        guardian.on_transition.append(on_transition)

        def write() -> None:
            with path.open("ab", buffering=0) as out:  # unbuffered, like verl's file logger
                begin = time.monotonic()
                for i, line in enumerate(lines):
                    wait = begin + i / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    out.write(line)
                    appended[i + 1] = time.monotonic()

        stop = threading.Event()
        loop = WatchLoop(
            guardian, followed, TrainerLiveness(None), Judged(), follow=True, total_steps=None, wait=stop.wait
        )
        watcher = threading.Thread(target=loop.run, name="guardian")
        writer = threading.Thread(target=write, name="writer")
        watcher.start()
        writer.start()
        writer.join()
        deadline = time.monotonic() + 10.0
        while len(judged) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        watcher.join()

    def lag(at: dict[int, float]) -> list[float]:
        return [at[s] - appended[s] for s in sorted(appended) if s in at]

    return TailFigures(
        steps=count,
        rate=rate,
        poll_interval_s=config.sources.poll_interval_s,
        nan_steps=sorted(nan_steps),
        read=Spread.of(lag(source.read_at)),
        judged=Spread.of(lag(judged)),
        finding=Spread.of(lag(findings)),
        other_findings=others,
        missing=count - len(judged),
    )


# -- the whole bench --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OtherStore:
    """The store figures again on the database of ``--db-url`` (its URL shown masked)."""

    url: str
    backend: str
    ingest: IngestFigures
    tail: TailFigures


@dataclass(frozen=True)
class Figures:
    steps: int
    keys: int
    file_mb: float
    nulls: int
    generate_s: float
    parse_s: float
    replay: ReplayFigures
    every_key_db_mb: float
    import_only: Memory
    ingest: IngestFigures
    tail: TailFigures
    other: OtherStore | None

    @property
    def values(self) -> int:
        return self.steps * self.keys

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["values"] = self.values
        out["replay"].update(
            values_per_s=self.values / self.replay.seconds,
            replay_over_parse=self.replay.seconds / self.parse_s,
            verdict=self.replay.verdict,
            rss_over_import_only_kib=self.replay.memory.rss_kib - self.import_only.rss_kib,
        )
        out["ingest"]["values_per_s"] = self.values / self.ingest.seconds
        if self.other is not None:
            out["other"]["ingest"]["values_per_s"] = self.values / self.other.ingest.seconds
        out["targets"] = {
            "replay_s": TARGET_REPLAY_S,
            "p95_latency_s": TARGET_P95_LATENCY_S,
            "rss_mb": TARGET_RSS_MB,
            "replay_over_parse": TARGET_REPLAY_OVER_PARSE,
            "ingest_over_replay": TARGET_INGEST_OVER_REPLAY,
            "db_mb": TARGET_DB_MB,
        }
        out["ingest"]["over_replay"] = self.ingest.seconds / self.replay.seconds
        out["met"] = self.met()
        return out

    def met(self) -> dict[str, bool]:
        return {
            "replay_s": self.replay.seconds < TARGET_REPLAY_S,
            "p95_latency_s": self.tail.judged.p95 < TARGET_P95_LATENCY_S,
            "rss_mb": self.replay.memory.mb < TARGET_RSS_MB,
            "ratio": self.replay.seconds <= TARGET_REPLAY_OVER_PARSE * self.parse_s,
            "ingest": self.ingest.seconds <= TARGET_INGEST_OVER_REPLAY * self.replay.seconds,
            "db": self.ingest.db_mb <= TARGET_DB_MB,
        }


def render(fig: Figures) -> str:
    met = fig.met()

    def status(key: str) -> str:
        return "ok" if met[key] else "MISSED"

    r, i, t = fig.replay, fig.ingest, fig.tail
    hwm = f", VmHWM {r.memory.hwm_kib * 1024 / 1e6:.0f} MB" if r.memory.hwm_kib else ""
    rows: list[tuple[str, str, str, str]] = [
        ("full replay (parse + default checks)", f"{r.seconds:.2f} s", f"< {TARGET_REPLAY_S:g} s", status("replay_s")),
        ("  values/s", f"{fig.values / r.seconds:,.0f}", "", ""),
        ("  verdict on the synthetic run", f"{r.verdict} ({len(r.raised)} finding(s) raised)", "", ""),
        ("orjson parse only, line by line", f"{fig.parse_s:.2f} s", "", ""),
        ("  replay / parse", f"{r.seconds / fig.parse_s:.1f}x", f"<= {TARGET_REPLAY_OVER_PARSE:g}x", status("ratio")),
        ("ingest with store (IncidentTick.tick, SQLite)", f"{i.seconds:.2f} s", "", ""),
        ("  values/s", f"{fig.values / i.seconds:,.0f}", "", ""),
        ("  ingest / replay", f"{i.seconds / r.seconds:.1f}x", f"<= {TARGET_INGEST_OVER_REPLAY:g}x", status("ingest")),
        ("  ticks / steps stored / db size", f"{i.ticks} / {i.steps_stored} / {i.db_mb:.1f} MB", "", ""),
        (
            "  db size: kept keys / every key",
            f"{i.db_mb:.1f} / {fig.every_key_db_mb:.1f} MB",
            f"<= {TARGET_DB_MB:g} MB",
            status("db"),
        ),
        (f"tail: append -> read (poll {t.poll_interval_s:g} s)", str(t.read), "", ""),
        ("tail: append -> judged+stored", str(t.judged), f"p95 < {TARGET_P95_LATENCY_S:g} s", status("p95_latency_s")),
        ("tail: append -> non_finite finding", str(t.finding), "", ""),
        ("peak RSS, replay subprocess", f"{r.memory.mb:.0f} MB{hwm}", f"< {TARGET_RSS_MB:g} MB", status("rss_mb")),
        ("peak RSS, import-only subprocess", f"{fig.import_only.mb:.0f} MB", "", ""),
        ("  replay minus import-only", f"{r.memory.mb - fig.import_only.mb:.0f} MB", "", ""),
    ]
    header = ("figure", "value (latencies: p50 / p95 / max)", "target", "status")
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(4)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [
        f"synthetic verl run: {fig.steps} steps x {fig.keys} keys = {fig.values:,} values, {fig.file_mb:.0f} MB, "
        f"{fig.nulls} nulls (generated in {fig.generate_s:.1f} s)",
        f"tail run: {t.steps} steps at {t.rate:g} steps/s; null actor/grad_norm at steps "
        + (",".join(map(str, t.nan_steps)) or "none"),
    ]
    if t.other_findings:
        out.append(f"  other findings raised during the tail run: {', '.join(t.other_findings)}")
    if t.missing:
        out.append(f"  WARNING: {t.missing} step(s) never judged during the tail run")
    if i.steps_stored != fig.steps:
        out.append(f"  WARNING: the store holds {i.steps_stored} of {fig.steps} steps")
    out += ["", line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]
    if fig.other is not None:
        out += ["", *side_by_side(fig, fig.other)]
    return "\n".join(out)


def side_by_side(fig: Figures, other: OtherStore) -> list[str]:
    """The store figures of SQLite and of ``--db-url``'s database in two columns."""
    rows: list[tuple[str, str, str]] = [
        ("store (same file, same IncidentTick.tick)", "SQLite (temp file)", other.backend)
    ]
    for name, ingest in (("ingest", fig.ingest), ("other", other.ingest)):
        if ingest.steps_stored != fig.steps:
            rows.append((f"WARNING: {name} stored {ingest.steps_stored} of {fig.steps} steps", "", ""))
    pairs = [(fig.ingest, fig.tail), (other.ingest, other.tail)]
    rows += [
        (f"ingest {fig.steps} steps", *(f"{i.seconds:.2f} s" for i, _ in pairs)),
        ("  values/s", *(f"{fig.values / i.seconds:,.0f}" for i, _ in pairs)),
        ("  ticks / steps stored / db growth", *(f"{i.ticks} / {i.steps_stored} / {i.db_mb:.0f} MB" for i, _ in pairs)),
        ("tail: append -> judged+stored", *(str(t.judged) for _, t in pairs)),
        ("tail: append -> non_finite finding", *(str(t.finding) for _, t in pairs)),
    ]
    widths = [max(len(row[k]) for row in rows) for k in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:], f"{other.backend}: {other.url}"]


def run_bench(args: argparse.Namespace, progress: Callable[[str], None]) -> tuple[Figures, str | None]:
    with tempfile.TemporaryDirectory(prefix="guardian-bench-") as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "metrics.jsonl"
        progress(f"generating {args.steps} x {args.keys} ...")
        start = time.perf_counter()
        run = SyntheticRun(args.steps, args.keys)
        size = write_run(path, run)
        generate_s = time.perf_counter() - start
        progress("parse only ...")
        parse_s = parse_only(path)
        progress("replay (subprocess) ...")
        replay = replay_in_subprocess(path)
        import_only = import_only_memory()
        progress("ingest with store ...")
        ingest = ingest_with_store(path, tmp / "store-home", sqlite_url(tmp / "store-home"), args.steps)
        progress("store with every key (the baseline of its size) ...")
        every_key = every_key_db_mb(path, tmp / "every-key-home")
        progress(f"tail latency ({args.seconds:g} s) ...")
        tail_args = (args.keys, args.rate, args.seconds, args.nan_every)
        tail = tail_latency(tmp / "live-home", sqlite_url(tmp / "live-home"), *tail_args)
        other = None
        if args.db_url:
            kind = make_url(args.db_url).get_backend_name()
            backend = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}.get(kind, kind)
            progress(f"ingest with store and tail latency on {mask_url(args.db_url)} ...")
            other = OtherStore(
                mask_url(args.db_url),
                backend,
                ingest_with_store(path, tmp / "other-home", args.db_url, args.steps),
                tail_latency(tmp / "other-live-home", args.db_url, *tail_args),
            )
        profile = None
        if args.profile:
            progress("profiling the replay ...")
            phases = replay_breakdown(path)
            total = sum(phases.values())
            profile = "replay time by phase (in-process, timed per call):\n" + "\n".join(
                f"  {name:32} {seconds:6.2f} s  {100 * seconds / total:4.0f}%" for name, seconds in phases.items()
            )
            profile += (
                f"\n  {'total':32} {total:6.2f} s\n\ncProfile of the replay (in-process, slower than unprofiled):\n"
            )
            profile += profile_replay(path)
    figures = Figures(
        steps=args.steps,
        keys=args.keys,
        file_mb=size / 1e6,
        nulls=run.nulls,
        generate_s=generate_s,
        parse_s=parse_s,
        replay=replay,
        every_key_db_mb=every_key,
        import_only=import_only,
        ingest=ingest,
        tail=tail,
        other=other,
    )
    return figures, profile


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10_000, help="steps in the synthetic run (default 10000)")
    parser.add_argument("--keys", type=int, default=300, help="keys per step (default 300)")
    parser.add_argument("--rate", type=float, default=20.0, help="tail test: steps appended per second (default 20)")
    parser.add_argument("--seconds", type=float, default=10.0, help="tail test: how long the writer runs (default 10)")
    parser.add_argument(
        "--nan-every", type=int, default=25, help="tail test: null grad_norm on 2 steps every N (default 25; 0: none)"
    )
    parser.add_argument(
        "--db-url",
        help="also run the store figures (ingest, tail) on this database, beside SQLite: a scratch one (each bench "
        "adds two runs); e.g. postgresql+psycopg://USER:PASSWORD@127.0.0.1/bench",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--profile", action="store_true", help="also profile the replay with cProfile (in-process)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.keys < len(CORE) or args.rate <= 0 or args.seconds <= 0:
        parser.error(f"--steps must be >= 1, --keys >= {len(CORE)}, --rate and --seconds > 0")
    if args.db_url:
        try:
            Store.open(args.db_url).close()  # refused now, not after the SQLite half
        except StoreError as exc:
            parser.error(f"--db-url: {exc}")  # the password masked
    # the daemon logs its findings; without the CLI's handler Python would print them to stderr
    logging.getLogger("guardian").addHandler(logging.NullHandler())
    logging.getLogger("guardian").propagate = False

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    figures, profile = run_bench(args, progress)
    total = time.perf_counter() - started
    if args.json:
        doc = {**figures.to_json(), "bench_seconds": total, "profile": profile}
        print(json.dumps(json_safe(doc), indent=1, allow_nan=False))
        return 0
    print(render(figures))
    print(f"\nwhole bench: {total:.1f} s")
    if profile:
        print("\n" + profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
