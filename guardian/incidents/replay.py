"""Run the checks over a finished log as if it were live: each step judged when its metrics line arrives and
again when its rollout statistics do (``feed_step``). Used by ``guardian replay``, the benchmarks and a restart.

Reads verl's JSONL, or console lines when asked or when the JSONL held no step; a replay that read no step keeps
what the file looked like (``ReplayResult.shape``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from guardian.checks import CheckContext, build_checks, evaluate
from guardian.checks.policy import too_little_to_judge
from guardian.config import ChecksConfig, SourcesConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.history.timeline import Arrival, RunHistory
from guardian.incidents.tracker import Change, StatusTracker, Transition
from guardian.keys import CHECKED_KEYS, Signal, signals_present
from guardian.sources.console import iter_console_records
from guardian.sources.jsonl import BadLineReport, iter_records
from guardian.sources.rollouts import read_finished
from guardian.sources.sniff import TraceKind, TraceShape, read_sample, sniff


@dataclass
class ReplayResult:
    run: str
    steps: int = 0
    transitions: list[Transition] = field(default_factory=list)
    signals: dict[str, str] = field(default_factory=dict)
    bad_lines: list[BadLineReport] = field(default_factory=list)
    rollout_problems: list[str] = field(default_factory=list)
    rewinds: int = 0
    console: bool = False  # read as verl console lines
    shape: TraceShape | None = None  # what the file looked like, when no step was read as JSONL
    too_little: str | None = None  # why the steps read are too few to judge (policy.too_little_to_judge)

    @property
    def raised(self) -> list[Finding]:
        """Findings that entered or worsened trouble, in order."""
        return [t.finding for t in self.transitions if t.change in (Change.RAISED, Change.ESCALATED)]

    @property
    def first_critical(self) -> Finding | None:
        return next((f for f in self.raised if f.severity == Severity.CRITICAL), None)

    @property
    def healthy(self) -> bool:
        return self.first_critical is None

    @property
    def verdict(self) -> str:
        if self.first_critical is not None:
            return "unhealthy"
        return "not_enough_data" if self.too_little else "healthy"

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run,
            "steps": self.steps,
            "signals": self.signals,
            "findings": [f.to_json() for f in self.raised],
            "verdict": self.verdict,
            "too_little": self.too_little,
            "first_critical_step": self.first_critical.step if self.first_critical else None,
            "format": "console" if self.console else "jsonl",
            "bad_lines": len(self.bad_lines),
            "rollout_problems": len(self.rollout_problems),
            "rewinds": self.rewinds,
        }


def replay_records(
    records: Iterable[StepRecord],
    checks_config: ChecksConfig,
    *,
    run: str,
    rules: str | None = None,
    rollout_stats: Mapping[int, Mapping[str, float]] | None = None,
    history: RunHistory | None = None,
) -> ReplayResult:
    checks = build_checks(checks_config, rules)
    history = history if history is not None else RunHistory()
    ctx = CheckContext(history, checks_config.baseline)
    tracker = StatusTracker()
    result = ReplayResult(run=run)
    pending = dict(rollout_stats or {})
    for record in records:
        transitions, arrival = feed_step(history, tracker, lambda: evaluate(ctx, checks), record, pending)
        result.rewinds += arrival is Arrival.REWOUND
        result.transitions.extend(transitions)
    result.steps = len(history.steps)
    result.signals = {s.value: key for s, key in signals_present(frozenset(history.keys_seen)).items()}
    if history.has(Signal.VAL_SCORE):
        result.signals.setdefault(Signal.VAL_SCORE.value, Signal.VAL_SCORE.value)
    result.too_little = too_little_to_judge(result.steps, result.signals, checks_config.policy)
    return result


def feed_step(
    history: RunHistory,
    tracker: StatusTracker,
    judge: Callable[[], list[Finding]],
    record: StepRecord,
    pending: dict[int, Mapping[str, float]],
) -> tuple[list[Transition], Arrival]:
    """One metrics line as the live guard loop sees it: the line is judged, then the rollout statistics
    of its step (and any earlier ones still pending), which arrive after it, are merged and judged again.
    ``pending`` loses the statistics merged. The replay and a rebuilding guardian both go through here, so
    they reach the decisions the live loop reached."""
    arrival = history.add(record)
    transitions = tracker.update(judge())
    due = sorted(step for step in pending if step <= record.step)
    for step in due:
        history.merge(step, pending.pop(step))
    if due:
        transitions += tracker.update(judge())
    return transitions, arrival


def replay_file(
    path: Path,
    checks_config: ChecksConfig,
    *,
    rules: str | None = None,
    rollouts: Path | None = None,
    history: RunHistory | None = None,
    console: bool = False,
    sources: SourcesConfig | None = None,
) -> ReplayResult:
    """Replay a metrics JSONL file (or, ``console``, a stdout log) streamed, with rollout dumps from
    ``rollouts`` if given. ``sources`` holds the limits on a line and on a step's keys (the defaults if
    None): pass the configured ones, so the replay judges the file as ``guardian run`` and ``watch`` do."""
    limits = sources if sources is not None else SourcesConfig()
    stats, problems = (
        read_finished(rollouts, max_line_bytes=limits.max_line_bytes) if rollouts is not None else ({}, [])
    )
    bad: list[BadLineReport] = []
    chunks = (
        iter_console_records(path, max_line_bytes=limits.max_line_bytes)
        if console
        else iter_records(
            path, keys=CHECKED_KEYS, max_line_bytes=limits.max_line_bytes, max_keys=limits.max_keys_per_step
        )
    )

    def records() -> Iterable[StepRecord]:
        for chunk, chunk_bad in chunks:
            bad.extend(chunk_bad)
            yield from chunk

    result = replay_records(
        records(),
        checks_config,
        run=path.stem,
        rules=rules,
        rollout_stats=stats,
        history=history,
    )
    result.bad_lines = bad
    result.rollout_problems = problems
    result.console = console
    return result


def replay_trace(
    path: Path,
    checks_config: ChecksConfig,
    *,
    console: bool = False,
    rules: str | None = None,
    rollouts: Path | None = None,
    sources: SourcesConfig | None = None,
) -> ReplayResult:
    """``replay_file``, reading the file as a console log when asked or when its JSONL held no step but
    its head has verl console lines; a result without steps says what the file looked like (``shape``)."""
    result = replay_file(path, checks_config, rules=rules, rollouts=rollouts, console=console, sources=sources)
    if result.steps:
        return result
    sample, truncated = read_sample(path)
    shape = sniff(sample, truncated=truncated)
    if not console and shape.kind is TraceKind.CONSOLE:
        result = replay_file(path, checks_config, rules=rules, rollouts=rollouts, console=True, sources=sources)
    result.shape = shape
    return result
