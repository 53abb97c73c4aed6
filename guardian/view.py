"""The live terminal view of ``guardian watch``: per-check status, latest values, step rate."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text

from guardian.findings import Severity
from guardian.history import RunHistory
from guardian.keys import Signal
from guardian.tracker import StatusTracker

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


def steps_per_minute(history: RunHistory, window: int = 20) -> float | None:
    arrived = [history.arrivals[s] for s in history.steps[-window:] if s in history.arrivals]
    if len(arrived) < 2 or arrived[-1] <= arrived[0]:
        return None
    return 60.0 * (len(arrived) - 1) / (arrived[-1] - arrived[0])


def render(run_id: str, history: RunHistory, tracker: StatusTracker, now: float) -> Group:
    rate = steps_per_minute(history)
    age = now - history.arrivals[history.last_step] if history.last_step in history.arrivals else None
    header = Text.assemble(
        ("guardian watch ", "bold"),
        (run_id, "cyan"),
        f"  step {history.last_step if history.last_step is not None else '-'}",
        f"  {rate:.1f} steps/min" if rate else "  - steps/min",
        f"  last step {age:.0f}s ago" if age is not None else "",
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
