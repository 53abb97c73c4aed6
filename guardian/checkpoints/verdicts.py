"""A checkpoint's verdict (may a rollback land on it?), from the timeline around its step. Pure.

Unhealthy: saved at a step with NaN/inf (whatever becomes of the incident), or at or after an open critical
incident's onset. Unknown: the timeline has not reached its step yet (judged once the line arrives). Recording
the verdicts is the guard loop's (``guardian.incidents.tick``), which also marks them on a later onset.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Final

from guardian.states import Verdict

NON_FINITE_NOTE: Final = "saved at a step with non-finite values"


@dataclass(frozen=True, slots=True)
class Judged:
    verdict: Verdict
    note: str | None  # None: keep the stored note; "" clears an old branch's note


def judge(
    step: int, *, last_step: int | None, non_finite: Container[int], onsets: Callable[[], Sequence[int]]
) -> Judged:
    """The verdict of the checkpoint at ``step``. ``non_finite``: the current branch's steps with NaN/inf (a re-save
    after a rollback is judged by its own step); ``onsets``: the open critical incidents' onsets, asked only when
    needed (a store read)."""
    if last_step is None or step > last_step:
        return Judged(Verdict.UNKNOWN, "")  # saved before its step's metrics line: judged once the line arrives
    if step in non_finite:
        return Judged(Verdict.UNHEALTHY, NON_FINITE_NOTE)
    if any(onset <= step for onset in onsets()):
        return Judged(Verdict.UNHEALTHY, None)
    return Judged(Verdict.HEALTHY, "")  # a healthy re-save clears an old branch's note
