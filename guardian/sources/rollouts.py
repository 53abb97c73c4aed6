"""Per-group reward statistics from ``trainer.rollout_data_dir`` dumps (facts §5, §1.8), including the effective
group ratio (EGR: the share of groups whose scores differ), which verl does not log.

A step's file may appear late, half-written or rewritten on replay. Read through ``tail.capped_lines`` (over-long
lines skipped and reported) and ``regular_files.open_regular`` only."""

from __future__ import annotations

import json
import math
import os
import stat
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from guardian.config import MAX_LINE_BYTES
from guardian.core import valid_step
from guardian.keys import (
    ALL_ONE_KEY,
    ALL_ZERO_KEY,
    EGR_KEY,
    GROUP_STD_KEY,
    GROUPS_KEY,
    REWARD_COMPONENT_PREFIX,
    SAMPLES_KEY,
)
from guardian.regular_files import NotRegularFile, open_regular
from guardian.sources.tail import OversizedLine, capped_lines

# Dump fields that are not reward components (verl writes these itself; ``acc`` repeats a float score).
DUMP_FIELDS = frozenset({"input", "output", "gts", "score", "step", "uid", "request_id", "acc"})
# Scores within this distance count as equal (a group of equal scores has zero GRPO advantage).
SCORE_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Group statistics of one step's rollout dump.

    The fractions are over groups with at least two samples (NaN when there are none);
    ``mean_group_reward_std`` is the mean over those groups of the sample standard deviation of their
    scores (Bessel-corrected, as GRPO normalises advantages). ``skipped_rows`` counts rows without a
    finite numeric score or without a way to group them. ``reward_components`` is the mean of each
    other numeric field (the extra fields a reward function returns, e.g. correctness and format),
    over the rows that have it.
    """

    groups: int
    samples: int
    effective_group_ratio: float
    all_zero_fraction: float
    all_one_fraction: float
    mean_group_reward_std: float
    skipped_rows: int = 0
    reward_components: Mapping[str, float] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        """The statistics under the guardian's own metric keys, ready to merge into a step."""
        return {
            **{REWARD_COMPONENT_PREFIX + name: value for name, value in self.reward_components.items()},
            EGR_KEY: self.effective_group_ratio,
            ALL_ZERO_KEY: self.all_zero_fraction,
            ALL_ONE_KEY: self.all_one_fraction,
            GROUP_STD_KEY: self.mean_group_reward_std,
            GROUPS_KEY: float(self.groups),
            SAMPLES_KEY: float(self.samples),
        }


def sample_score(row: Mapping[str, object]) -> float | None:
    """A dump row's finite numeric score (None: missing, not a number, a bool, or non-finite)."""
    value = row.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        score = float(value)
    except OverflowError:
        return None
    return score if math.isfinite(score) else None


def _sample_key(row: Mapping[str, object], position: int) -> tuple[str, int, int] | None:
    """(group, session, index) of a row; None if it cannot be grouped.

    V1 rows carry ``uid = "{group}_{session}_{index}"``. V0 rows have no uid and are grouped by their
    prompt text; each row is its own sample (``position`` keeps them apart).
    """
    uid = row.get("uid")
    if isinstance(uid, str):
        parts = uid.rsplit("_", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            return "uid:" + parts[0], int(parts[1]), int(parts[2])
        return "uid:" + uid, position, 0  # a bare group id: every row is a sample
    prompt = row.get("input")
    if isinstance(prompt, str):
        return "input:" + prompt, position, 0
    return None


def group_stats(rows: Iterable[Mapping[str, object]]) -> GroupStats:
    """Group the rows of one dump and measure how many groups still have a reward spread."""
    # group -> session -> (index, score): one sample per session, the highest index wins
    groups: dict[str, dict[int, tuple[int, float]]] = {}
    components: dict[str, list[float]] = {}
    skipped = 0
    for position, row in enumerate(rows):
        _collect_components(row, components)
        score = sample_score(row)
        key = _sample_key(row, position)
        if score is None or key is None:
            skipped += 1
            continue
        group, session, index = key
        sessions = groups.setdefault(group, {})
        previous = sessions.get(session)
        if previous is None or index >= previous[0]:
            sessions[session] = (index, score)

    multi = 0
    uniform = all_zero = all_one = 0
    stds: list[float] = []
    for sessions in groups.values():
        scores = [score for _, score in sessions.values()]
        if len(scores) < 2:
            continue
        multi += 1
        stds.append(statistics.stdev(scores))
        if max(scores) - min(scores) <= SCORE_TOLERANCE:
            uniform += 1
            all_zero += abs(scores[0]) <= SCORE_TOLERANCE
            all_one += abs(scores[0] - 1.0) <= SCORE_TOLERANCE

    def fraction(count: int) -> float:
        return count / multi if multi else math.nan

    return GroupStats(
        groups=len(groups),
        samples=sum(len(sessions) for sessions in groups.values()),
        effective_group_ratio=fraction(multi - uniform),
        all_zero_fraction=fraction(all_zero),
        all_one_fraction=fraction(all_one),
        mean_group_reward_std=statistics.fmean(stds) if stds else math.nan,
        skipped_rows=skipped,
        reward_components={name: statistics.fmean(values) for name, values in sorted(components.items())},
    )


def _collect_components(row: Mapping[str, object], into: dict[str, list[float]]) -> None:
    for name, value in row.items():
        if name in DUMP_FIELDS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        number = float(value)
        if math.isfinite(number):
            into.setdefault(name, []).append(number)


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    """Steps whose dump was (re)computed this poll, in step order, and the unreadable lines."""

    stats: list[tuple[int, GroupStats]]
    bad: list[str]


def _load_row(line: bytes) -> object:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    return json.loads(line)  # verl writes with json.dumps: a NaN score is the bare token NaN


class RolloutDir:
    """Watch a rollout dump directory; each poll returns stats for dumps that are complete and new.

    A dump is read once it ends with a newline and either a later step's dump was written no earlier
    than it (the writer thread works in step order) or its size and mtime did not change since the
    previous poll. A dump that changes afterwards (a replayed step) is read again; an unchanged one
    never is.
    """

    def __init__(self, path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._path = Path(path)
        self._max_line = max_line_bytes
        self._seen: dict[int, tuple[int, int]] = {}  # step -> (size, mtime_ns) at the previous poll
        self._done: dict[int, tuple[int, int]] = {}  # step -> (size, mtime_ns) when last computed

    @property
    def path(self) -> Path:
        return self._path

    @property
    def max_line_bytes(self) -> int:
        """The longest dump line read; a longer one is a bad line (``sources.max_line_bytes``)."""
        return self._max_line

    def poll(self) -> RolloutBatch:
        current = self._scan()
        stats: list[tuple[int, GroupStats]] = []
        bad: list[str] = []
        for step in sorted(current):
            signature = current[step]
            if self._done.get(step) == signature or not self._ready(step, current):
                continue
            result = self._compute(step, signature, bad)
            if result is not None:
                stats.append((step, result))
                self._done[step] = signature
        self._seen = current
        self._done = {step: sig for step, sig in self._done.items() if step in current}
        return RolloutBatch(stats=stats, bad=bad)

    def _file(self, step: int) -> Path:
        return self._path / f"{step}.jsonl"

    def _scan(self) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self._path))
        except (FileNotFoundError, NotADirectoryError):
            return found  # the directory appears with the first dump
        for entry in entries:
            stem, dot, ext = entry.name.rpartition(".")
            if not dot or ext != "jsonl" or not (stem.isascii() and stem.isdigit()) or not valid_step(int(stem)):
                continue
            try:
                st = entry.stat()
            except OSError:  # gone, or a symlink loop
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # a FIFO or a device named like a dump is never opened
            found[int(stem)] = (st.st_size, st.st_mtime_ns)
        return found

    def _ready(self, step: int, current: dict[int, tuple[int, int]]) -> bool:
        size, mtime_ns = current[step]
        if size == 0 or not self._ends_with_newline(step, size):
            return False
        if self._seen.get(step) == current[step]:
            return True
        return any(later > step and sig[1] >= mtime_ns for later, sig in current.items())

    def _ends_with_newline(self, step: int, size: int) -> bool:
        try:
            with open_regular(self._file(step)) as handle:
                handle.seek(size - 1)
                return handle.read(1) == b"\n"
        except (FileNotFoundError, NotRegularFile):
            return False

    def _compute(self, step: int, signature: tuple[int, int], bad: list[str]) -> GroupStats | None:
        """Stats of the complete lines in the first ``signature[0]`` bytes.

        None if the file changed while being read: it is tried again next poll, and its bad lines are
        reported then (so never twice for one version of the file).
        """
        path = self._file(step)
        problems: list[str] = []
        try:
            with open_regular(path) as handle:
                result = group_stats(dump_rows(handle, signature[0], path, problems, max_line_bytes=self._max_line))
            st = path.stat()
        except (FileNotFoundError, NotRegularFile):
            return None
        if (st.st_size, st.st_mtime_ns) != signature:
            return None
        bad.extend(problems)
        return result


def read_finished(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> tuple[dict[int, dict[str, float]], list[str]]:
    """Every dump of a finished directory (nothing writes to it any more): step -> group statistics as
    metrics, and the unreadable lines. The second poll sees every dump unchanged, so all count as complete."""
    dumps = RolloutDir(path, max_line_bytes=max_line_bytes)
    stats: dict[int, dict[str, float]] = {}
    problems: list[str] = []
    for batch in (dumps.poll(), dumps.poll()):
        stats.update({step: s.as_metrics() for step, s in batch.stats})
        problems.extend(batch.bad)
    return stats, problems


def dump_rows(
    handle: BinaryIO, size: int, path: Path, problems: list[str], *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Mapping[str, object]]:
    """The JSON objects on the complete lines within the first ``size`` bytes, one at a time (a dump can be
    large: its rows are never all held, nor a line longer than ``max_line_bytes``); unreadable lines are added
    to ``problems`` as ``file:line: why``."""
    for number, line in enumerate(capped_lines(handle, size, max_line_bytes=max_line_bytes), start=1):
        if isinstance(line, OversizedLine):
            problems.append(f"{path}:{number}: line longer than {max_line_bytes} bytes, skipped")
            continue
        if not line.strip():
            continue
        try:
            row = _load_row(line)
        except (ValueError, RecursionError) as exc:
            problems.append(f"{path}:{number}: not JSON ({exc})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{path}:{number}: not a JSON object")
            continue
        yield row
