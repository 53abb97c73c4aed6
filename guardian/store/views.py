"""The frozen views the store hands out, and their conversion from ORM rows.
Timestamps come back as aware UTC (SQLite's naive values read as UTC), statuses as ``guardian.states`` members;
``to_json`` gives JSON-ready data with ISO 8601 timestamps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, NamedTuple

import orjson

from guardian.core import EvidenceValue, Severity
from guardian.states import CLOSED_INCIDENT_STATUSES, IncidentStatus, Mode, RunStatus, Verdict
from guardian.store.models import Attempt, Checkpoint, FindingRow, Incident, Run

MODES: Final = frozenset(Mode)
VERDICTS: Final = frozenset(Verdict)

# ---------------------------------------------------------------------------------------------- views


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True, slots=True)
class RunView:
    """A guarded run."""

    id: str
    name: str
    created_at: datetime
    metrics_path: str
    rollouts_dir: str
    checkpoints_dir: str | None
    mode: str
    status: RunStatus
    config_json: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "created_at": _iso(self.created_at),
            "metrics_path": self.metrics_path,
            "rollouts_dir": self.rollouts_dir,
            "checkpoints_dir": self.checkpoints_dir,
            "mode": self.mode,
            "status": self.status,
            "config": _loads_lenient(self.config_json),
        }

    @property
    def command(self) -> list[str] | None:
        """The training command ``guardian run`` stored for the run (None for ``guardian watch``)."""
        saved = _loads_lenient(self.config_json)
        command = saved.get("command") if isinstance(saved, dict) else None
        return [str(arg) for arg in command] if isinstance(command, list) else None

    def override(self, key: str) -> str | None:
        """The value the stored command gives the Hydra ``key`` (``key=v``, ``+key=v``, ``++key=v``)."""
        prefix = key + "="
        for arg in self.command or ():
            text = arg.lstrip("+")
            if text.startswith(prefix) and len(text) > len(prefix):
                return text[len(prefix) :].strip("'\"")
        return None


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One launch of the trainer."""

    id: int
    run_id: str
    number: int
    started_at: datetime
    ended_at: datetime | None
    command: object
    metrics_path: str
    pid: int | None
    exit_code: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "number": self.number,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "command": self.command,
            "metrics_path": self.metrics_path,
            "pid": self.pid,
            "exit_code": self.exit_code,
        }


class StepIndex(NamedTuple):
    """Where one stored step lies, without its values: the attempt and branch (line) that logged it."""

    attempt_id: int
    attempt_number: int
    branch: int
    step: int


@dataclass(frozen=True, slots=True)
class CheckpointView:
    """A checkpoint and its verdict."""

    id: int
    run_id: str
    step: int
    path: str
    found_at: datetime
    verdict: Verdict
    note: str | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "step": self.step,
            "path": self.path,
            "found_at": _iso(self.found_at),
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class FindingView:
    """A stored finding."""

    id: int
    run_id: str
    attempt_id: int | None
    check: str
    severity: Severity
    step: int | None
    onset_step: int | None
    message: str
    evidence: Mapping[str, EvidenceValue]
    created_at: datetime
    incident_id: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "check": self.check,
            "severity": self.severity.label,
            "step": self.step,
            "onset_step": self.onset_step,
            "message": self.message,
            "evidence": dict(self.evidence),
            "created_at": _iso(self.created_at),
            "incident_id": self.incident_id,
        }


@dataclass(frozen=True, slots=True)
class IncidentView:
    """An incident: what went wrong, how bad it got, where it stands."""

    id: int
    run_id: str
    check: str
    severity: Severity
    status: IncidentStatus
    opened_at: datetime
    opened_step: int | None
    onset_step: int | None
    updated_at: datetime
    closed_at: datetime | None
    closed_step: int | None
    message: str
    evidence: Mapping[str, EvidenceValue]
    note: str | None

    @property
    def is_open(self) -> bool:
        return self.status not in CLOSED_INCIDENT_STATUSES

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "check": self.check,
            "severity": self.severity.label,
            "status": self.status,
            "opened_at": _iso(self.opened_at),
            "opened_step": self.opened_step,
            "onset_step": self.onset_step,
            "updated_at": _iso(self.updated_at),
            "closed_at": _iso(self.closed_at),
            "closed_step": self.closed_step,
            "message": self.message,
            "evidence": dict(self.evidence),
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class IncidentDetail:
    """An incident with its findings, oldest first."""

    incident: IncidentView
    findings: tuple[FindingView, ...]

    def to_json(self) -> dict[str, object]:
        return {**self.incident.to_json(), "findings": [f.to_json() for f in self.findings]}


@dataclass(frozen=True, slots=True)
class StepLine:
    """One line (attempt, branch) of a run's steps with all their values, abandoned lines too.

    ``cut_at``: the first step a newer line took over (a resume or rollback abandoned this line's steps from
    there on); None for the newest line. The steps before it are this line's part of the active timeline.
    """

    attempt_number: int
    branch: int
    cut_at: int | None
    steps: tuple[tuple[int, Mapping[str, float | None]], ...]  # (step, values), steps ascending

    def kept(self, step: int) -> bool:
        """Is ``step`` of this line on the active timeline?"""
        return self.cut_at is None or step < self.cut_at


# -------------------------------------------------------------------------------------- conversions


def at_utc(now: float) -> datetime:
    """A clock reading (epoch seconds) as the aware UTC timestamp the store keeps."""
    return datetime.fromtimestamp(now, tz=UTC)


def as_utc(value: datetime) -> datetime:
    """A database timestamp as aware UTC (SQLite hands back naive values)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _utc_or_none(value: datetime | None) -> datetime | None:
    return as_utc(value) if value is not None else None


def _loads_lenient(text: str | None) -> object:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _evidence(text: str) -> dict[str, EvidenceValue]:
    parsed = orjson.loads(text)
    return parsed if isinstance(parsed, dict) else {}


def parse_severity(label: str) -> Severity:
    """A stored severity label as ``Severity``; a label it does not know reads as ``UNKNOWN``."""
    try:
        return Severity[label.upper()]
    except KeyError:
        return Severity.UNKNOWN


def run_view(row: Run) -> RunView:
    return RunView(
        id=row.id,
        name=row.name,
        created_at=as_utc(row.created_at),
        metrics_path=row.metrics_path,
        rollouts_dir=row.rollouts_dir,
        checkpoints_dir=row.checkpoints_dir,
        mode=row.mode,
        status=RunStatus(row.status),
        config_json=row.config_json,
    )


def attempt_view(row: Attempt) -> AttemptView:
    return AttemptView(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        started_at=as_utc(row.started_at),
        ended_at=_utc_or_none(row.ended_at),
        command=_loads_lenient(row.command_json),
        metrics_path=row.metrics_path,
        pid=row.pid,
        exit_code=row.exit_code,
    )


def checkpoint_view(row: Checkpoint) -> CheckpointView:
    return CheckpointView(
        id=row.id,
        run_id=row.run_id,
        step=row.step,
        path=row.path,
        found_at=as_utc(row.found_at),
        verdict=Verdict(row.verdict),
        note=row.note,
    )


def finding_view(row: FindingRow) -> FindingView:
    return FindingView(
        id=row.id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        check=row.check,
        severity=parse_severity(row.severity),
        step=row.step,
        onset_step=row.onset_step,
        message=row.message,
        evidence=_evidence(row.evidence_json),
        created_at=as_utc(row.created_at),
        incident_id=row.incident_id,
    )


def incident_view(row: Incident) -> IncidentView:
    return IncidentView(
        id=row.id,
        run_id=row.run_id,
        check=row.check,
        severity=parse_severity(row.severity),
        status=IncidentStatus(row.status),
        opened_at=as_utc(row.opened_at),
        opened_step=row.opened_step,
        onset_step=row.onset_step,
        updated_at=as_utc(row.updated_at),
        closed_at=_utc_or_none(row.closed_at),
        closed_step=row.closed_step,
        message=row.message,
        evidence=_evidence(row.evidence_json),
        note=row.note,
    )
