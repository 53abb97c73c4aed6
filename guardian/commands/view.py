"""What ``guardian watch`` and ``guardian run`` show: the live terminal view (per-check status, latest values,
step rate) and, when stdout is not a terminal, plain progress lines. Formatting only, of the tick's published
``RunSnapshot`` (what the exporter serves too); ``guardian.commands.watch.display`` and the run's loop decide when."""

from __future__ import annotations

import math
from collections.abc import Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text

from guardian.checks.findings import Finding, Severity
from guardian.incidents.tracker import Transition
from guardian.keys import Signal
from guardian.sinks.snapshot import RunSnapshot

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


def render(snapshot: RunSnapshot, note: str = "") -> Group:
    """The live view; ``note`` is a line under the header (waiting for the file)."""
    rate, age = snapshot.steps_per_minute, snapshot.last_step_age_seconds
    header = Text.assemble(
        ("guardian watch ", "bold"),
        (snapshot.run_id, "cyan"),
        f"  step {snapshot.step if snapshot.step is not None else '-'}",
        f"  {rate:.1f} steps/min" if rate else "  - steps/min",
        f"  last step {age:.0f}s ago" if age is not None else "",
        ("\n" + note, "yellow") if note else "",
    )
    checks = Table(title="checks", expand=True)
    for column in ("check", "status", "step", "onset", "finding"):
        checks.add_column(column)
    for name, finding in sorted(snapshot.findings.items()):
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
        if signal not in snapshot.signals:
            values.add_row(signal.value, Text("not logged", style="dim"), "")
            continue
        value = snapshot.signals[signal]
        values.add_row(
            signal.value, f"{value:.4g}" if math.isfinite(value) else "non-finite", str(snapshot.signal_steps[signal])
        )
    return Group(header, checks, values)


def run_view(snapshot: RunSnapshot) -> Group:
    """``guardian run --live``: the live view and, under it, the intervention in progress."""
    if not snapshot.store_read:  # the guarding goes on from memory; the view says what it cannot know
        line = "intervention: unknown (the store cannot be read)"
    else:
        line = snapshot.intervention or "no intervention in progress"
    return Group(render(snapshot), Text(line))


def _number(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "non-finite"


def checks_state(findings: Mapping[str, Finding]) -> str:
    """``ok``, or the checks in trouble by severity: ``warn truncation; critical entropy_collapse``."""
    troubled = {
        severity: sorted(name for name, f in findings.items() if f.severity == severity)
        for severity in (Severity.WARN, Severity.CRITICAL)
    }
    parts = [f"{severity.label} {','.join(names)}" for severity, names in troubled.items() if names]
    return "; ".join(parts) or "ok"


def progress_line(snapshot: RunSnapshot) -> str:
    """``step 120  reward 0.41  entropy 0.62  egr 0.71  ok``: the latest value of each logged signal."""
    parts = [f"step {snapshot.step if snapshot.step is not None else '-'}"]
    for signal in PROGRESS_SIGNALS:
        if signal in snapshot.signals:
            parts.append(f"{signal.value} {_number(snapshot.signals[signal])}")
    parts.append(checks_state(snapshot.findings))
    return "  ".join(parts)


def finding_line(transition: Transition) -> str:
    """``step 24  critical  entropy_collapse  raised  <message> (onset ~16)``."""
    f = transition.finding
    onset = f" (onset ~{f.onset_step})" if f.onset_step is not None and f.onset_step != f.step else ""
    step = f.step if f.step is not None else "-"
    return f"step {step}  {f.severity.label}  {f.check}  {transition.change.value}  {f.message}{onset}"
