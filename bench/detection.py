"""Detection benchmark: replay every labelled trace with each rule set and score what fired.

    python bench/detection.py [--traces DIR ...] [--no-scenarios] [--json]

For each trace in each folder's ``labels.json`` (default: ``tests/fixtures/traces`` and, when it exists,
``tests/fixtures/verl-twins``; ``--traces DIR``, repeatable, replaces them) the metrics file is replayed step
by step (``guardian.incidents.replay``), once with the calibrated ``default`` rules and once with the
tutorial's naive ``seed`` rules, and fed to two peers: rlwatch 0.5.1 and rldoctor 0.2.0 (both in the ``dev`` extra;
a peer's column is left out, with a note, when it is not installed).

Scoring (``score``): an unhealthy run is *caught* when its first CRITICAL finding comes within
``EARLY_TOLERANCE_STEPS`` before to ``LATE_TOLERANCE_STEPS`` after the labelled onset (-10 <= delay <= 10);
a first critical more than 10 steps before the onset is a *false alarm* (a rollback of a run that was still
fine), not a catch; one more than 10 steps after it is *late*; none at all is *missed*. The plain rate of
any critical at all is kept beside it. An unhealthy run without a labelled onset is caught by any critical.
A healthy run with any critical is a *false critical*. Borderline/ambiguous runs are reported, not scored.

Every case carries its ``group``: the codebase or author it came from (labels.json ``group``). The bench
prints the figures per group and for the worst group, and a leave-one-group-out table: each group's figures
beside those of all the other groups, with whether the group was looked at when the rules were written
(``TUNED_ON``), and the held-out groups' figures beside the in-sample ones.

rlwatch, fairly: its own ``DetectorSuite`` with its default configuration, one ``check_step`` per step,
fed from the guardian's reading of the run (``RunHistory``: every verl alias resolved, NaN kept as NaN) -
``entropy`` = actor/entropy (or entropy_loss), ``kl_divergence`` = actor/kl_loss (or reward_kl_penalty,
critic/kl), ``reward_mean`` = critic/score/mean, ``loss`` = actor/pg_loss, ``grad_norm`` =
actor/grad_norm; ``reward_std`` and ``advantage_std`` stay None (verl logs neither). Its own verl
integration maps ``actor/kl_divergence``, ``rewards/mean`` and ``training/grad_norm``, which verl does not
log, so fed that way it would see entropy only. A "critical" alert of any rlwatch detector counts.

rldoctor, fairly: it reads verl's JSONL itself (``{"step", "data"}`` unwrapped, its own key aliases, TRL's
included) but diagnoses a whole run after the fact, so it is replayed prefix by prefix: the file's records
up to step k, parsed as its ``load_jsonl`` parses them, go through ``run_from_records`` and ``diagnose`` with
its defaults, for k = each logged step in order, until a finding is CRITICAL; that k is its first critical.

Loading is kept apart from scoring: ``score(rows)`` takes ``(name, label, onset, result)`` rows (a ``Row``
may also carry its group), so other sources of labelled runs (the demo trainer's scenarios) can be scored by
replaying them with ``guardian.incidents.replay.replay_records`` and passing the rows in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from guardian.checks import build_checks
from guardian.config import ChecksConfig, GuardianConfig
from guardian.core import Finding, Severity
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import ReplayResult, replay_file
from guardian.incidents.tracker import Change, Transition
from guardian.keys import Signal
from guardian.sources.jsonl import read_all

RULE_SETS: tuple[str, ...] = ("default", "seed")
PEER = "rlwatch"
RLDOCTOR = "rldoctor"
PEERS: tuple[str, ...] = (PEER, RLDOCTOR)
PEER_PINS: dict[str, str] = {PEER: "rlwatch==0.5.1", RLDOCTOR: "rldoctor==0.2.0"}
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
DEFAULT_TRACES = FIXTURES / "traces"
# Real verl runs made for the benchmark, guarded and unguarded twins (another fixture folder, same labels.json
# shape); part of the default set once it exists.
VERL_TWINS = FIXTURES / "verl-twins"
DEFAULT_TRACE_DIRS: tuple[Path, ...] = (DEFAULT_TRACES, VERL_TWINS)
# Traces shorter than this are spot checks (4-6 rows in the calibration set): too sparse for windowed checks.
LONG_TRACE_STEPS = 20
# The catch window around a labelled onset: a first critical more than EARLY_TOLERANCE_STEPS before it is a
# false alarm, one more than LATE_TOLERANCE_STEPS after it is late.
EARLY_TOLERANCE_STEPS = 10
LATE_TOLERANCE_STEPS = 10
UNHEALTHY = "unhealthy"
HEALTHY = "healthy"
UNSCORED_LABELS = ("borderline", "ambiguous")

# -- groups and what the rules were tuned on ----------------------------------------------------------
AOPD = "jianghoucheng/Agent_On_Policy_Distillation"
# The 16 public traces of the calibration set (tests/fixtures/traces, the first 16 entries of labels.json).
CALIBRATION_GROUPS: tuple[str, ...] = (
    AOPD,
    "Bihan/dstack-configs",
    "volcengine/verl",
    "Westwood-Lin/TinyZero-Reproduction",
    "Limpidjunewind/tinyzero-experiments",
    "(markdown note, repository not disclosed)",
    "(AReaL research log, repository not disclosed)",
    "(miles notes, repository not disclosed)",
    "(markdown report, repository not disclosed)",
    "zhiyuanhubj/logic-rl-formula",
)
GUARDED_GROUP = "verl 0.9.1 guarded runs (ours)"
SCENARIO_GROUP = "demo trainer scenarios (ours)"
TRL_SWEEP_GROUP = "Sunshine535/nips-grpo-dynamics"
# Which groups' runs were looked at when each rule was written, from the history of guardian/checks and
# guardian/config.py. d01ffda wrote every default rule against the 16 calibration traces; 3dfbe53 (kl_drift)
# names aopd-1, d01ffda (grad_spike) verlnb-1; cfcf057 rewrote the entropy, reward, KL, length and EGR judgment
# against the two real guarded verl 0.9.1 runs and the demo scenarios; 6b79aed tuned kl_drift on the demo's
# kl_blowup. The decision policy (e8f91b3 and the commits after it, guardian/checks/policy.py) was written
# while replaying every one of those and the Sunshine535 TRL sweep (its sharp-fall reading, the truncation
# share of a failure shape, TRL's key names, the explosion's hysteresis, the outcome's hysteresis): every
# default rule counts as tuned on all of them. Not looked at while writing any rule: the three other
# codebases added on 2026-12-02 (borderline runs only) and the real verl twins made by us (tests/fixtures/
# verl-twins), replayed only after the policy was fixed - the held-out evidence. The seed rules are the
# tutorial's, reproduced as written (guardian/checks/seed.py): tuned on nothing here.
_DEFAULT_TUNING: list[str] = [*CALIBRATION_GROUPS, GUARDED_GROUP, SCENARIO_GROUP, TRL_SWEEP_GROUP]
TUNED_ON: dict[str, list[str]] = {
    "non_finite": _DEFAULT_TUNING,
    "entropy_collapse": _DEFAULT_TUNING,
    "entropy_explosion": _DEFAULT_TUNING,
    "egr_collapse": _DEFAULT_TUNING,
    "kl_drift": _DEFAULT_TUNING,
    "logprob_decline": _DEFAULT_TUNING,
    "reward_collapse": _DEFAULT_TUNING,
    "length_collapse": _DEFAULT_TUNING,
    "length_explosion": _DEFAULT_TUNING,
    "truncation": _DEFAULT_TUNING,
    "grad_spike": _DEFAULT_TUNING,
    "stall": _DEFAULT_TUNING,
    "seed_entropy_collapse": [],
    "seed_adv_collapse": [],
    "seed_kl_drift": [],
    "seed_lld_risk": [],
}


def tuning_set(rules: str, checks: ChecksConfig | None = None) -> set[str]:
    """The groups any rule of ``rules`` was tuned on (a peer's: none of ours)."""
    if rules in PEERS:
        return set()
    names = [c.name for c in build_checks(checks or ChecksConfig(), rules)]
    return {group for name in names for group in TUNED_ON.get(name, [])}


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
    group: str = ""  # the codebase or author the run came from


def group_of(entry: Mapping[str, object], traces: Path) -> str:
    """The entry's ``group``; without one, the aopd-* traces are one group and any other trace is its folder's."""
    group = entry.get("group")
    if isinstance(group, str) and group:
        return group
    if str(entry["file"]).startswith("aopd-"):
        return AOPD
    return traces.name


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
                group=group_of(entry, traces),
            )
        )
    return cases


def default_trace_dirs() -> list[Path]:
    """The default folders that exist (the verl twins only once they are there)."""
    return [d for d in DEFAULT_TRACE_DIRS if (d / "labels.json").is_file()]


def load_folders(folders: Sequence[Path]) -> list[TraceCase]:
    """The cases of several folders, in order; a name seen before gets its folder's name as a prefix."""
    cases: list[TraceCase] = []
    seen: set[str] = set()
    for folder in folders:
        for case in load_cases(folder):
            if case.name in seen:
                case = TraceCase(
                    f"{folder.name}:{case.name}",
                    case.path,
                    case.label,
                    case.mode,
                    case.onset,
                    case.labelled_by,
                    case.rollouts,
                    case.group,
                )
            seen.add(case.name)
            cases.append(case)
    return cases


# The two real verl 0.9.1 runs collapsed on purpose and guarded end to end (fixtures
# verl-0.9.1-run/guarded/README.md): the reward went flat while entropy fell 20-30 % a step. Their first
# attempt's metrics, replayed without dumps (attempt 2 overwrote the dumps of later steps).
GUARDED = FIXTURES / "verl-0.9.1-run" / "guarded"
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
            group=GUARDED_GROUP,
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
        cases.append(
            TraceCase(f"demo:{name}", files.metrics, label, name, onset, "scenario", files.rollouts, SCENARIO_GROUP)
        )
    return cases


# -- scoring ------------------------------------------------------------------------------------------
class Row(NamedTuple):
    """One replayed run under one rule set: what ``score`` needs (the group only for the per-group figures)."""

    name: str
    label: str
    onset: int | None
    result: ReplayResult
    group: str = ""


def delay(onset: int | None, first: Finding | None) -> int | None:
    """Steps from the labelled onset to the first critical finding (negative: fired before the onset)."""
    if onset is None or first is None or first.step is None:
        return None
    return first.step - onset


# What became of one run under one rule set.
CAUGHT = "caught"  # unhealthy, first critical within the window (or any, without an onset)
LATE = "late"  # unhealthy, first critical more than LATE_TOLERANCE_STEPS after the onset
EARLY_ALARM = "early"  # unhealthy, first critical more than EARLY_TOLERANCE_STEPS before the onset: a false alarm
MISSED = "missed"  # unhealthy, no critical at all
FALSE_CRITICAL = "false"  # healthy, any critical
QUIET = "quiet"  # healthy, no critical
UNSCORED = "unscored"  # borderline / ambiguous


def verdict(label: str, onset: int | None, first: Finding | None) -> str:
    if label == UNHEALTHY:
        if first is None:
            return MISSED
        d = delay(onset, first)
        if d is None:
            return CAUGHT
        if d < -EARLY_TOLERANCE_STEPS:
            return EARLY_ALARM
        if d > LATE_TOLERANCE_STEPS:
            return LATE
        return CAUGHT
    if label == HEALTHY:
        return QUIET if first is None else FALSE_CRITICAL
    return UNSCORED


@dataclass
class Summary:
    """How one rule set did over a set of rows."""

    unhealthy: int = 0
    # caught within the window: -EARLY_TOLERANCE_STEPS <= delay <= LATE_TOLERANCE_STEPS (any critical without onset)
    caught: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    # first critical more than EARLY_TOLERANCE_STEPS before the onset: a false alarm, not a catch
    early_alarm: list[str] = field(default_factory=list)
    # no critical at all
    missed: list[str] = field(default_factory=list)
    # any critical at all, whenever (the plain rate)
    any_critical: list[str] = field(default_factory=list)
    long_unhealthy: int = 0
    long_caught: list[str] = field(default_factory=list)
    healthy: int = 0
    false_critical: list[str] = field(default_factory=list)
    # caught, but before the labelled onset (within the tolerance)
    early: list[str] = field(default_factory=list)
    delays: dict[str, int] = field(default_factory=dict)
    # name -> "check@step" of the first critical of every scored run that had one
    first: dict[str, str] = field(default_factory=dict)
    # borderline/ambiguous traces: name -> "check@step" of the first critical, or None (not scored)
    unscored: dict[str, str | None] = field(default_factory=dict)

    @property
    def not_caught(self) -> int:
        """Unhealthy runs not caught within the window (late, early alarm or missed)."""
        return self.unhealthy - len(self.caught)

    @property
    def false_alarms(self) -> int:
        """Criticals a person would call wrong: on healthy runs, and far before an unhealthy run's onset."""
        return len(self.false_critical) + len(self.early_alarm)

    @property
    def detection_rate(self) -> float | None:
        return len(self.caught) / self.unhealthy if self.unhealthy else None

    @property
    def any_detection_rate(self) -> float | None:
        return len(self.any_critical) / self.unhealthy if self.unhealthy else None

    @property
    def long_detection_rate(self) -> float | None:
        return len(self.long_caught) / self.long_unhealthy if self.long_unhealthy else None

    @property
    def median_delay(self) -> float | None:
        return statistics.median(self.delays.values()) if self.delays else None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["not_caught"] = self.not_caught
        out["false_alarms"] = self.false_alarms
        out["detection_rate"] = self.detection_rate
        out["any_detection_rate"] = self.any_detection_rate
        out["long_detection_rate"] = self.long_detection_rate
        out["median_delay"] = self.median_delay
        return out


def _where(first: Finding) -> str:
    return f"{first.check}@{first.step}"


def score(rows: Iterable[Row | tuple[str, str, int | None, ReplayResult]]) -> Summary:
    """Score one rule set's replays. Labels other than healthy/unhealthy are reported, not scored."""
    summary = Summary()
    for row in rows:
        name, label, onset, result = row[:4]
        first = result.first_critical
        long = result.steps >= LONG_TRACE_STEPS
        outcome = verdict(label, onset, first)
        if outcome == UNSCORED:
            summary.unscored[name] = _where(first) if first is not None else None
            continue
        if first is not None:
            summary.first[name] = _where(first)
        if label == HEALTHY:
            summary.healthy += 1
            if outcome == FALSE_CRITICAL:
                summary.false_critical.append(name)
            continue
        summary.unhealthy += 1
        summary.long_unhealthy += long
        if first is not None:
            summary.any_critical.append(name)
        d = delay(onset, first)
        if d is not None:
            summary.delays[name] = d
        if outcome == CAUGHT:
            summary.caught.append(name)
            if long:
                summary.long_caught.append(name)
            if d is not None and d < 0:
                summary.early.append(name)
        elif outcome == LATE:
            summary.late.append(name)
        elif outcome == EARLY_ALARM:
            summary.early_alarm.append(name)
        else:
            summary.missed.append(name)
    return summary


def score_groups(rows: Iterable[Row]) -> dict[str, Summary]:
    """``score`` per group, in the order the groups first appear."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row.group, []).append(row)
    return {group: score(members) for group, members in grouped.items()}


def worst_group(groups: Mapping[str, Summary]) -> str | None:
    """The group with the most false criticals on healthy runs, then the most unhealthy runs not caught."""
    if not groups:
        return None
    return max(groups, key=lambda g: (len(groups[g].false_critical), groups[g].not_caught))


@dataclass
class HeldOut:
    """One rule set's figures on the groups it was tuned on (in-sample) against the others (held out)."""

    in_sample: list[str]
    held_out: list[str]
    in_sample_summary: Summary
    held_out_summary: Summary
    # mean per in-sample group (over the groups with healthy, resp. unhealthy, runs)
    in_sample_false_per_group: float | None
    in_sample_not_caught_per_group: float | None
    # held-out group -> whether its false criticals and its runs not caught are each within one run of the mean
    within_one_run: dict[str, bool]

    def to_json(self) -> dict[str, object]:
        return {
            "in_sample_groups": self.in_sample,
            "held_out_groups": self.held_out,
            "in_sample": self.in_sample_summary.to_json(),
            "held_out": self.held_out_summary.to_json(),
            "in_sample_false_per_group": self.in_sample_false_per_group,
            "in_sample_not_caught_per_group": self.in_sample_not_caught_per_group,
            "held_out_within_one_run_per_group": self.within_one_run,
        }


def _mean(values: Sequence[int]) -> float | None:
    return statistics.fmean(values) if values else None


def held_out_figures(rows: Sequence[Row], tuned: set[str]) -> HeldOut:
    groups = score_groups(rows)
    in_sample = [g for g in groups if g in tuned]
    held_out = [g for g in groups if g not in tuned]
    false_mean = _mean([len(groups[g].false_critical) for g in in_sample if groups[g].healthy])
    missed_mean = _mean([groups[g].not_caught for g in in_sample if groups[g].unhealthy])
    within: dict[str, bool] = {}
    for g in held_out:
        s = groups[g]
        if not (s.healthy or s.unhealthy) or false_mean is None or missed_mean is None:
            continue
        within[g] = len(s.false_critical) <= false_mean + 1 and s.not_caught <= missed_mean + 1
    return HeldOut(
        in_sample,
        held_out,
        score(r for r in rows if r.group in tuned),
        score(r for r in rows if r.group not in tuned),
        false_mean,
        missed_mean,
        within,
    )


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


def _rldoctor_records(path: Path) -> tuple[list[dict[str, object]], dict[str, object] | None]:
    """The file's records as rldoctor's ``load_jsonl`` reads them (a leading ``{"config": ...}`` line apart);
    a line that is not JSON is skipped (its loader would refuse the whole file)."""
    records: list[dict[str, object]] = []
    config: dict[str, object] | None = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if set(obj) == {"config"} and isinstance(obj["config"], dict):
            config = obj["config"]
            continue
        records.append(obj)
    return records, config


def _step_of(record: Mapping[str, object]) -> int | None:
    step = record.get("step")
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None


def rldoctor_replay(case: TraceCase) -> ReplayResult:
    """The trace through rldoctor's ``diagnose``, prefix by prefix (see the module docstring), as a
    ReplayResult: the CRITICAL findings of the first prefix that has any, each a RAISED transition of a
    finding named ``rldoctor:<detector>`` at that prefix's last step. Stops there."""
    from rl_doctor import diagnose, run_from_records
    from rl_doctor.detectors.base import Severity as DoctorSeverity

    records, config = _rldoctor_records(case.path)
    result = ReplayResult(run=case.name)
    # a prefix ends where the next record has another step (a step's lines are judged together)
    ends = [
        i + 1
        for i in range(len(records))
        if i + 1 == len(records) or records[i + 1].get("step") != records[i].get("step")
    ]
    result.steps = len(ends)
    for end in ends:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's all-NaN slice warnings on short prefixes
            diagnosis = diagnose(run_from_records(records[:end], config=config, name=case.name))
        critical = [f for f in diagnosis.findings if f.severity >= DoctorSeverity.CRITICAL]
        if critical:
            step = _step_of(records[end - 1])
            for found in critical:
                finding = Finding(f"{RLDOCTOR}:{found.detector}", Severity.CRITICAL, step, found.summary)
                result.transitions.append(Transition(Change.RAISED, finding, Severity.OK))
            break
    return result


def peer_available(peer: str = PEER) -> bool:
    module = {PEER: "rlwatch.detectors", RLDOCTOR: "rl_doctor.diagnosis"}[peer]
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def replay_case(case: TraceCase, checks: ChecksConfig, rules: str) -> ReplayResult:
    if rules == PEER:
        return rlwatch_replay(case, checks)
    if rules == RLDOCTOR:
        return rldoctor_replay(case)
    return replay_file(case.path, checks, rules=rules, rollouts=case.rollouts)


def run_cases(
    cases: Sequence[TraceCase], checks: ChecksConfig, rule_sets: Sequence[str] = RULE_SETS
) -> list[CaseResult]:
    out: list[CaseResult] = []
    for case in cases:
        results = {rules: replay_case(case, checks, rules) for rules in rule_sets}
        for rules, result in results.items():
            if result.bad_lines:
                print(f"warning: {case.name} ({rules}): {len(result.bad_lines)} unreadable line(s)", file=sys.stderr)
        out.append(CaseResult(case, results))
    return out


def rows_for(case_results: Sequence[CaseResult], rules: str) -> list[Row]:
    return [Row(c.case.name, c.case.label, c.case.onset, c.results[rules], c.case.group) for c in case_results]


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


def _columns(rows: Sequence[Sequence[str]], numeric: Iterable[int] = ()) -> list[str]:
    """Rows of cells as aligned lines (``numeric`` columns right-aligned)."""
    numeric = set(numeric)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


MODE_WIDTH = 30
# the per-trace table's verdict cell: silence where nothing is wrong
VERDICT_CELL = {CAUGHT: "ok", LATE: "LATE", EARLY_ALARM: "EARLY", MISSED: "MISSED", FALSE_CRITICAL: "FALSE"}


def render_table(case_results: Sequence[CaseResult], rule_sets: Sequence[str]) -> str:
    head = ["trace", "label", "mode", "onset", "records"]
    per_rules = ["first crit", "check", "delay", "verdict"]
    n = len(per_rules)
    body: list[list[str]] = []
    for c in case_results:
        row = [c.case.name, c.case.label, _clip(c.case.mode or "", MODE_WIDTH), _cell(c.case.onset), str(c.steps)]
        for rules in rule_sets:
            first = c.results[rules].first_critical
            row += [
                _cell(first.step if first else None),
                first.check if first else "-",
                _cell(delay(c.case.onset, first)),
                VERDICT_CELL.get(verdict(c.case.label, c.case.onset, first), ""),
            ]
        body.append(row)
    header = head + per_rules * len(rule_sets)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    numeric = {3, 4} | {len(head) + k * n + j for k in range(len(rule_sets)) for j in (0, 2)}

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        fixed = "  ".join(parts[: len(head)])
        groups = ["  ".join(parts[len(head) + k * n : len(head) + k * n + n]) for k in range(len(rule_sets))]
        return " | ".join([fixed, *groups]).rstrip()

    fixed_width = sum(widths[: len(head)]) + 2 * (len(head) - 1)
    group_widths = [sum(widths[len(head) + k * n : len(head) + k * n + n]) + 2 * (n - 1) for k in range(len(rule_sets))]
    banner = " | ".join([" " * fixed_width, *(r.ljust(w) for r, w in zip(rule_sets, group_widths, strict=True))])
    rule = "-+-".join(["-" * fixed_width, *("-" * w for w in group_widths)])
    return "\n".join([banner.rstrip(), line(header), rule, *(line(r) for r in body)])


def render_summary(summaries: dict[str, Summary]) -> str:
    names = list(summaries)
    window = f"-{EARLY_TOLERANCE_STEPS} <= delay <= {LATE_TOLERANCE_STEPS}"
    rows: list[tuple[str, list[str]]] = [
        (f"caught within the window ({window})", [_rate(len(s.caught), s.unhealthy) for s in summaries.values()]),
        ("any critical at all, unhealthy", [_rate(len(s.any_critical), s.unhealthy) for s in summaries.values()]),
        (
            f"caught in window, long unhealthy (>= {LONG_TRACE_STEPS} steps)",
            [_rate(len(s.long_caught), s.long_unhealthy) for s in summaries.values()],
        ),
        (f"late (> {LATE_TOLERANCE_STEPS} steps after onset)", [str(len(s.late)) for s in summaries.values()]),
        (
            f"false alarm: > {EARLY_TOLERANCE_STEPS} steps before onset",
            [str(len(s.early_alarm)) for s in summaries.values()],
        ),
        ("missed (no critical)", [str(len(s.missed)) for s in summaries.values()]),
        ("false critical, healthy", [f"{len(s.false_critical)}/{s.healthy}" for s in summaries.values()]),
        (
            "median delay, any critical (steps)",
            [_number(s.median_delay) + f"  (n={len(s.delays)})" for s in summaries.values()],
        ),
    ]
    unscored = sorted({n for s in summaries.values() for n in s.unscored})
    fired = [n for n in unscored if any(s.unscored.get(n) for s in summaries.values())]
    rows.append(
        (
            "borderline/ambiguous with a critical (not scored)",
            [f"{sum(1 for n in unscored if s.unscored.get(n))}/{len(s.unscored)}" for s in summaries.values()],
        )
    )
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
    if fired:
        out.append("")
        table = [["borderline/ambiguous", *names]] + [
            [n, *(_cell(s.unscored.get(n)) for s in summaries.values())] for n in fired
        ]
        out += _columns(table)
    return "\n".join(out)


def render_details(rules: str, summary: Summary, onsets: Mapping[str, int | None]) -> str:
    """What one rule set got wrong, one run a line: check@step of the first critical, and the onset."""
    lines = [f"{rules}:"]

    def block(title: str, names: Sequence[str], with_onset: bool) -> None:
        if not names:
            lines.append(f"  {title}: none")
            return
        lines.append(f"  {title} ({len(names)}):")
        for name in names:
            onset = f"onset {_cell(onsets.get(name))}, " if with_onset else ""
            lines.append(f"    {name}: {onset}first critical {summary.first.get(name, '-')}")

    block("false critical on healthy", summary.false_critical, False)
    block(f"false alarm, > {EARLY_TOLERANCE_STEPS} steps before onset", summary.early_alarm, True)
    block(f"late, > {LATE_TOLERANCE_STEPS} steps after onset", summary.late, True)
    block("missed", summary.missed, True)
    return "\n".join(lines)


def _group_cells(s: Summary) -> list[str]:
    return [
        str(s.healthy),
        str(len(s.false_critical)),
        str(s.unhealthy),
        str(len(s.caught)),
        str(len(s.late)),
        str(len(s.early_alarm)),
        str(len(s.missed)),
        str(len(s.any_critical)),
        str(len(s.unscored)),
    ]


GROUP_HEAD = ["healthy", "false crit", "unhealthy", "caught", "late", "early alarm", "missed", "any crit", "unscored"]


def render_groups(per_group: dict[str, dict[str, Summary]], tuned: dict[str, set[str]]) -> str:
    """One line per group per rule set, then each rule set's worst group."""
    groups = list(next(iter(per_group.values()))) if per_group else []
    table = [["group", "rules", "tuned on", *GROUP_HEAD]]
    for group in groups:
        for rules, summaries in per_group.items():
            table.append([group, rules, "yes" if group in tuned[rules] else "no", *_group_cells(summaries[group])])
    numeric = set(range(3, 3 + len(GROUP_HEAD)))
    out = _columns(table, numeric)
    out.insert(1, "-" * len(out[0]))
    out.append("")
    worst = [["worst group", "rules", "tuned on", *GROUP_HEAD]]
    for rules, summaries in per_group.items():
        name = worst_group(summaries)
        if name is not None:
            worst.append([name, rules, "yes" if name in tuned[rules] else "no", *_group_cells(summaries[name])])
    out += _columns(worst, numeric)
    return "\n".join(out)


def _figures(s: Summary) -> str:
    return f"false {len(s.false_critical)}/{s.healthy}, caught {len(s.caught)}/{s.unhealthy}"


def render_logo(
    per_group: dict[str, dict[str, Summary]], others: dict[str, dict[str, Summary]], tuned: dict[str, set[str]]
) -> str:
    """Leave one group out: each group's figures beside those over all the other groups, one line per group per
    rule set, with whether the group was in the rule set's tuning set (no: its figures are held out)."""
    table = [["group", "rules", "tuned on", "this group", "all other groups"]]
    groups = list(next(iter(per_group.values()))) if per_group else []
    for group in groups:
        for rules in per_group:
            table.append(
                [
                    group,
                    rules,
                    "yes" if group in tuned[rules] else "no",
                    _figures(per_group[rules][group]),
                    _figures(others[rules][group]),
                ]
            )
    out = _columns(table)
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def render_held_out(held: dict[str, HeldOut]) -> str:
    """Held-out groups beside in-sample ones, per rule set, and the target: no worse by more than one run a group."""
    out: list[str] = []
    table = [
        [
            "rules",
            "groups in / out",
            "in-sample false crit",
            "held-out false crit",
            "in-sample caught",
            "held-out caught",
        ]
    ]
    for rules, h in held.items():
        i, o = h.in_sample_summary, h.held_out_summary
        table.append(
            [
                rules,
                f"{len(h.in_sample)} / {len(h.held_out)}",
                f"{len(i.false_critical)}/{i.healthy}",
                f"{len(o.false_critical)}/{o.healthy}",
                f"{len(i.caught)}/{i.unhealthy}",
                f"{len(o.caught)}/{o.unhealthy}",
            ]
        )
    out += _columns(table)
    out.append("")
    for rules, h in held.items():
        if not h.in_sample:
            out.append(f"{rules}: tuned on none of these groups: every figure is held out")
            continue
        means = (
            f"in-sample per group: {_number(h.in_sample_false_per_group)} false criticals, "
            f"{_number(h.in_sample_not_caught_per_group)} unhealthy not caught"
        )
        if not h.within_one_run:
            out.append(f"{rules}: {means}; no held-out group with scored runs")
            continue
        verdicts = [
            f"{g}: {'within one run' if ok else 'WORSE by more than one run'}" for g, ok in h.within_one_run.items()
        ]
        met = "met" if all(h.within_one_run.values()) else "NOT met"
        out.append(f"{rules}: {means}; held-out groups no worse by more than one run: {met} ({'; '.join(verdicts)})")
    return "\n".join(out)


def group_figures(
    case_results: Sequence[CaseResult], rule_sets: Sequence[str], checks: ChecksConfig
) -> tuple[dict[str, dict[str, Summary]], dict[str, dict[str, Summary]], dict[str, set[str]], dict[str, HeldOut]]:
    """Per rule set: each group's summary, the summary over all the other groups, the tuning set, held-out figures."""
    per_group: dict[str, dict[str, Summary]] = {}
    others: dict[str, dict[str, Summary]] = {}
    tuned: dict[str, set[str]] = {}
    held: dict[str, HeldOut] = {}
    for rules in rule_sets:
        rows = rows_for(case_results, rules)
        per_group[rules] = score_groups(rows)
        others[rules] = {g: score(r for r in rows if r.group != g) for g in per_group[rules]}
        tuned[rules] = tuning_set(rules, checks)
        held[rules] = held_out_figures(rows, tuned[rules])
    return per_group, others, tuned, held


def to_json(
    traces: Path | Sequence[Path],
    case_results: Sequence[CaseResult],
    summaries: dict[str, Summary],
    checks: ChecksConfig | None = None,
) -> dict[str, object]:
    folders = [traces] if isinstance(traces, Path) else list(traces)
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
                "verdict": verdict(c.case.label, c.case.onset, first),
                "raised": [f.to_json() for f in result.raised],
                "bad_lines": len(result.bad_lines),
            }
        rows.append(
            {
                "trace": c.case.name,
                "group": c.case.group,
                "label": c.case.label,
                "mode": c.case.mode,
                "labelled_by": c.case.labelled_by,
                "onset_step": c.case.onset,
                "steps": c.steps,
                "rules": per_rules,
            }
        )
    per_group, others, tuned, held = group_figures(case_results, list(summaries), checks or ChecksConfig())
    return {
        "traces_dir": str(folders[0]) if len(folders) == 1 else None,
        "traces_dirs": [str(f) for f in folders],
        "long_trace_steps": LONG_TRACE_STEPS,
        "early_tolerance_steps": EARLY_TOLERANCE_STEPS,
        "late_tolerance_steps": LATE_TOLERANCE_STEPS,
        "traces": rows,
        "summary": {rules: s.to_json() for rules, s in summaries.items()},
        "groups": {rules: {g: s.to_json() for g, s in groups.items()} for rules, groups in per_group.items()},
        "worst_group": {rules: worst_group(groups) for rules, groups in per_group.items()},
        "leave_one_group_out": {
            rules: {
                g: {"tuned_on": g in tuned[rules], "group": s.to_json(), "all_other_groups": others[rules][g].to_json()}
                for g, s in groups.items()
            }
            for rules, groups in per_group.items()
        },
        "held_out_vs_in_sample": {rules: h.to_json() for rules, h in held.items()},
        "tuned_on": TUNED_ON,
    }


def _shown(folder: Path) -> str:
    """A folder relative to the repository when it is inside it."""
    try:
        return str(folder.resolve().relative_to(FIXTURES.parents[1]))
    except ValueError:
        return str(folder)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--traces",
        type=Path,
        action="append",
        help=f"a folder with labels.json; repeatable (default: {', '.join(str(d) for d in DEFAULT_TRACE_DIRS)}, "
        "those that exist)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--no-scenarios", action="store_true", help="skip the demo trainer's scenarios (about 20 s to run)"
    )
    args = parser.parse_args(argv)
    folders: list[Path] = args.traces or default_trace_dirs()
    for folder in folders:
        if not (folder / "labels.json").is_file():
            parser.error(f"no labels.json in {folder}")
    checks = GuardianConfig().checks
    cases = [*load_folders(folders), *guarded_cases()]
    missing = [p for p in PEERS if not peer_available(p)]
    rule_sets = (*RULE_SETS, *(p for p in PEERS if p not in missing))
    with tempfile.TemporaryDirectory(prefix="guardian-detection-") as workdir:
        if not args.no_scenarios:
            cases += scenario_cases(Path(workdir))
        case_results = run_cases(cases, checks, rule_sets)
    summaries = {rules: score(rows_for(case_results, rules)) for rules in rule_sets}
    if args.json:
        out = to_json(folders, case_results, summaries, checks)
        out["peers_not_installed"] = missing
        print(json.dumps(out, indent=1))
        return 0
    where = ", ".join(_shown(f) for f in folders)
    scenarios = "" if args.no_scenarios else " and the demo trainer's scenarios"
    print(f"traces: {where}, the guarded verl runs{scenarios} ({len(case_results)} labelled)")
    for peer in missing:
        print(f"({peer} is not installed: pip install {PEER_PINS[peer]} for the peer's column)")
    print()
    print(render_table(case_results, rule_sets))
    print()
    print(render_summary(summaries))
    print()
    onsets = {c.case.name: c.case.onset for c in case_results}
    print("\n".join(render_details(rules, s, onsets) for rules, s in summaries.items()))
    per_group, others, tuned, held = group_figures(case_results, rule_sets, checks)
    print()
    print("per group (tuned on: the group's runs were looked at when the rules were written; TUNED_ON):")
    print(render_groups(per_group, tuned))
    print()
    print("leave one group out (false: false criticals / healthy runs; caught: within the window / unhealthy runs):")
    print(render_logo(per_group, others, tuned))
    print()
    print("held-out groups beside in-sample ones:")
    print(render_held_out(held))
    return 0


if __name__ == "__main__":
    sys.exit(main())
