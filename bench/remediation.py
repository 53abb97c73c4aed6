"""Remediation benchmark: does the closed loop rescue a run, how many steps does it throw away, how fast.

    python bench/remediation.py [--seeds 1,2,3] [--scenarios entropy_collapse,healthy,crash,nan,kl_blowup]
                                [--steps NAME=N,...] [--transient] [--json] [--log-level LEVEL]

Every scenario x seed is one real run of the demo trainer (``guardian.demo.trainer``, a subprocess)
guarded in-process by the ``Supervisor`` in enforce mode, exactly as ``guardian demo`` does it: a fresh
temporary guardian home (SQLite store, run folders) per run, ``demo_config(GuardianConfig())`` for the
pace (0.1 s polls, 20 probation steps, 5 s stop waits), the scenario's command line with
``+trainer.seed=S`` and ``+trainer.fault.slow_steps=0.01``. Every scenario runs its own length (300
steps for ``entropy_collapse`` and ``healthy``, 100 for ``kl_blowup``, 40 for ``nan``, 30 for ``crash``):
the default invocation takes about 2 minutes on 2 cores; ``--steps NAME=N,...`` shortens (or
lengthens) a scenario. ``--transient`` adds ``+trainer.fault.transient=true``: injected faults
(nan, crash, hang) then spare a run resumed from a checkpoint.

Per run: the exit code (0 finished, 93 gave up), the incidents and their final status, and for each
intervention, from the store's persisted timeline (``Store.intervention_events``):

- detection step: the incident's ``opened_step``; rollback step: the intervention's ``target_step``
  (``scratch``: no healthy checkpoint before the onset, restarted from step 0);
- steps lost: detection step - rollback step, next to the scenario's ``save_freq``;
- stopped: the last step the stopped attempt logged (it runs on for a moment while being stopped);
- reaction: incident opened -> DETECTED event (first intervention of an incident; JSON and summary).
  An incident's ``opened_at`` is the clock of the tick that read its step, so this is the time the
  guardian took to read, judge and store that tick's batch before it acted;
- stop: time from the DETECTED event to the STOPPED event (stopping the trainer's process group);
- latency: time from the DETECTED event to the RESUMING event, which is committed right before the
  relaunch - the guardian's own work (stop, quarantine, patch, validate), excluding the trainer's
  start-up;
- start-up: RESUMING to PROBATION (the relaunched trainer's first new step), for context.

- reward at the rollback point, after, and their ratio: the level (mean of 5 steps) the probation
  compared - at the checkpoint resumed from, and on the new branch when the intervention ended (the
  figures recorded on the intervention, ``outcome.py``).

Per run, beside the guarded run's final reward (mean of its last 10 steps), the baseline measured in the
same invocation: the same scenario and seed run unguarded.

Summary per scenario: recovery rate (runs that finished with exit 0 and whose every acted-on incident
ended resolved, over runs), median/max steps lost, median/p95/max latency (target < 2 s), reward after
resolution / reward at the rollback point (target >= 1.0 for every intervention that ended resolved or
unresolved), the final reward guarded vs unguarded, and interventions on healthy runs (target 0). No
assertions: the figures are printed beside the targets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from common import json_safe

from guardian.commands.compose import supervisor as local_supervisor
from guardian.commands.demo import FINAL_STEPS, demo_config
from guardian.commands.run import register_run
from guardian.config import GuardianConfig
from guardian.demo.scenarios import SCENARIOS, RunFiles, Scenario
from guardian.exits import EXIT_GAVE_UP, EXIT_OK
from guardian.keys import VERL_ALIASES, Signal
from guardian.rescue.supervisor import Supervisor
from guardian.sources.jsonl import read_all
from guardian.store import Store
from guardian.store.interventions import InterventionEventView

DEFAULT_SEEDS = (1, 2, 3)
DEFAULT_SCENARIOS = ("entropy_collapse", "seed_settings", "healthy", "crash", "nan", "kl_blowup")
TARGET_REWARD_RATIO = 1.0
ENDED = ("RESOLVED", "UNRESOLVED")  # interventions whose probation ran to its end (a relapse's figures do not count)
# run lengths other than the scenario's own (none by default: the default invocation is ~2 min on 2 cores)
DEFAULT_STEPS: dict[str, int] = {}
SLOW_STEPS_S = 0.01
REWARD_KEY = VERL_ALIASES[Signal.REWARD][0]  # critic/score/mean, which the demo trainer logs
TARGET_LATENCY_S = 2.0

# a safety net per run (the hang scenario's restarts wait out a 60 s start-up allowance each)
RUN_TIMEOUT_S = 600.0


# -- one run ------------------------------------------------------------------------------------------
@dataclass
class InterventionRecord:
    number: int
    incident_id: int
    check: str
    kind: str  # remediate | restart
    rung: int  # 1-based
    state: str  # final state: RESOLVED, RELAPSED, GAVE_UP
    detection_step: int | None
    onset_step: int | None
    rolled_back: bool  # a ROLLED_BACK event was committed
    rollback_step: int | None  # None with rolled_back: from scratch
    steps_lost: int | None
    stopped_step: int | None  # the last step the stopped attempt logged (it runs on while being stopped)
    reaction_s: float | None  # incident opened -> DETECTED (first intervention of an incident only)
    stop_s: float | None  # DETECTED -> STOPPED
    latency_s: float | None  # DETECTED -> RESUMING (the relaunch commit)
    startup_s: float | None  # RESUMING -> PROBATION (the relaunched trainer's first new step)
    incident_status: str
    why: str  # the final event's reason (relapse, give-up), if any
    message: str = ""  # the incident's message (its latest finding)
    patch: list[list[object]] = field(default_factory=list)  # the PATCHED event's diff: [key, before, after]
    states: list[str] = field(default_factory=list)
    reward_at_rollback: float | None = None  # the probation's figures (outcome.py), when it ended
    reward_after: float | None = None
    reward_ratio: float | None = None


@dataclass
class IncidentRecord:
    id: int
    check: str
    severity: str
    status: str
    opened_step: int | None


@dataclass
class RunRecord:
    scenario: str
    seed: int
    steps: int
    save_freq: int | None
    exit_code: int | None  # None: the bench's own timeout stopped it
    last_step: int | None
    wall_s: float
    attempts: int
    incidents: list[IncidentRecord]
    interventions: list[InterventionRecord]
    final_reward: float | None = None  # mean of the last FINAL_STEPS steps of the run's timeline
    unguarded_final_reward: float | None = None  # the same scenario and seed, unguarded, same invocation

    @property
    def finished(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def recovered(self) -> bool:
        """Finished, and every incident the guardian acted on ended resolved."""
        acted = {iv.incident_id for iv in self.interventions}
        return self.finished and all(i.status == "resolved" for i in self.incidents if i.id in acted)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "finished": self.finished, "recovered": self.recovered}


def save_freq_of(scenario: Scenario) -> int | None:
    for override in (*scenario.overrides, *scenario.extra):
        if override.startswith("trainer.save_freq="):
            return int(override.split("=", 1)[1])
    return None


def bench_scenario(name: str, seed: int, steps: int | None, transient: bool) -> Scenario:
    base = SCENARIOS[name]
    extra = [f"+trainer.fault.slow_steps={SLOW_STEPS_S}"]
    if transient:
        extra.append("+trainer.fault.transient=true")
    return dataclasses.replace(base, seed=seed, steps=steps or base.steps, extra=tuple(extra))


def _seconds(events: Sequence[InterventionEventView], start: str, end: str) -> float | None:
    first = next((e.at for e in events if e.state == start), None)
    last = next((e.at for e in events if e.state == end), None)
    return (last - first).total_seconds() if first is not None and last is not None else None


def run_one(scenario: Scenario, *, timeout_s: float = RUN_TIMEOUT_S) -> RunRecord:
    """``scenario`` under the supervisor in enforce mode, in a fresh guardian home; the figures."""
    with tempfile.TemporaryDirectory(prefix="guardian-remediation-") as tmp:
        config = demo_config(GuardianConfig(home=Path(tmp) / "home"))
        run_id = f"bench-{scenario.name}-s{scenario.seed}"
        files = RunFiles(config.home.resolve() / "runs" / run_id / "trainer")
        files.root.mkdir(parents=True, exist_ok=True)
        command = tuple(scenario.command(files))
        started = time.monotonic()
        with Store.open(config.database_url()) as store:
            supervisor = local_supervisor(config, store, run_id=run_id, command=command, cwd=files.root)
            name = f"bench {scenario.name} seed {scenario.seed}"
            register_run(store, supervisor.layout, mode=config.mode, name=name)
            supervisor.start()
            wait = threading.Event()
            code: int | None = None
            try:
                while code is None:
                    code = supervisor.tick()
                    if code is None and time.monotonic() - started > timeout_s:
                        _stop(supervisor)
                        break
                    wait.wait(config.sources.poll_interval_s)
            except BaseException:
                _stop(supervisor)  # never leave a trainer running behind an interrupted bench
                raise
            wall = time.monotonic() - started
            history = supervisor.incident_tick.history
            record = _record(store, run_id, scenario, code, history.last_step, wall)
            record.final_reward = final_reward(history.signal(Signal.REWARD).values)
            return record


def final_reward(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)][-FINAL_STEPS:]
    return statistics.fmean(finite) if finite else None


def unguarded_final_reward(scenario: Scenario) -> float | None:
    """The same scenario and seed without a guardian: its final reward."""
    with tempfile.TemporaryDirectory(prefix="guardian-unguarded-") as tmp:
        files = RunFiles(Path(tmp))
        scenario.run(files.root, timeout=RUN_TIMEOUT_S)
        records, _ = read_all(files.metrics)
        return final_reward([r.data[REWARD_KEY] for r in records if REWARD_KEY in r.data])


def _stop(supervisor: Supervisor) -> None:
    attempt = supervisor.trainer.attempt
    if attempt is not None and attempt.handle is not None:
        supervisor.trainer.control.stop(attempt.handle, supervisor.trainer.stop_policy())


def _record(
    store: Store, run_id: str, scenario: Scenario, code: int | None, last_step: int | None, wall: float
) -> RunRecord:
    incidents = {i.id: i for i in store.list_incidents(run_id)}
    attempts = {a.id: a for a in store.attempts(run_id)}
    interventions: list[InterventionRecord] = []
    seen: set[int] = set()
    for iv in store.interventions(run_id):
        events = store.intervention_events(iv.id)
        incident = incidents[iv.incident_id]
        stopped = attempts.get(iv.from_attempt_id) if iv.from_attempt_id is not None else None
        reaction = None
        if iv.incident_id not in seen and events:
            reaction = (events[0].at - incident.opened_at).total_seconds()
        seen.add(iv.incident_id)
        rolled_back = any(e.state == "ROLLED_BACK" for e in events)
        detected = incident.opened_step
        lost = None
        if rolled_back and detected is not None:
            lost = detected - (iv.target_step or 0)
        outcome = next((e.detail.get("outcome") for e in reversed(events) if "outcome" in e.detail), None)
        reward = outcome.get("reward") if isinstance(outcome, dict) else None
        interventions.append(
            InterventionRecord(
                number=iv.number,
                incident_id=iv.incident_id,
                check=incident.check,
                kind=iv.kind,
                rung=iv.rung + 1,
                state=iv.state,
                detection_step=detected,
                onset_step=incident.onset_step,
                rolled_back=rolled_back,
                rollback_step=iv.target_step,
                steps_lost=lost,
                stopped_step=_last_step(Path(stopped.metrics_path)) if stopped is not None else None,
                reaction_s=reaction,
                stop_s=_seconds(events, "DETECTED", "STOPPED"),
                latency_s=_seconds(events, "DETECTED", "RESUMING"),
                startup_s=_seconds(events, "RESUMING", "PROBATION"),
                incident_status=incident.status,
                why=str(events[-1].detail.get("why", "")) if events else "",
                message=incident.message,
                patch=next((list(e.detail.get("diff", [])) for e in events if e.state == "PATCHED"), []),  # type: ignore[call-overload]
                states=[e.state for e in events],
                reward_at_rollback=reward.get("at_rollback") if isinstance(reward, dict) else None,
                reward_after=reward.get("now") if isinstance(reward, dict) else None,
                reward_ratio=reward.get("ratio") if isinstance(reward, dict) else None,
            )
        )
    return RunRecord(
        scenario=scenario.name,
        seed=scenario.seed,
        steps=scenario.steps,
        save_freq=save_freq_of(scenario),
        exit_code=code,
        last_step=last_step,
        wall_s=wall,
        attempts=len(attempts),
        incidents=[
            IncidentRecord(i.id, i.check, i.severity.label, i.status, i.opened_step)
            for i in sorted(incidents.values(), key=lambda i: i.id)
        ],
        interventions=interventions,
    )


def _last_step(metrics: Path) -> int | None:
    """The last step in a metrics JSONL file (read before the temporary home goes)."""
    try:
        lines = metrics.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


# -- summary ------------------------------------------------------------------------------------------
def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile (with a handful of values: the largest or next to largest)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


@dataclass
class Spread:
    n: int
    median: float | None
    p95: float | None
    max: float | None
    min: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(0, None, None, None)
        return cls(len(values), statistics.median(values), p95(values), max(values), min(values))


@dataclass
class ScenarioSummary:
    scenario: str
    save_freq: int | None
    steps: int
    runs: int
    finished: int
    gave_up: int
    other_exit: int
    recovered: int
    interventions: int
    resolved: int
    relapsed: int
    gave_up_interventions: int
    checks: dict[str, int]
    steps_lost: Spread
    latency_s: Spread
    stop_s: Spread
    startup_s: Spread
    wall_s: float
    reward_ratio: Spread  # after / at the rollback point, interventions that ended resolved or unresolved
    final_reward: Spread
    unguarded_final_reward: Spread

    @property
    def recovery_rate(self) -> float:
        return self.recovered / self.runs if self.runs else math.nan


def summarise(name: str, runs: Sequence[RunRecord]) -> ScenarioSummary:
    ivs = [iv for r in runs for iv in r.interventions]
    checks: dict[str, int] = {}
    for iv in ivs:
        checks[iv.check] = checks.get(iv.check, 0) + 1
    return ScenarioSummary(
        scenario=name,
        save_freq=runs[0].save_freq if runs else None,
        steps=runs[0].steps if runs else 0,
        runs=len(runs),
        finished=sum(r.exit_code == EXIT_OK for r in runs),
        gave_up=sum(r.exit_code == EXIT_GAVE_UP for r in runs),
        other_exit=sum(r.exit_code not in (EXIT_OK, EXIT_GAVE_UP) for r in runs),
        recovered=sum(r.recovered for r in runs),
        interventions=len(ivs),
        resolved=sum(iv.state == "RESOLVED" for iv in ivs),
        relapsed=sum(iv.state == "RELAPSED" for iv in ivs),
        gave_up_interventions=sum(iv.state == "GAVE_UP" for iv in ivs),
        checks=checks,
        steps_lost=Spread.of([float(iv.steps_lost) for iv in ivs if iv.steps_lost is not None]),
        latency_s=Spread.of([iv.latency_s for iv in ivs if iv.latency_s is not None]),
        stop_s=Spread.of([iv.stop_s for iv in ivs if iv.stop_s is not None]),
        startup_s=Spread.of([iv.startup_s for iv in ivs if iv.startup_s is not None]),
        wall_s=sum(r.wall_s for r in runs),
        reward_ratio=Spread.of([iv.reward_ratio for iv in ivs if iv.reward_ratio is not None and iv.state in ENDED]),
        final_reward=Spread.of([r.final_reward for r in runs if r.final_reward is not None]),
        unguarded_final_reward=Spread.of(
            [r.unguarded_final_reward for r in runs if r.unguarded_final_reward is not None]
        ),
    )


# -- output -------------------------------------------------------------------------------------------
def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _step(value: int | None) -> str:
    return "-" if value is None else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if k in right else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


def render(runs: Sequence[RunRecord], summaries: Sequence[ScenarioSummary], total_s: float) -> str:
    outcome = {EXIT_OK: "finished", EXIT_GAVE_UP: "gave up", None: "timeout"}
    header = (
        "scenario",
        "seed",
        "exit",
        "outcome",
        "last",
        "wall s",
        "#",
        "check",
        "kind",
        "rung",
        "end state",
        "detect",
        "stopped",
        "rollback",
        "lost",
        "save_freq",
        "stop s",
        "latency s",
        "start-up s",
        "reward @rb",
        "after",
        "ratio",
        "incident",
    )
    rows: list[list[str]] = []
    for r in runs:
        run_cells = [
            r.scenario,
            str(r.seed),
            _step(r.exit_code),
            outcome.get(r.exit_code, f"exit {r.exit_code}"),
            _step(r.last_step),
            f"{r.wall_s:.0f}",
        ]
        if not r.interventions:
            rows.append([*run_cells, *["-"] * 9, _step(r.save_freq), *["-"] * 7])
            continue
        for k, iv in enumerate(r.interventions):
            cells = run_cells if k == 0 else ["", "", "", "", "", ""]
            rollback = "-" if not iv.rolled_back else ("scratch" if iv.rollback_step is None else str(iv.rollback_step))
            rows.append(
                [
                    *cells,
                    str(iv.number),
                    iv.check,
                    iv.kind,
                    str(iv.rung),
                    iv.state,
                    _step(iv.detection_step),
                    _step(iv.stopped_step),
                    rollback,
                    _step(iv.steps_lost),
                    _step(r.save_freq),
                    _num(iv.stop_s),
                    _num(iv.latency_s),
                    _num(iv.startup_s, ".1f"),
                    _num(iv.reward_at_rollback, ".3f"),
                    _num(iv.reward_after, ".3f"),
                    _num(iv.reward_ratio),
                    iv.incident_status,
                ]
            )
    out = _table(header, rows, right={1, 2, 4, 5, 6, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21})
    finals = [
        [r.scenario, str(r.seed), _num(r.final_reward, ".3f"), _num(r.unguarded_final_reward, ".3f")] for r in runs
    ]
    out += ["", *_table(("scenario", "seed", "final reward, guarded", "unguarded (baseline)"), finals, {1, 2, 3})]

    def spread(s: Spread, fmt: str = ".2f", with_p95: bool = True) -> str:
        if not s.n:
            return "-"
        middle = f" / {_num(s.p95, fmt)}" if with_p95 else ""
        return f"{_num(s.median, fmt)}{middle} / {_num(s.max, fmt)}  (n={s.n})"

    summary_header = (
        "scenario",
        "runs",
        "finished",
        "gave up (93)",
        "recovered",
        "interventions (resolved/relapsed/gave up)",
        "steps lost med / max (save_freq)",
        "latency s med / p95 / max",
        "stop s med / max",
        "reward after/@rb med / min",
        "final reward guarded / unguarded (med)",
    )
    summary_rows = []
    for s in summaries:
        lost = spread(s.steps_lost, ".0f", with_p95=False)
        summary_rows.append(
            [
                s.scenario,
                str(s.runs),
                str(s.finished),
                str(s.gave_up),
                f"{s.recovered}/{s.runs} ({100 * s.recovery_rate:.0f}%)",
                f"{s.interventions} ({s.resolved}/{s.relapsed}/{s.gave_up_interventions})",
                f"{lost}  ({_step(s.save_freq)})" if s.steps_lost.n else f"-  ({_step(s.save_freq)})",
                spread(s.latency_s),
                spread(s.stop_s, with_p95=False),
                f"{_num(s.reward_ratio.median)} / {_num(s.reward_ratio.min)}  (n={s.reward_ratio.n})"
                if s.reward_ratio.n
                else "-",
                f"{_num(s.final_reward.median, '.3f')} / {_num(s.unguarded_final_reward.median, '.3f')}",
            ]
        )
    out += ["", *_table(summary_header, summary_rows, right={1, 2, 3})]
    every = Spread.of([iv.latency_s for r in runs for iv in r.interventions if iv.latency_s is not None])
    stops = Spread.of([iv.stop_s for r in runs for iv in r.interventions if iv.stop_s is not None])
    reaction = Spread.of([iv.reaction_s for r in runs for iv in r.interventions if iv.reaction_s is not None])
    healthy = [r for r in runs if r.scenario == "healthy"]
    out.append("")
    if every.n:
        status = "ok" if every.p95 is not None and every.p95 < TARGET_LATENCY_S else "MISSED"
        over = "" if every.max is None or every.max < TARGET_LATENCY_S else " (the max is over it)"
        out.append(
            f"guardian latency, DETECTED -> RESUMING (relaunch), all relaunches: median {_num(every.median)} s, "
            f"p95 {_num(every.p95)} s, max {_num(every.max)} s (n={every.n}); "
            f"target p95 < {TARGET_LATENCY_S:g} s: {status}{over}"
        )
    if stops.n:
        out.append(
            f"  of which DETECTED -> STOPPED (stopping the trainer): median {_num(stops.median)} s, "
            f"p95 {_num(stops.p95)} s, max {_num(stops.max)} s (n={stops.n})"
        )
    if reaction.n:
        out.append(
            f"incident opened -> DETECTED (first intervention per incident): median {_num(reaction.median, '.3f')} s, "
            f"max {_num(reaction.max, '.3f')} s (n={reaction.n})"
        )
    ratios = [
        iv.reward_ratio for r in runs for iv in r.interventions if iv.reward_ratio is not None and iv.state in ENDED
    ]
    if ratios:
        status = "ok" if min(ratios) >= TARGET_REWARD_RATIO else "MISSED"
        out.append(
            f"reward after the intervention / at the rollback point, every intervention that ended resolved or "
            f"unresolved: median {_num(statistics.median(ratios))}, min {_num(min(ratios))} (n={len(ratios)}); "
            f"target >= {TARGET_REWARD_RATIO:g} in every one: {status}"
        )
    compared = [(r.final_reward, r.unguarded_final_reward) for r in runs if r.interventions]
    compared = [(g, u) for g, u in compared if g is not None and u is not None]
    if compared:
        better = sum(g >= u for g, u in compared)
        out.append(f"final reward of a run the guardian acted on >= the same run unguarded: {better}/{len(compared)}")
    if healthy:
        n = sum(len(r.interventions) for r in healthy)
        out.append(
            f"interventions on healthy runs: {n} over {len(healthy)} run(s); target 0: {'ok' if n == 0 else 'MISSED'}"
        )
    out.append(f"whole bench: {total_s:.0f} s")
    return "\n".join(out)


def document(
    args: argparse.Namespace, runs: Sequence[RunRecord], summaries: Sequence[ScenarioSummary], total: float
) -> dict[str, object]:
    every = Spread.of([iv.latency_s for r in runs for iv in r.interventions if iv.latency_s is not None])
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": {
            "seeds": list(args.seeds),
            "scenarios": list(args.scenarios),
            "steps": {name: args.steps.get(name, SCENARIOS[name].steps) for name in args.scenarios},
            "slow_steps_s": SLOW_STEPS_S,
            "transient": args.transient,
            "target_latency_s": TARGET_LATENCY_S,
        },
        "runs": [r.to_json() for r in runs],
        "summary": {
            "scenarios": [{**asdict(s), "recovery_rate": s.recovery_rate} for s in summaries],
            "latency_s": asdict(every),
            "stop_s": asdict(Spread.of([iv.stop_s for r in runs for iv in r.interventions if iv.stop_s is not None])),
            "reaction_s": asdict(
                Spread.of([iv.reaction_s for r in runs for iv in r.interventions if iv.reaction_s is not None])
            ),
            "healthy_interventions": sum(len(r.interventions) for r in runs if r.scenario == "healthy"),
        },
        "bench_seconds": total,
    }


# -- command line ---------------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    return names


def _steps(text: str) -> dict[str, int]:
    steps = dict(DEFAULT_STEPS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in SCENARIOS or not value.isdigit():
            raise argparse.ArgumentTypeError(f"--steps wants NAME=N pairs with known names, got {part!r}")
        steps[name] = int(value)
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=_ints, default=DEFAULT_SEEDS, help="comma-separated seeds (default 1,2,3)")
    parser.add_argument(
        "--scenarios",
        type=_names,
        default=DEFAULT_SCENARIOS,
        help=f"comma-separated (default {','.join(DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--steps",
        type=_steps,
        default=dict(DEFAULT_STEPS),
        help="NAME=N,... run lengths (default: each scenario's own)",
    )
    parser.add_argument("--transient", action="store_true", help="injected faults spare a resumed run")
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    parser.add_argument("--log-level", default=None, help="show the guardian's own log lines at this level (stderr)")
    args = parser.parse_args(argv)
    logger = logging.getLogger("guardian")
    logger.propagate = False
    if args.log_level:
        from guardian.logs import init_logging

        init_logging(args.log_level)
    else:
        logger.handlers[:] = [logging.NullHandler()]

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.monotonic()
    runs: list[RunRecord] = []
    for name in args.scenarios:
        for seed in args.seeds:
            scenario = bench_scenario(name, seed, args.steps.get(name), args.transient)
            record = run_one(scenario)
            record.unguarded_final_reward = unguarded_final_reward(scenario)
            runs.append(record)
            progress(
                f"{name} seed {seed}: exit {record.exit_code}, {len(record.interventions)} intervention(s), "
                f"last step {record.last_step}, {record.wall_s:.0f} s"
            )
    total = time.monotonic() - started
    summaries = [summarise(name, [r for r in runs if r.scenario == name]) for name in args.scenarios]
    if args.json:
        print(json.dumps(json_safe(document(args, runs, summaries, total)), indent=1, allow_nan=False))
    else:
        print(render(runs, summaries, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
