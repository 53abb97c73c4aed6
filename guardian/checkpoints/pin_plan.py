"""Which checkpoints to pin and which pins to release. Pure: a function of the verdicts, the health around their
steps and the pins already made.

A checkpoint at S is pinned when its verdict is healthy, its ``actor/`` is there, no incident is open, no warn or
worse stood from S - N to S + N (N = ``healthy_window_steps``, the timeline past S + N), and it is among the
``pin_keep`` newest such. A pin is released once ``pin_keep`` newer healthy pins exist.
Why: docs/decisions/0014-checkpoint-pins.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from guardian.core import Severity
from guardian.states import Verdict


class StepHealth(Protocol):
    """The per-step health the plan reads (``guardian.incidents.health.StepHealth`` fits)."""

    def worst_between(self, first: int, last: int) -> Severity: ...


@dataclass(frozen=True, slots=True)
class PinPlan:
    pin: tuple[int, ...] = ()  # steps to pin, newest first
    release: tuple[int, ...] = ()  # steps whose pins go, oldest first


def healthy_around(step: int, health: StepHealth, last_step: int | None, window: int) -> bool:
    """The timeline reached ``step + window`` and no warn or critical finding stood within ``window`` steps of
    ``step``, before or after it."""
    if last_step is None or last_step < step + window:
        return False
    return health.worst_between(step - window, step + window) < Severity.WARN


def plan_pins(
    *,
    verdicts: Mapping[int, Verdict],
    resumable: Collection[int],
    pinned: Collection[int],
    health: StepHealth,
    last_step: int | None,
    window: int,
    keep: int,
    incident_open: bool,
    skip: Collection[int] = (),
) -> PinPlan:
    """What to pin and release now (see the module docstring). ``verdicts``: each checkpoint step's verdict;
    ``resumable``: the steps verl can resume from as they are on disk; ``pinned``: the steps with a pin in place;
    ``skip``: steps whose pin or release failed already (not tried again)."""
    if incident_open or keep <= 0:
        return PinPlan()
    candidates = {
        step
        for step, verdict in verdicts.items()
        if verdict == Verdict.HEALTHY
        and step in resumable
        and step not in pinned
        and step not in skip
        and healthy_around(step, health, last_step, window)
    }
    healthy_pins = {step for step in pinned if verdicts.get(step) == Verdict.HEALTHY}
    newest = sorted(candidates | healthy_pins, reverse=True)[:keep]
    to_pin = tuple(step for step in newest if step in candidates)
    kept = healthy_pins | set(to_pin)
    release = tuple(step for step in sorted(pinned) if step not in skip and sum(other > step for other in kept) >= keep)
    return PinPlan(to_pin, release)
