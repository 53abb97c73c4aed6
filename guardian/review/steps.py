"""Which stored steps a rollback threw away. Pure: the store's step index, attempts and interventions in.

The discarded steps are those of the active timeline just before the rollback, after its target (all of them
from scratch). An attempt an intervention launched begins its timeline right after its resume point, even before
it logs a step."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from guardian.states import State
from guardian.store import AttemptView, InterventionEventView, InterventionView, StepIndex

Timelines = Mapping[int, Sequence[InterventionEventView]]


def rolled_back(timeline: Sequence[InterventionEventView]) -> bool:
    """The intervention got as far as its rollback (quarantine and tracker done): steps were thrown away."""
    return any(e.state == State.ROLLED_BACK for e in timeline)


def resume_starts(interventions: Iterable[InterventionView], attempts: Sequence[AttemptView]) -> dict[int, int]:
    """Attempt number -> the first step its timeline can hold: one after the checkpoint the intervention that
    launched it resumed from (0 from scratch)."""
    numbers = {a.id: a.number for a in attempts}
    return {
        numbers[iv.to_attempt_id]: (iv.target_step + 1 if iv.target_step is not None else 0)
        for iv in interventions
        if iv.to_attempt_id in numbers
    }


def active_steps(index: Iterable[StepIndex], starts: Mapping[int, int], *, up_to_attempt: int) -> list[int]:
    """The steps of the active timeline formed by the lines of attempts numbered up to ``up_to_attempt``,
    ascending; ``starts`` (``resume_starts``) cuts older lines where a relaunch began, logged or not."""
    lines: dict[tuple[int, int], list[int]] = defaultdict(list)
    for row in index:
        if row.attempt_number <= up_to_attempt:
            lines[(row.attempt_number, row.branch)].append(row.step)
    numbers = {n for n, _ in lines} | {n for n in starts if n <= up_to_attempt}
    kept: set[int] = set()
    cutoff: int | None = None
    for number in sorted(numbers, reverse=True):
        for branch in sorted((b for n, b in lines if n == number), reverse=True):
            steps = lines[(number, branch)]
            kept.update(s for s in steps if cutoff is None or s < cutoff)
            cutoff = min(steps) if cutoff is None else min(cutoff, *steps)
        if number in starts:  # a relaunch cuts older lines where it began, logged or not
            cutoff = starts[number] if cutoff is None else min(cutoff, starts[number])
    return sorted(kept)


def discarded_steps(
    iv: InterventionView,
    timeline: Sequence[InterventionEventView],
    index: Sequence[StepIndex],
    attempts: Sequence[AttemptView],
    starts: Mapping[int, int],
) -> list[int]:
    """The steps ``iv``'s rollback threw away: the timeline it stopped, after its target (every step of it
    from scratch). None before the rollback was done, or when the stopped attempt is unknown."""
    number = next((a.number for a in attempts if a.id == iv.from_attempt_id), None)
    if number is None or not rolled_back(timeline):
        return []
    after = iv.target_step if iv.target_step is not None else -1
    return [s for s in active_steps(index, starts, up_to_attempt=number) if s > after]


def discarded_by_intervention(
    interventions: Sequence[InterventionView],
    timelines: Timelines,
    index: Sequence[StepIndex],
    attempts: Sequence[AttemptView],
) -> dict[int, list[int]]:
    """``discarded_steps`` of each intervention, by intervention id."""
    starts = resume_starts(interventions, attempts)
    return {iv.id: discarded_steps(iv, timelines.get(iv.id, ()), index, attempts, starts) for iv in interventions}
