"""Which rollout dumps to remove so a run's own dumps stay under ``keep_bytes``. Pure: no files are read.

Never removed: the newest ``keep_recent_steps``, each attempt's first steps, the steps around incidents and warnings,
an abandoned branch, quarantined files and any file the guardian did not create. The rest goes oldest first; when
the kept evidence alone is larger, the plan says so. Why: docs/decisions/0005-rollout-dump-retention.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

StepRange = tuple[int, int]  # first and last step, inclusive


@dataclass(frozen=True, slots=True)
class DumpFile:
    """One ``{step}.jsonl`` dump: where it lies, its size, and whose it is."""

    path: Path
    step: int
    size: int
    attempt: int | None  # the attempt whose own folder holds it; None: a folder the attempts share
    quarantined: bool = False  # inside a quarantine folder (moved aside by a rollback)
    owned: bool = True  # the guardian created its folder (False: the user's trainer.rollout_data_dir)


@dataclass(frozen=True, slots=True)
class Abandoned:
    """A branch a rollback abandoned: ``attempt``'s dumps after ``after_step`` (-1: all of them, a restart from
    scratch) were replaced by a later attempt's."""

    attempt: int
    after_step: int


@dataclass(frozen=True, slots=True)
class Retention:
    """What is kept besides the cap (``rollouts`` in guardian.yaml, with the checks' baseline)."""

    keep_bytes: int
    keep_recent_steps: int
    keep_around_incident_steps: int
    keep_first_steps: int  # each attempt's first dumped steps: the baseline a rebuilt timeline is judged against


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """The dumps to remove, oldest first, and what stays."""

    remove: tuple[DumpFile, ...]
    kept_files: int
    kept_bytes: int  # the run's own dumps left after the removals
    over_cap: bool  # what must be kept is larger than keep_bytes on its own

    @property
    def removed_bytes(self) -> int:
        return sum(f.size for f in self.remove)


def plan_pruning(
    files: Iterable[DumpFile],
    *,
    newest_step: int | None,
    incidents: Sequence[StepRange],
    abandoned: Sequence[Abandoned],
    policy: Retention,
) -> PrunePlan:
    """The dumps to remove (see the module docstring). ``newest_step``: the run's newest logged step (the newest
    dump counts too); ``incidents``: the first and last of each incident's marked steps (onset, rollback point,
    detection, closing) and of each stretch of warnings, widened here by ``keep_around_incident_steps``."""
    dumps = sorted(files, key=lambda f: (f.step, f.attempt or 0, str(f.path)))
    owned = [f for f in dumps if f.owned]
    newest = max([f.step for f in owned] + ([newest_step] if newest_step is not None else []), default=0)
    around = policy.keep_around_incident_steps
    windows = [(lo - around, hi + around) for lo, hi in incidents]
    firsts = _first_steps(owned, policy.keep_first_steps)

    def protected(f: DumpFile) -> bool:
        return (
            f.quarantined
            or f.step > newest - policy.keep_recent_steps
            or any(lo <= f.step <= hi for lo, hi in windows)
            or any(f.attempt == a.attempt and f.step > a.after_step for a in abandoned)
            or f.step in firsts.get(f.attempt, ())
        )

    total = sum(f.size for f in owned)
    remove: list[DumpFile] = []
    for f in owned:
        if total <= policy.keep_bytes:
            break
        if not protected(f):
            remove.append(f)
            total -= f.size
    return PrunePlan(tuple(remove), len(owned) - len(remove), total, total > policy.keep_bytes)


def _first_steps(files: Sequence[DumpFile], count: int) -> dict[int | None, frozenset[int]]:
    """Each folder's (attempt's) lowest ``count`` steps outside its quarantine."""
    steps: dict[int | None, list[int]] = {}
    for f in files:
        if not f.quarantined:
            steps.setdefault(f.attempt, []).append(f.step)
    return {attempt: frozenset(sorted(set(found))[:count]) for attempt, found in steps.items()}
