"""What ``guardian watch`` and ``guardian run`` show: the live terminal view, or plain progress lines off a terminal.

Formatting only, of the tick's published ``RunSnapshot`` (what the exporter serves too); the loop and
``watch.display`` decide when, ``commands.screen`` where.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.text import Text

from guardian.core import Finding, Severity
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


@dataclass(frozen=True, slots=True)
class Header:
    """What the view's header says beyond the snapshot: the command (``guardian watch`` or ``guardian run``), the
    guardian's mode, the trainer's pid and the run's total steps (for the ETA), each when known."""

    title: str = "guardian watch"
    mode: str = ""
    trainer_pid: int | None = None
    total_steps: int | None = None


WATCH_HEADER = Header()


def eta_seconds(snapshot: RunSnapshot, total_steps: int | None) -> float | None:
    """Seconds until ``total_steps`` at the current step rate; None when the total or the rate is not known."""
    rate, step = snapshot.steps_per_minute, snapshot.step
    if total_steps is None or step is None or not rate or rate <= 0:
        return None
    return max(0, total_steps - step) * 60.0 / rate


def duration(seconds: float) -> str:
    """``45s``, ``12m``, ``4h 40m``, ``2d 3h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def by_severity(findings: Mapping[str, Finding]) -> list[tuple[str, Finding]]:
    """The checks worst first (critical, warn, ok, unknown), by name within a severity."""
    return sorted(findings.items(), key=lambda item: (-item[1].severity, item[0]))


def hidden_summary(hidden: Sequence[Finding]) -> str:
    """``+5 more ok``, or ``+5 more: 1 warn, 4 ok`` when they are not all of one severity."""
    counts = Counter(f.severity for f in hidden)
    if len(counts) == 1:
        return f"+{len(hidden)} more {next(iter(counts)).label}"
    parts = ", ".join(f"{counts[s]} {s.label}" for s in sorted(counts, reverse=True))
    return f"+{len(hidden)} more: {parts}"


def _line(*parts: str | tuple[str, str], width: int) -> Text:
    text = Text.assemble(*parts, no_wrap=True, overflow="ellipsis")
    text.truncate(width, overflow="ellipsis")
    return text


def _header_lines(snapshot: RunSnapshot, header: Header, width: int) -> list[Text]:
    who = [f"  mode {header.mode}" if header.mode else ""]
    who.append(f"  attempt {snapshot.attempt}" if snapshot.attempt is not None else "")
    who.append(f"  pid {header.trainer_pid}" if header.trainer_pid is not None else "")
    first = _line((header.title + " ", "bold"), (snapshot.run_id, "cyan"), *who, width=width)
    rate, age = snapshot.steps_per_minute, snapshot.last_step_age_seconds
    step = str(snapshot.step) if snapshot.step is not None else "-"
    if header.total_steps is not None:
        step += f"/{header.total_steps}"
    eta = eta_seconds(snapshot, header.total_steps)
    second = _line(
        f"step {step}",
        f"  {rate:.1f} steps/min" if rate else "  - steps/min",
        f"  last step {age:.0f}s ago" if age is not None else "",
        f"  ETA {duration(eta)}" if eta is not None else "",
        width=width,
    )
    return [first, second]


def _check_lines(findings: Mapping[str, Finding], rows: int, width: int) -> list[Text]:
    """The checks' table in at most ``rows`` lines (its heading included): worst first, the rest summarised."""
    ranked = by_severity(findings)
    if not ranked or rows < 2:
        return [_line(("checks: none judged yet", "dim"), width=width)] if rows >= 1 else []
    shown = ranked if len(ranked) <= rows - 1 else ranked[: rows - 2]
    name_w = min(max(len(name) for name, _ in ranked), 24)
    head = f"{'check':<{name_w}}  {'status':<8}  {'step':>6}  {'onset':>6}  finding"
    lines = [_line((head, "bold"), width=width)]
    for name, f in shown:
        step = str(f.step) if f.step is not None else "-"
        onset = str(f.onset_step) if f.onset_step is not None else "-"
        lines.append(
            _line(
                f"{name[:name_w]:<{name_w}}  ",
                (f"{f.severity.label:<8}", STYLE[f.severity]),
                f"  {step:>6}  {onset:>6}  {f.message}",
                width=width,
            )
        )
    if len(shown) < len(ranked):
        lines.append(_line((hidden_summary([f for _, f in ranked[len(shown) :]]), "dim"), width=width))
    return lines


def _value_lines(snapshot: RunSnapshot, width: int) -> list[Text]:
    """The latest value of each shown signal, packed into as few lines as ``width`` allows."""
    items: list[str] = []
    for signal in SHOWN_SIGNALS:
        if signal not in snapshot.signals:
            items.append(f"{signal.value} -")
            continue
        value = snapshot.signals[signal]
        shown = f"{value:.4g}" if math.isfinite(value) else "non-finite"
        items.append(f"{signal.value} {shown} @{snapshot.signal_steps[signal]}")
    lines, current = [], ""
    for item in items:
        if current and len(current) + 3 + len(item) > width:
            lines.append(_line(current, width=width))
            current = ""
        current = f"{current}   {item}" if current else item
    if current:
        lines.append(_line(current, width=width))
    return lines


def render(
    snapshot: RunSnapshot,
    note: str = "",
    *,
    header: Header = WATCH_HEADER,
    footer: str = "",
    width: int = 80,
    height: int = 24,
) -> Group:
    """The live view in at most ``height`` lines of at most ``width`` columns: the header (run, mode, attempt,
    trainer pid; step, rate, ETA), ``note`` (waiting for the file), the checks worst first (those that do not fit
    summarised as ``+N more ok``), ``footer`` (the intervention under way) and the latest values."""
    top = _header_lines(snapshot, header, width)
    if note:
        top.append(_line((note, "yellow"), width=width))
    bottom = [_line((footer, "bold"), width=width)] if footer else []
    bottom += _value_lines(snapshot, width)
    rows = max(0, height - len(top) - len(bottom))
    lines = top + _check_lines(snapshot.findings, rows, width) + bottom
    return Group(*lines[:height])


def run_footer(snapshot: RunSnapshot) -> str:
    """``guardian run``'s line under the checks: the intervention in progress."""
    if not snapshot.store_read:  # the guarding goes on from memory; the view says what it cannot know
        return "intervention: unknown (the store cannot be read)"
    return snapshot.intervention or "no intervention in progress"


class Frame:
    """A view drawn at the size the console gives it (the terminal's, or the screen's while it is on the alternate
    screen): ``draw(width, height)`` makes the frame."""

    def __init__(self, draw: Callable[[int, int], RenderableType]) -> None:
        self.draw = draw

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.draw(options.max_width, options.height or console.size.height)


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
