"""The value types every layer shares: step record and bounds, finding and severity, clock, save schedule, footprint.

The bottom import layer (docs/ARCHITECTURE.md §2): it imports nothing from guardian, so sources, checks, the store
and the outlets speak these types without importing each other. Reading and judging steps live elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

Clock = Callable[[], float]
"""Seconds since the epoch (``time.time`` in production); injected everywhere, so a tick is testable in one call."""

MAX_STEP: Final = 2**63 - 1
"""The largest step number a source takes (the store keeps steps as 64-bit integers): a line past it, or below 0, is
a bad line of its file, never a write the store refuses."""


def valid_step(step: int) -> bool:
    """Whether ``step`` is a step number the guardian keeps: ``0 <= step <= MAX_STEP``."""
    return 0 <= step <= MAX_STEP


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One metric line (or the merge of several) for one training step.

    ``data`` holds numbers only; a non-finite value (verl writes ``null``; other writers ``NaN``)
    is ``math.nan``.
    """

    step: int
    data: Mapping[str, float]


# a flag is a bool (JSON true/false), never the string "true"
EvidenceValue = bool | float | int | str | None


class Severity(IntEnum):
    """A check's verdict at a step, ordered so that max() picks the worst."""

    UNKNOWN = -1  # the signals the check needs are missing, or too few steps to judge yet
    OK = 0
    WARN = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict at one step.

    ``onset_step`` estimates where the trouble began (for choosing a rollback target); ``evidence``
    holds the numbers the verdict rests on, so an incident can be read without re-running the checks.
    ``advice`` marks a WARN that advises rather than reports trouble ("converged: consider stopping"):
    a rescue on probation counts it as healthy.
    """

    check: str
    severity: Severity
    step: int | None
    message: str
    onset_step: int | None = None
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)
    advice: bool = False

    @property
    def healthy(self) -> bool:
        """OK, or a warning that only advises."""
        return self.severity == Severity.OK or (self.severity == Severity.WARN and self.advice)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "check": self.check,
            "severity": self.severity.label,
            "step": self.step,
            "onset_step": self.onset_step,
            "message": self.message,
            "evidence": {k: _shown(v) for k, v in self.evidence.items()},
        }
        if self.advice:
            out["advice"] = True
        return out


def _shown(value: EvidenceValue) -> EvidenceValue:
    """Four significant digits: evidence is read by people; the checks keep full precision."""
    return float(f"{value:.4g}") if isinstance(value, float) else value


Stat = tuple[int, int, int]
"""Files, bytes, newest modification time (ns) of what lies at a path."""


@dataclass(frozen=True, slots=True)
class Footprint:
    """One look at step N on disk: its ``global_step_N/`` folder and its validation dump ``N.jsonl`` (None: absent);
    read by ``sources.footprint``, judged by the stall check (``checks.signs``)."""

    checkpoint: Stat | None = None
    dump: Stat | None = None


@dataclass(frozen=True, slots=True)
class StepSchedule:
    """The steps verl saves and validates at: every ``save_freq``/``test_freq`` steps (0 or less: never), and at
    ``last_step`` (``trainer.total_training_steps``; None: not known) when that one is on."""

    save_freq: int = 0
    test_freq: int = 0
    last_step: int | None = None

    def saves(self, step: int) -> bool:
        return self.save_freq > 0 and (step % self.save_freq == 0 or step == self.last_step)

    def validates(self, step: int) -> bool:
        return self.test_freq > 0 and (step % self.test_freq == 0 or step == self.last_step)
