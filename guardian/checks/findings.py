"""What a health check says about a run at a step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

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
