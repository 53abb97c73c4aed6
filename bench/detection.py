"""Detection benchmark: replay every labelled trace with each rule set and score what fired.

    python bench/detection.py [--traces DIR] [--json]

For each trace in ``labels.json`` the metrics file is replayed step by step (``guardian.incidents.replay``), once
with the calibrated ``default`` rules and once with the tutorial's naive ``seed`` rules, and fed to a peer,
rlwatch 0.5.1 (``pip install rlwatch==0.5.1``, the ``bench`` extra; its column is left out, with a note,
when it is not installed). The table shows, per rule set, the first CRITICAL finding (step and check) and
its delay from the labelled onset; the summary scores each rule set: detection on unhealthy traces (all,
and the long ones only), false critical findings on healthy traces, median delay, and what fired on
borderline/ambiguous traces (reported, not scored).

rlwatch, fairly: its own ``DetectorSuite`` with its default configuration, one ``check_step`` per step,
fed from the guardian's reading of the run (``RunHistory``: every verl alias resolved, NaN kept as NaN) -
``entropy`` = actor/entropy (or entropy_loss), ``kl_divergence`` = actor/kl_loss (or reward_kl_penalty,
critic/kl), ``reward_mean`` = critic/score/mean, ``loss`` = actor/pg_loss, ``grad_norm`` =
actor/grad_norm; ``reward_std`` and ``advantage_std`` stay None (verl logs neither). Its own verl
integration maps ``actor/kl_divergence``, ``rewards/mean`` and ``training/grad_norm``, which verl does not
log, so fed that way it would see entropy only. A "critical" alert of any rlwatch detector counts.

Loading is kept apart from scoring: ``score(rows)`` takes ``(name, label, onset, result)`` rows, so
other sources of labelled runs (the demo trainer's scenarios) can be scored by replaying them with
``guardian.incidents.replay.replay_records`` and passing the rows in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from guardian.checks.findings import Finding, Severity
from guardian.config import ChecksConfig, GuardianConfig
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import ReplayResult, replay_file
from guardian.incidents.tracker import Change, Transition
from guardian.keys import Signal
from guardian.sources.jsonl import read_all

RULE_SETS: tuple[str, ...] = ("default", "seed")
PEER = "rlwatch"
DEFAULT_TRACES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "traces"
# Traces shorter than this are spot checks (4-6 rows in the calibration set): too sparse for windowed checks.
LONG_TRACE_STEPS = 20
UNHEALTHY = "unhealthy"
HEALTHY = "healthy"
UNSCORED_LABELS = ("borderline", "ambiguous")


# -- loading ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceCase:
    """One labelled trace from ``labels.json``."""

    name: str
    path: Path
    label: str
    mode: str | None
    onset: int | None
    labelled_by: str | None
    rollouts: Path | None = None  # the run's rollout dumps, for EGR (the demo scenarios have them)


def load_cases(traces: Path) -> list[TraceCase]:
    """The traces listed in ``traces/labels.json``, in its order."""
    entries = json.loads((traces / "labels.json").read_text(encoding="utf-8"))
    cases: list[TraceCase] = []
    for entry in entries:
        path = traces / entry["file"]
        cases.append(
            TraceCase(
                name=path.stem,
                path=path,
                label=entry["label"],
                mode=entry.get("mode"),
                onset=entry.get("onset_step"),
                labelled_by=entry.get("labelled_by"),
            )
        )
    return cases


# The two real verl 0.9.1 runs collapsed on purpose and guarded end to end (fixtures
# verl-0.9.1-run/guarded/README.md): the reward went flat while entropy fell 20-30 % a step. Their first
# attempt's metrics, replayed without dumps (attempt 2 overwrote the dumps of later steps).
GUARDED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "verl-0.9.1-run" / "guarded"
GUARDED_ONSETS: dict[str, int] = {"run-a": 15, "run-b": 20}


def guarded_cases() -> list[TraceCase]:
    return [
        TraceCase(
            f"verl:{name}",
            GUARDED / name / "attempt-1.metrics.jsonl",
            UNHEALTHY,
            "entropy_collapse",
            onset,
            "guarded/README.md",
        )
        for name, onset in GUARDED_ONSETS.items()
    ]


# The demo trainer's scenarios that a replay can judge (crash and hang need a live process and a wall
# clock: bench/remediation.py covers them), with their label and the documented onset of the trouble.
SCENARIO_LABELS: dict[str, tuple[str, int | None]] = {
    "healthy": (HEALTHY, None),
    # the reward stalls near 0.3 from ~step 30 while entropy, at 10 % of its start, keeps falling
    "entropy_collapse": (UNHEALTHY, 30),
    # the seed tutorial's settings: in this toy they converge near 0.85 with entropy exhausted (the
    # tutorial's rescue buys +0.02 in 300 steps); KL to the reference grows to ~1 nat/token, responses to
    # the length cap - while reward and validation score improve: warnings, no rollback (not scored)
    "seed_settings": ("borderline", None),
    "kl_blowup": ("borderline", None),
    "nan": (UNHEALTHY, 20),
    "length_explosion": ("borderline", None),
}


def scenario_cases(workdir: Path) -> list[TraceCase]:
    """Run the demo trainer's scenarios (default seed) into ``workdir`` and label them."""
    from guardian.demo.scenarios import SCENARIOS, RunFiles

    cases: list[TraceCase] = []
    for name, (label, onset) in SCENARIO_LABELS.items():
        files = RunFiles(workdir / name)
        done = SCENARIOS[name].run(files.root, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"scenario {name} exited with {done.returncode}; see {files.console}")
        cases.append(TraceCase(f"demo:{name}", files.metrics, label, name, onset, "scenario", files.rollouts))
    return cases


# -- scoring ------------------------------------------------------------------------------------------
class Row(NamedTuple):
    """One replayed run under one rule set: what ``score`` needs."""

    name: str
    label: str
    onset: int | None
    result: ReplayResult


def delay(onset: int | None, first: Finding | None) -> int | None:
    """Steps from the labelled onset to the first critical finding (negative: fired before the onset)."""
    if onset is None or first is None or first.step is None:
        return None
    return first.step - onset


@dataclass
class Summary:
    """How one rule set did over a set of rows."""

    unhealthy: int = 0
    caught: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    long_unhealthy: int = 0
    long_caught: list[str] = field(default_factory=list)
    healthy: int = 0
    false_critical: list[str] = field(default_factory=list)
    # unhealthy traces whose first critical came before the labelled onset (counted as caught)
    early: list[str] = field(default_factory=list)
    delays: dict[str, int] = field(default_factory=dict)
    # borderline/ambiguous traces: name -> "check@step" of the first critical, or None (not scored)
    unscored: dict[str, str | None] = field(default_factory=dict)

    @property
    def detection_rate(self) -> float | None:
        return len(self.caught) / self.unhealthy if self.unhealthy else None

    @property
    def long_detection_rate(self) -> float | None:
        return len(self.long_caught) / self.long_unhealthy if self.long_unhealthy else None

    @property
    def median_delay(self) -> float | None:
        return statistics.median(self.delays.values()) if self.delays else None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["detection_rate"] = self.detection_rate
        out["long_detection_rate"] = self.long_detection_rate
        out["median_delay"] = self.median_delay
        return out


def score(rows: Iterable[Row | tuple[str, str, int | None, ReplayResult]]) -> Summary:
    """Score one rule set's replays. Labels other than healthy/unhealthy are reported, not scored."""
    summary = Summary()
    for name, label, onset, result in rows:
        first = result.first_critical
        long = result.steps >= LONG_TRACE_STEPS
        if label == UNHEALTHY:
            summary.unhealthy += 1
            summary.long_unhealthy += long
            if first is None:
                summary.missed.append(name)
                continue
            summary.caught.append(name)
            if long:
                summary.long_caught.append(name)
            d = delay(onset, first)
            if d is not None:
                summary.delays[name] = d
                if d < 0:
                    summary.early.append(name)
        elif label == HEALTHY:
            summary.healthy += 1
            if first is not None:
                summary.false_critical.append(name)
        else:
            summary.unscored[name] = f"{first.check}@{first.step}" if first is not None else None
    return summary


# -- running ------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    case: TraceCase
    results: dict[str, ReplayResult]

    @property
    def steps(self) -> int:
        return max(r.steps for r in self.results.values())


def rlwatch_replay(case: TraceCase, checks: ChecksConfig) -> ReplayResult:
    """The trace through rlwatch's detectors (see the module docstring), as a ReplayResult: each alert a
    RAISED transition of a finding named ``rlwatch:<detector>``."""
    from rlwatch.config import RLWatchConfig
    from rlwatch.detectors import DetectorSuite

    suite = DetectorSuite(RLWatchConfig())
    history = RunHistory()
    result = ReplayResult(run=case.name)

    def latest(signal: Signal, step: int) -> float | None:
        series = history.signal(signal)
        return series.values[-1] if series.steps and series.steps[-1] == step else None

    for record in read_all(case.path)[0]:
        history.add(record)
        step = record.step
        alerts = suite.check_step(
            step,
            entropy=latest(Signal.ENTROPY, step),
            kl_divergence=latest(Signal.KL, step),
            reward_mean=latest(Signal.REWARD, step),
            loss=latest(Signal.LOSS, step),
            grad_norm=latest(Signal.GRAD_NORM, step),
        )
        for alert in alerts:
            severity = Severity.CRITICAL if alert.severity == "critical" else Severity.WARN
            finding = Finding(f"{PEER}:{alert.detector}", severity, step, alert.message)
            result.transitions.append(Transition(Change.RAISED, finding, Severity.OK))
    result.steps = len(history.steps)
    return result


def peer_available() -> bool:
    try:
        import rlwatch.detectors  # noqa: F401
    except ImportError:
        return False
    return True


def run_cases(
    cases: Sequence[TraceCase], checks: ChecksConfig, rule_sets: Sequence[str] = RULE_SETS
) -> list[CaseResult]:
    out: list[CaseResult] = []
    for case in cases:
        results = {
            rules: rlwatch_replay(case, checks)
            if rules == PEER
            else replay_file(case.path, checks, rules=rules, rollouts=case.rollouts)
            for rules in rule_sets
        }
        for rules, result in results.items():
            if result.bad_lines:
                print(f"warning: {case.name} ({rules}): {len(result.bad_lines)} unreadable line(s)", file=sys.stderr)
        out.append(CaseResult(case, results))
    return out


def rows_for(case_results: Sequence[CaseResult], rules: str) -> list[Row]:
    return [Row(c.case.name, c.case.label, c.case.onset, c.results[rules]) for c in case_results]


# -- output -------------------------------------------------------------------------------------------
def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _rate(caught: int, total: int) -> str:
    return f"{caught}/{total} ({100 * caught / total:.0f}%)" if total else "n/a"


MODE_WIDTH = 30


def render_table(case_results: Sequence[CaseResult], rule_sets: Sequence[str]) -> str:
    head = ["trace", "label", "mode", "onset", "records"]
    per_rules = ["first crit", "check", "delay"]
    body: list[list[str]] = []
    for c in case_results:
        row = [c.case.name, c.case.label, _clip(c.case.mode or "", MODE_WIDTH), _cell(c.case.onset), str(c.steps)]
        for rules in rule_sets:
            first = c.results[rules].first_critical
            row += [
                _cell(first.step if first else None),
                first.check if first else "-",
                _cell(delay(c.case.onset, first)),
            ]
        body.append(row)
    header = head + per_rules * len(rule_sets)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    numeric = {3, 4} | {len(head) + k * 3 + j for k in range(len(rule_sets)) for j in (0, 2)}

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        fixed = "  ".join(parts[: len(head)])
        groups = ["  ".join(parts[len(head) + k * 3 : len(head) + k * 3 + 3]) for k in range(len(rule_sets))]
        return " | ".join([fixed, *groups]).rstrip()

    fixed_width = sum(widths[: len(head)]) + 2 * (len(head) - 1)
    group_widths = [sum(widths[len(head) + k * 3 : len(head) + k * 3 + 3]) + 4 for k in range(len(rule_sets))]
    banner = " | ".join([" " * fixed_width, *(r.ljust(w) for r, w in zip(rule_sets, group_widths, strict=True))])
    rule = "-+-".join(["-" * fixed_width, *("-" * w for w in group_widths)])
    return "\n".join([banner.rstrip(), line(header), rule, *(line(r) for r in body)])


def render_summary(summaries: dict[str, Summary]) -> str:
    names = list(summaries)

    def names_or_none(items: Sequence[str]) -> str:
        return ", ".join(items) if items else "none"

    rows: list[tuple[str, list[str]]] = [
        ("detection, unhealthy", [_rate(len(s.caught), s.unhealthy) for s in summaries.values()]),
        (
            f"detection, long unhealthy (>= {LONG_TRACE_STEPS} steps)",
            [_rate(len(s.long_caught), s.long_unhealthy) for s in summaries.values()],
        ),
        ("missed", [names_or_none(s.missed) for s in summaries.values()]),
        ("critical before labelled onset", [names_or_none(s.early) for s in summaries.values()]),
        (
            "false critical, healthy",
            [f"{len(s.false_critical)}/{s.healthy}" for s in summaries.values()],
        ),
        ("  on", [names_or_none(s.false_critical) for s in summaries.values()]),
        (
            "median delay (steps)",
            [_number(s.median_delay) + f"  (n={len(s.delays)})" for s in summaries.values()],
        ),
    ]
    unscored = sorted({n for s in summaries.values() for n in s.unscored})
    for name in unscored:
        rows.append((f"borderline/ambiguous: {name}", [_cell(s.unscored.get(name)) for s in summaries.values()]))
    label_w = max(len(label) for label, _ in rows)
    col_w = [max(len(n), *(len(values[i]) for _, values in rows)) for i, n in enumerate(names)]
    out = [
        "  ".join([" " * label_w, *(n.ljust(w) for n, w in zip(names, col_w, strict=True))]).rstrip(),
        "  ".join(["-" * label_w, *("-" * w for w in col_w)]),
    ]
    for label, values in rows:
        out.append(
            "  ".join([label.ljust(label_w), *(v.ljust(w) for v, w in zip(values, col_w, strict=True))]).rstrip()
        )
    return "\n".join(out)


def to_json(traces: Path, case_results: Sequence[CaseResult], summaries: dict[str, Summary]) -> dict[str, object]:
    rows: list[dict[str, object]] = []
    for c in case_results:
        per_rules: dict[str, object] = {}
        for rules, result in c.results.items():
            first = result.first_critical
            per_rules[rules] = {
                "first_critical_step": first.step if first else None,
                "first_critical_check": first.check if first else None,
                "estimated_onset_step": first.onset_step if first else None,
                "delay": delay(c.case.onset, first),
                "raised": [f.to_json() for f in result.raised],
                "bad_lines": len(result.bad_lines),
            }
        rows.append(
            {
                "trace": c.case.name,
                "label": c.case.label,
                "mode": c.case.mode,
                "labelled_by": c.case.labelled_by,
                "onset_step": c.case.onset,
                "steps": c.steps,
                "rules": per_rules,
            }
        )
    return {
        "traces_dir": str(traces),
        "long_trace_steps": LONG_TRACE_STEPS,
        "traces": rows,
        "summary": {rules: s.to_json() for rules, s in summaries.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help=f"traces folder (default {DEFAULT_TRACES})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--no-scenarios", action="store_true", help="skip the demo trainer's scenarios (about 20 s to run)"
    )
    args = parser.parse_args(argv)
    traces: Path = args.traces
    if not (traces / "labels.json").is_file():
        parser.error(f"no labels.json in {traces}")
    checks = GuardianConfig().checks
    cases = [*load_cases(traces), *guarded_cases()]
    rule_sets = (*RULE_SETS, PEER) if peer_available() else RULE_SETS
    with tempfile.TemporaryDirectory(prefix="guardian-detection-") as workdir:
        if not args.no_scenarios:
            cases += scenario_cases(Path(workdir))
        case_results = run_cases(cases, checks, rule_sets)
    summaries = {rules: score(rows_for(case_results, rules)) for rules in rule_sets}
    if args.json:
        print(json.dumps(to_json(traces, case_results, summaries), indent=1))
        return 0
    print(f"traces: {traces} and the demo trainer's scenarios ({len(case_results)} labelled)")
    if PEER not in rule_sets:
        print(f"({PEER} is not installed: pip install rlwatch==0.5.1 for the peer's column)")
    print()
    print(render_table(case_results, rule_sets))
    print()
    print(render_summary(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
