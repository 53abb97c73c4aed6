"""What ``guardian watch`` and ``guardian run`` show: the live terminal view (per-check status, latest values,
step rate) and, when stdout is not a terminal, plain progress lines. Formatting only; ``guardian.watch.display``
and the run's loop decide when."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text

from guardian.findings import Severity
from guardian.history import RunHistory
from guardian.keys import Signal
from guardian.tracker import StatusTracker, Transition

STYLE = {
    Severity.UNKNOWN: "dim",
    Severity.OK: "green",
    Severity.WARN: "yellow",
    Severity.CRITICAL: "bold red",
}
SHOWN_SIGNALS = (
    Signal.REWARD,
    Signal.ENTROPY,
    Signal.KL,
    Signal.EGR,
    Signal.LOG_PPL,
    Signal.LENGTH_MEAN,
    Signal.GRAD_NORM,
    Signal.LR,
    Signal.STEP_TIME,
)
# the signals of a plain progress line, when logged
PROGRESS_SIGNALS = (Signal.REWARD, Signal.ENTROPY, Signal.KL, Signal.EGR)


def steps_per_minute(history: RunHistory, window: int = 20) -> float | None:
    arrived = [history.arrivals[s] for s in history.steps[-window:] if s in history.arrivals]
    if len(arrived) < 2 or arrived[-1] <= arrived[0]:
        return None
    return 60.0 * (len(arrived) - 1) / (arrived[-1] - arrived[0])


def render(run_id: str, history: RunHistory, tracker: StatusTracker, now: float, note: str = "") -> Group:
    """The live view; ``note`` is a line under the header (waiting for the file)."""
    rate = steps_per_minute(history)
    age = now - history.arrivals[history.last_step] if history.last_step in history.arrivals else None
    header = Text.assemble(
        ("guardian watch ", "bold"),
        (run_id, "cyan"),
        f"  step {history.last_step if history.last_step is not None else '-'}",
        f"  {rate:.1f} steps/min" if rate else "  - steps/min",
        f"  last step {age:.0f}s ago" if age is not None else "",
        ("\n" + note, "yellow") if note else "",
    )
    checks = Table(title="checks", expand=True)
    for column in ("check", "status", "step", "onset", "finding"):
        checks.add_column(column)
    for name, finding in sorted(tracker.latest.items()):
        checks.add_row(
            name,
            Text(finding.severity.label, style=STYLE[finding.severity]),
            str(finding.step if finding.step is not None else "-"),
            str(finding.onset_step if finding.onset_step is not None else "-"),
            finding.message,
        )
    values = Table(title="latest values", expand=True)
    values.add_column("signal")
    values.add_column("value", justify="right")
    values.add_column("at step", justify="right")
    for signal in SHOWN_SIGNALS:
        series = history.signal(signal)
        if not len(series):
            values.add_row(signal.value, Text("not logged", style="dim"), "")
            continue
        value = series.values[-1]
        values.add_row(signal.value, f"{value:.4g}" if math.isfinite(value) else "non-finite", str(series.steps[-1]))
    return Group(header, checks, values)


def _number(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "non-finite"


def checks_state(tracker: StatusTracker) -> str:
    """``ok``, or the checks in trouble by severity: ``warn truncation; critical entropy_collapse``."""
    troubled = {
        severity: sorted(name for name, f in tracker.latest.items() if f.severity == severity)
        for severity in (Severity.WARN, Severity.CRITICAL)
    }
    parts = [f"{severity.label} {','.join(names)}" for severity, names in troubled.items() if names]
    return "; ".join(parts) or "ok"


def progress_line(history: RunHistory, tracker: StatusTracker) -> str:
    """``step 120  reward 0.41  entropy 0.62  egr 0.71  ok``: the latest value of each logged signal."""
    parts = [f"step {history.last_step if history.last_step is not None else '-'}"]
    for signal in PROGRESS_SIGNALS:
        series = history.signal(signal)
        if len(series):
            parts.append(f"{signal.value} {_number(series.values[-1])}")
    parts.append(checks_state(tracker))
    return "  ".join(parts)


def finding_line(transition: Transition) -> str:
    """``step 24  critical  entropy_collapse  raised  <message> (onset ~16)``."""
    f = transition.finding
    onset = f" (onset ~{f.onset_step})" if f.onset_step is not None and f.onset_step != f.step else ""
    step = f.step if f.step is not None else "-"
    return f"step {step}  {f.severity.label}  {f.check}  {transition.change.value}  {f.message}{onset}"
