"""What an event says to a person: ``compose`` turns a ``GuardianEvent`` into an ``Alert``. Pure.

One line each: what was detected, on what evidence, what the guardian did or will do. Plain lines with
``*bold*`` and ``code`` read in Slack, W&B and a log file. Invariant: nothing from an intervention's ``plan``
goes in (its argv and env can hold tokens)."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Final

from guardian.core import Severity
from guardian.exits import EXIT_GAVE_UP
from guardian.loop.outage import CannotContinue
from guardian.notify.events import EventKind, GuardianEvent, Level
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE, RESTART_CHECKS, SETUP_FAILURE
from guardian.states import State

TITLE_MAX: Final = 63  # W&B: a title must be under 64 characters
TEXT_MAX: Final = 3000  # Slack: a section block's text holds at most 3000 characters
EVIDENCE_MAX_ITEMS: Final = 12
VALUE_MAX: Final = 80  # evidence strings (a crash's stdout tail) are cut to this
ELLIPSIS: Final = "…"

_STATE_WORDS: Final[Mapping[State, str]] = {
    State.STOPPED: "stopped",
    State.ROLLED_BACK: "rolled back",
    State.PATCHED: "patched",
    State.RESUMING: "resumed",
    State.RESOLVED: "resolved",
    State.UNRESOLVED: "UNRESOLVED",
    State.RELAPSED: "relapsed",
    State.GAVE_UP: "GAVE UP",
}
_CONTROL: Final = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Alert:
    """One message for people: a short ``title`` (< 64 chars), Markdown-ish ``text``, flat ``fields``.

    ``key`` is the event's key (stable per run: a redelivery carries the same key). ``fields`` are
    single-line strings (run, check, severity, incident, step, state, ...) for log lines and payloads.
    """

    key: str
    run_id: str
    check: str
    level: Level
    title: str
    text: str
    fields: Mapping[str, str]


def compose(event: GuardianEvent) -> Alert:
    """The alert for ``event``."""
    incident = event.incident
    action = _action(event)
    # the incident view is the store's latest, not as of the event: its status shows only on closing
    closed = event.kind is EventKind.INCIDENT_CLOSED
    lines = [
        f"*Detected:* {_detected(event)}",
        f"*Evidence:* {format_evidence(incident.evidence) or 'none recorded'}",
        f"*Guardian:* {action}",
        f"*Run:* `{_one_line(event.run_id)}` · mode {event.mode} · incident #{incident.id}"
        + (f" ({incident.status})" if closed else "")
        + (f" · {_intervention_label(event)}" if event.intervention is not None else "")
        + f" · {event.at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
        f"*See:* `guardian incidents show {incident.id}` · `guardian checkpoints {shlex.quote(event.run_id)}`",
    ]
    fields = {
        "event": event.kind.value,
        "run": event.run_id,
        "check": incident.check,
        "severity": incident.severity.label,
        "incident": str(incident.id),
        "status": incident.status if closed else None,
        "mode": event.mode,
        "step": _opt(incident.opened_step),
        "onset_step": _opt(incident.onset_step),
        "state": event.state.value if event.state is not None else None,
        "intervention": str(event.intervention.number) if event.intervention is not None else None,
        "action": action,
    }
    return Alert(
        key=event.key,
        run_id=event.run_id,
        check=incident.check,
        level=event.level,
        title=_title(event),
        text=truncate("\n".join(lines), TEXT_MAX),
        fields={k: truncate(_one_line(v), 200) for k, v in fields.items() if v is not None},
    )


# ------------------------------------------------------------------------------------------ pieces


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


def cannot_continue_alert(ending: CannotContinue) -> Alert:
    """The alert that the guardian stopped guarding a run (sent past the store: it may be the trouble)."""
    run_id, cause, trainer, fix = ending.run_id, ending.cause, ending.trainer, ending.fix
    return Alert(
        key=f"run:{run_id}:cannot_continue",
        run_id=run_id,
        check="guardian",
        level=Level.CRITICAL,
        title=truncate(f"[{Level.CRITICAL.label}] guardian cannot continue on {run_id}", TITLE_MAX),
        text=truncate(f"*Cause:* {cause}\n*Trainer:* {trainer}\n*What to do:* {fix}", TEXT_MAX),
        fields={"run": run_id, "cause": truncate(_one_line(cause), 200), "trainer": truncate(_one_line(trainer), 200)},
    )


def at_step(step: int | None) -> str:
    """Where in the run something happened, as people read it."""
    return f"at step {step}" if step is not None else "before the first step"


def format_setting(value: object) -> str:
    """An override's value in a patch (before -> after): ``unset`` where the command did not set it; strings (a
    checkpoint path) whole."""
    if value is None or value == "":
        return "unset"
    return value if isinstance(value, str) else format_value(value)


def format_value(value: object) -> str:
    """A value as people read it: floats to four significant digits, strings on one short line."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(value) if math.isnan(value) or math.isinf(value) else f"{value:.4g}"
    return truncate(_one_line(str(value)), VALUE_MAX)


def format_evidence(evidence: Mapping[str, object]) -> str:
    """``key=value, ...`` in the incident's order, at most ``EVIDENCE_MAX_ITEMS`` of them; a crash's
    output is left out (it stays in the store: ``guardian incidents show``)."""
    evidence = {k: v for k, v in evidence.items() if k != CRASH_OUTPUT_EVIDENCE}
    items = [f"{_one_line(str(k))}={format_value(v)}" for k, v in list(evidence.items())[:EVIDENCE_MAX_ITEMS]]
    if len(evidence) > EVIDENCE_MAX_ITEMS:
        items.append(f"(+{len(evidence) - EVIDENCE_MAX_ITEMS} more)")
    return ", ".join(items)


def _title(event: GuardianEvent) -> str:
    what = f"{_one_line(event.check)} on {_one_line(event.run_id)}"
    if event.kind is EventKind.INCIDENT_CLOSED:
        status = {"gave_up": "GAVE UP", "unresolved": "UNRESOLVED"}.get(event.incident.status, event.incident.status)
        what = f"{status}: {what}"
    elif event.kind is EventKind.INTERVENTION and event.state is not None:
        what = f"{_STATE_WORDS.get(event.state, event.state.value.lower())}: {what}"
    return truncate(f"[{event.level.label}] {what}", TITLE_MAX)


def _detected(event: GuardianEvent) -> str:
    incident = event.incident
    where = f"at step {incident.opened_step}" if incident.opened_step is not None else "at an unknown step"
    if incident.onset_step is not None:
        where += f", onset step {incident.onset_step}"
    message = _one_line(incident.message)
    return f"{incident.check} ({incident.severity.label}) {where}" + (f": {message}" if message else "")


def _action(event: GuardianEvent) -> str:
    if event.kind is EventKind.INTERVENTION:
        return _intervention_action(event)
    incident = event.incident
    if event.kind is EventKind.INCIDENT_CLOSED:
        note = _one_line(incident.note or "")
        if incident.status == "gave_up":
            return _gave_up(event, note or "no reason recorded")
        if incident.status == "unresolved":
            return _unresolved(event, note or "no reason recorded")
        at = f" at step {incident.closed_step}" if incident.closed_step is not None else ""
        return f"{incident.status}{at}" + (f": {note}" if note else "")
    if event.mode not in ("enforce", "advise"):
        return f"{event.mode} mode: no action taken"
    if incident.severity is not Severity.CRITICAL:
        advice = "; advise mode: the guardian only recommends" if event.mode == "advise" else ""
        return f"watching; no action unless it turns critical{advice}"
    if event.mode == "advise":
        return f"advise mode: no action taken; see `guardian incidents show {incident.id}` for the recommended fix"
    if incident.check == SETUP_FAILURE:
        return "failed before its first training step: not relaunched; fix the command or its environment (exit 2)"
    before = incident.onset_step if incident.onset_step is not None else incident.opened_step
    limit = f"at or before step {before}" if before is not None else "before the onset"
    if incident.check in RESTART_CHECKS:
        return f"will stop the trainer if it still runs and restart it from the newest healthy checkpoint {limit}"
    return f"will stop the trainer, roll back to the newest healthy checkpoint {limit}, patch the config and resume"


def _intervention_action(event: GuardianEvent) -> str:
    detail = event.detail
    why = _one_line(str(detail.get("why") or "")) or "no reason recorded"
    state = event.state
    if state is State.STOPPED:
        target = detail.get("target")
        return f"stopped the trainer; rolling back to {target or 'a healthy checkpoint'} ({why})"
    if state is State.ROLLED_BACK:
        moved = _steps(detail.get("moved"))
        undo = f"undo: `guardian checkpoints restore {shlex.quote(event.run_id)} --incident {event.incident.id}`"
        if "tracker" in detail:
            after = detail.get("tracker")
            restored = detail.get("restored_from")
            pin = (
                f"restored step {after} from its pin {restored} (verl's retention had deleted it); " if restored else ""
            )
            return f"{pin}quarantined checkpoints after step {after} (moved: {moved}) — never deleted; {undo}"
        return f"{why}; quarantined every checkpoint (moved: {moved}) — never deleted; {undo}"
    if state is State.PATCHED:
        return _patched(detail.get("diff"), detail.get("notes"))
    if state is State.RESUMING:
        iv = event.intervention
        step = iv.target_step if iv is not None else None
        start = f"resumed from step {step}" if step is not None else "restarted from scratch"
        if iv is None:
            return start
        return f"{start} (attempt id {iv.to_attempt_id})" if iv.to_attempt_id is not None else start
    if state is State.RESOLVED:
        return f"resolved: {why}"
    if state is State.UNRESOLVED:
        return _unresolved(event, why)
    if state is State.RELAPSED:
        return f"relapsed: {why}; escalating to the next remedy"
    if state is State.GAVE_UP:
        return _gave_up(event, why)
    return f"intervention entered {state.value if state is not None else 'an unknown state'}"


def _unresolved(event: GuardianEvent, why: str) -> str:
    return (
        f"UNRESOLVED: {why}; the trainer keeps running with the patch; a human must look:"
        f" `guardian incidents show {event.incident.id}` (the abandoned branch's checkpoints are in quarantine:"
        f" `guardian checkpoints {shlex.quote(event.run_id)}`)"
    )


def _gave_up(event: GuardianEvent, why: str) -> str:
    return (
        f"GAVE UP: {why}; the trainer is stopped; exit {EXIT_GAVE_UP} — do not requeue; a human must look:"
        f" `guardian incidents show {event.incident.id}`, `guardian checkpoints {shlex.quote(event.run_id)}`"
    )


def _patched(diff: object, notes: object) -> str:
    changes: list[str] = []
    if isinstance(diff, Sequence) and not isinstance(diff, str):
        for entry in diff:
            # the store keeps [key, before, after]; PatchPlan.to_json writes {"key", "before", "after"}
            if isinstance(entry, Mapping):
                key, before, after = entry.get("key"), entry.get("before"), entry.get("after")
            elif isinstance(entry, Sequence) and not isinstance(entry, str) and len(entry) == 3:
                key, before, after = entry
            else:
                continue
            changes.append(f"{_one_line(str(key))}: {_setting(before)} → {_setting(after)}")
    text = "patched: " + (", ".join(changes) if changes else "no config change (same config)")
    if isinstance(notes, Sequence) and not isinstance(notes, str) and notes:
        text += "; " + "; ".join(_one_line(str(n)) for n in notes)
    return text


def _setting(value: object) -> str:
    return "unset" if value is None else format_value(value)


def _steps(value: object) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "[]"


def _intervention_label(event: GuardianEvent) -> str:
    iv = event.intervention
    assert iv is not None
    return f"{iv.name} ({iv.kind}, rung {iv.rung + 1})"


def _opt(value: int | None) -> str | None:
    return None if value is None else str(value)


def _one_line(text: str) -> str:
    return _CONTROL.sub(" ", text).strip()
