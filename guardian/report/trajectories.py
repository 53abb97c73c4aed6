"""The highest-reward trajectories of a run's rollout dumps, abandoned branches included (a hack shows there first).

Reads each attempt's ``rollouts`` folder, or the run's own dump folder and its quarantine; one folder is read once.
Dumps are streamed, holding only the best ``count`` distinct (prompt, response) samples; ``uid`` is not used
to deduplicate (it names the rollout, not its text)."""

from __future__ import annotations

import heapq
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import count as counter
from pathlib import Path

import orjson

from guardian.actions.launcher import RunFolder
from guardian.checkpoints.quarantine import QUARANTINE_DIR
from guardian.config import MAX_LINE_BYTES
from guardian.regular_files import NotRegularFile, open_regular
from guardian.report.series import StepRange
from guardian.sources.rollouts import DUMP_FIELDS, dump_rows, sample_score
from guardian.store import AttemptView, RunView

Row = Mapping[str, object]
Rank = tuple[float, bool, int, int]  # score, abandoned, step, -(the order read)


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One sampled response from a rollout dump."""

    step: int
    score: float
    abandoned: bool  # from a branch a rollback abandoned
    source: str  # where the dump lies, as people read it ("attempt 1", "quarantined by incident-1")
    prompt: str
    response: str
    truth: str
    extras: tuple[tuple[str, float], ...]  # the reward function's other numeric fields (components)


@dataclass(frozen=True, slots=True)
class TrajectorySample:
    """The highest-reward trajectories of the dumps in the report's steps, and what was searched for them."""

    shown: tuple[Trajectory, ...]
    scored_rows: int
    dumps: int
    folders: tuple[str, ...]
    problems: tuple[str, ...]  # unreadable lines


@dataclass(frozen=True, slots=True)
class DumpFolder:
    """A folder of ``{step}.jsonl`` dumps and whose they are."""

    path: Path
    attempt: int | None  # the attempt that alone wrote it; None: shared by the run's attempts
    quarantined_by: str | None = None  # "incident-<id>": moved aside by that incident's rollback

    @property
    def source(self) -> str:
        if self.quarantined_by is not None:
            return f"quarantined by {self.quarantined_by}"
        return f"attempt {self.attempt}" if self.attempt is not None else "run dump folder"

    def abandoned(self, step: int, kept: Mapping[int, int]) -> bool:
        """Is this folder's dump of ``step`` from a branch a rollback abandoned? (``kept``: step -> the attempt
        the kept timeline has it from.)"""
        if self.quarantined_by is not None:
            return True
        return self.attempt is not None and kept.get(step) != self.attempt


def dump_folders(run: RunView, attempts: Sequence[AttemptView]) -> list[DumpFolder]:
    """The run's dump folders that exist, each attempt's own and the shared one, with their quarantines; a folder
    reached by two names (relative, through a link) is listed once, as the attempt's own."""
    own: dict[Path, int] = {}
    for a in attempts:
        folder = RunFolder(Path(a.metrics_path).parent.parent)
        if folder.metrics(a.number) == Path(a.metrics_path):  # laid out by guardian run
            own.setdefault(folder.rollouts(a.number).resolve(), a.number)
    bases = [DumpFolder(path, number) for path, number in own.items()]
    if run.rollouts_dir:
        bases.append(DumpFolder(Path(run.rollouts_dir).resolve(), None))
    found = []
    seen: set[tuple[int, int]] = set()
    for base in bases:
        try:
            info = base.path.stat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) in seen:
            continue  # the same folder under another name (a bind mount too) is read once
        seen.add((info.st_dev, info.st_ino))
        found.append(base)
        quarantine = base.path / QUARANTINE_DIR
        if quarantine.is_dir():
            found += [DumpFolder(p, base.attempt, p.name) for p in sorted(quarantine.iterdir()) if p.is_dir()]
    return found


def _dumps(folder: Path, steps: StepRange | None) -> Iterator[tuple[int, Path]]:
    for path in sorted(folder.iterdir()):
        stem = path.name.removesuffix(".jsonl")
        if path.name.endswith(".jsonl") and stem.isascii() and stem.isdigit() and path.is_file():
            step = int(stem)
            if steps is None or steps[0] <= step <= steps[1]:
                yield step, path


def _text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def _extras(row: Row) -> tuple[tuple[str, float], ...]:
    return tuple(
        (name, float(value))
        for name, value in row.items()
        if name not in DUMP_FIELDS and isinstance(value, int | float) and not isinstance(value, bool)
    )


def highest_reward(
    folders: Sequence[DumpFolder],
    steps: StepRange | None,
    kept: Mapping[int, int],
    count: int,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> TrajectorySample:
    """The ``count`` highest-scoring distinct samples (prompt, response) of the dumps in ``steps`` (every dump for
    None), best first, each at its best occurrence. Among equal scores the abandoned branch's come first (the
    evidence behind a rollback), then the later steps'. A line longer than ``max_line_bytes``
    (``sources.max_line_bytes``) is skipped as a problem, never held whole."""
    held: dict[tuple[str, str], tuple[Rank, DumpFolder, Row]] = {}  # sample -> its best occurrence
    heap: list[tuple[Rank, tuple[str, str]]] = []  # a min-heap by rank; an entry no longer in ``held`` is stale
    order = counter()
    scored = dumps = 0
    problems: list[str] = []
    for folder in folders:
        for step, path in _dumps(folder.path, steps):
            dumps += 1
            abandoned = folder.abandoned(step, kept)
            try:
                handle = open_regular(path)
            except (FileNotFoundError, NotRegularFile) as exc:
                problems.append(f"{path}: cannot read ({exc.strerror or exc})")
                continue
            with handle:
                size = os.fstat(handle.fileno()).st_size
                for row in dump_rows(handle, size, path, problems, max_line_bytes=max_line_bytes):
                    score = sample_score(row)
                    if score is None:
                        continue
                    scored += 1
                    if count <= 0:
                        continue
                    rank = (score, abandoned, step, -next(order))  # then the first read
                    key = (_text(row.get("input")), _text(row.get("output")))
                    if key in held:
                        if rank <= held[key][0]:
                            continue
                    elif len(held) >= count:
                        while (live := held.get(heap[0][1])) is None or live[0] != heap[0][0]:
                            heapq.heappop(heap)  # stale: its sample was dropped or held at a better occurrence
                        if rank <= heap[0][0]:
                            continue
                        del held[heapq.heappop(heap)[1]]
                    held[key] = (rank, folder, row)
                    heapq.heappush(heap, (rank, key))
                    if len(heap) > 4 * count:
                        heap = [(r, k) for k, (r, _, _) in held.items()]
                        heapq.heapify(heap)
    best = sorted(held.values(), key=lambda entry: entry[0], reverse=True)
    shown = tuple(
        Trajectory(
            step=step,
            score=score,
            abandoned=abandoned,
            source=folder.source,
            prompt=_text(row.get("input")),
            response=_text(row.get("output")),
            truth=_text(row.get("gts")),
            extras=_extras(row),
        )
        for (score, abandoned, step, _), folder, row in best
    )
    return TrajectorySample(shown, scored, dumps, tuple(str(f.path) for f in folders), tuple(problems))
