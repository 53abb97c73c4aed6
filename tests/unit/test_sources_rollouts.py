"""Rollout dumps: group statistics (V1 uid, V0 input) and watching a dump directory."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from conftest import FIXTURES

from guardian.keys import (
    ALL_ONE_KEY,
    ALL_ZERO_KEY,
    EGR_KEY,
    GROUP_STD_KEY,
    GROUPS_KEY,
    REWARD_COMPONENT_PREFIX,
    SAMPLES_KEY,
)
from guardian.sources.rollouts import GroupStats, RolloutBatch, RolloutDir, group_stats

ROLLOUTS = FIXTURES / "verl-0.9.1-run" / "rollouts"

SECOND = 1_000_000_000


def v1(group: str, session: int, score: object, index: int = 0) -> dict[str, object]:
    return {"input": "p", "output": "o", "gts": "g", "score": score, "step": 1, "uid": f"{group}_{session}_{index}"}


def v0(prompt: str, score: object) -> dict[str, object]:
    return {"input": prompt, "output": "o", "gts": "g", "score": score, "step": 1}


def dump(path: Path, rows: Sequence[Mapping[str, object]], *, mtime_s: int | None = None, tail: str = "\n") -> None:
    path.write_text("\n".join(json.dumps(row) for row in rows) + tail)
    if mtime_s is not None:
        os.utime(path, ns=(mtime_s * SECOND, mtime_s * SECOND))


def steps(batch: RolloutBatch) -> list[int]:
    return [step for step, _ in batch.stats]


def test_v1_groups_by_uid_and_keeps_the_highest_index_per_session() -> None:
    rows = [
        v1("aaaa-1", 0, 0.0),
        v1("aaaa-1", 1, 0.0, index=0),
        v1("aaaa-1", 1, 1.0, index=1),  # multi-output session: the last output's score counts
        v1("bbbb-2", 0, 1.0),
        v1("bbbb-2", 1, 1.0),
        v1("cccc-3", 0, 0.0),
        v1("cccc-3", 1, 0.0),
        v1("dddd-4", 0, 0.5),  # a singleton: counted as a group, not in the fractions
    ]
    stats = group_stats(rows)
    assert (stats.groups, stats.samples, stats.skipped_rows) == (4, 7, 0)
    assert stats.effective_group_ratio == pytest.approx(1 / 3)
    assert stats.all_one_fraction == pytest.approx(1 / 3)
    assert stats.all_zero_fraction == pytest.approx(1 / 3)
    assert stats.mean_group_reward_std == pytest.approx(math.sqrt(0.5) / 3)


def test_v0_groups_by_prompt_text() -> None:
    rows = [v0("copy 1", 1.0), v0("copy 2", 0.0), v0("copy 1", 1.0), v0("copy 2", 0.5), v0("copy 3", 0.0)]
    rows.append(v0("copy 3", 1e-12))  # equal within the tolerance
    stats = group_stats(rows)
    assert (stats.groups, stats.samples) == (3, 6)
    assert stats.effective_group_ratio == pytest.approx(1 / 3)
    assert stats.all_one_fraction == pytest.approx(1 / 3)
    assert stats.all_zero_fraction == pytest.approx(1 / 3)


def test_v0_reward_extra_fields_become_component_means() -> None:
    # verl's V0 trainer dumps every field of a dict-returning reward function next to the score
    rows = [
        {**v0("q1", 1.0), "correctness": 1.0, "format": 1.0, "acc": 1.0, "pred": "Paris"},
        {**v0("q1", 0.2), "correctness": 0.0, "format": 1.0, "acc": 0.2, "pred": "Lyon"},
        {**v0("q2", 0.0), "correctness": 0.0, "format": 0.0, "flag": True, "bad": float("nan")},
    ]
    stats = group_stats(rows)
    assert stats.reward_components == pytest.approx({"correctness": 1 / 3, "format": 2 / 3})
    metrics = stats.as_metrics()
    assert metrics[REWARD_COMPONENT_PREFIX + "correctness"] == pytest.approx(1 / 3)
    assert not any(k.endswith(("/acc", "/pred", "/flag", "/bad", "/score")) for k in metrics)
    assert group_stats([v1("g", 0, 1.0), v1("g", 1, 0.0)]).reward_components == {}  # V1 dumps have none


def test_rows_without_a_usable_score_or_group_are_skipped_and_counted() -> None:
    rows: list[Mapping[str, object]] = [
        v1("g", 0, "1.0"),
        v1("g", 1, None),
        v1("g", 2, True),
        v1("g", 3, float("nan")),
        v1("g", 4, 10**400),
        {"score": 1.0},
        v1("g", 5, 1),
        v1("g", 6, 0),
    ]
    stats = group_stats(rows)
    assert (stats.groups, stats.samples, stats.skipped_rows) == (1, 2, 6)
    assert stats.effective_group_ratio == 1.0


def test_no_multi_sample_group_gives_nan_fractions_and_metrics_use_guardian_keys() -> None:
    stats = group_stats([v1("a", 0, 1.0), v1("b", 0, 0.0)])
    assert (stats.groups, stats.samples) == (2, 2)
    metrics = stats.as_metrics()
    assert set(metrics) == {EGR_KEY, ALL_ZERO_KEY, ALL_ONE_KEY, GROUP_STD_KEY, GROUPS_KEY, SAMPLES_KEY}
    assert math.isnan(metrics[EGR_KEY]) and math.isnan(metrics[GROUP_STD_KEY])
    assert metrics[GROUPS_KEY] == 2.0 and metrics[SAMPLES_KEY] == 2.0
    empty = group_stats([])
    assert (empty.groups, empty.samples) == (0, 0)
    assert math.isnan(empty.effective_group_ratio) and math.isnan(empty.all_zero_fraction)


def test_real_dumps_give_32_groups_of_4() -> None:
    source = RolloutDir(ROLLOUTS)
    seen: list[tuple[int, GroupStats]] = []
    for _ in range(3):  # unchanged files are read within two polls, then never again
        batch = source.poll()
        assert batch.bad == []
        seen.extend(batch.stats)
    assert sorted(step for step, _ in seen) == [1, 2, 5, 10]
    for _, stats in seen:
        assert (stats.groups, stats.samples, stats.skipped_rows) == (32, 128, 0)
        assert 0.0 <= stats.effective_group_ratio <= 1.0
        assert 0.0 <= stats.all_zero_fraction + stats.all_one_fraction <= 1.0 - stats.effective_group_ratio + 1e-12
        assert stats.mean_group_reward_std > 0.0
    assert source.poll() == RolloutBatch(stats=[], bad=[])


def test_missing_directory_is_not_an_error(tmp_path: Path) -> None:
    source = RolloutDir(tmp_path / "rollouts")
    assert source.poll() == RolloutBatch(stats=[], bad=[])
    (tmp_path / "rollouts").mkdir()
    dump(tmp_path / "rollouts" / "1.jsonl", [v1("a", 0, 1.0), v1("a", 1, 0.0)])
    source.poll()
    assert steps(source.poll()) == [1]


def test_a_dump_being_written_is_counted_once_when_complete(tmp_path: Path) -> None:
    source = RolloutDir(tmp_path)
    path = tmp_path / "3.jsonl"
    rows = [v1("a", 0, 1.0), v1("a", 1, 0.0), v1("b", 0, 1.0), v1("b", 1, 1.0)]
    dump(path, rows[:3], tail="\n" + json.dumps(rows[3])[:20], mtime_s=100)  # mid-line
    assert source.poll().stats == []
    assert source.poll().stats == []  # unchanged, but it does not end with a newline
    dump(path, rows, mtime_s=101)
    assert source.poll().stats == []  # just changed: maybe still being written
    batch = source.poll()
    assert steps(batch) == [3]
    assert batch.stats[0][1].samples == 4
    assert source.poll().stats == []
    assert source.poll().stats == []


def test_a_later_step_written_after_it_completes_a_dump_at_once(tmp_path: Path) -> None:
    source = RolloutDir(tmp_path)
    dump(tmp_path / "1.jsonl", [v1("a", 0, 1.0), v1("a", 1, 0.0)], mtime_s=100)
    dump(tmp_path / "2.jsonl", [v1("a", 0, 1.0)], mtime_s=101)
    assert steps(source.poll()) == [1]
    assert steps(source.poll()) == [2]


def test_stale_later_dumps_do_not_complete_a_rewritten_step(tmp_path: Path) -> None:
    source = RolloutDir(tmp_path)
    dump(tmp_path / "5.jsonl", [v1("a", 0, 1.0)], mtime_s=100)  # from an abandoned branch
    dump(tmp_path / "4.jsonl", [v1("a", 0, 1.0), v1("a", 1, 1.0)], mtime_s=200)  # replayed after resume
    assert steps(source.poll()) == []
    assert steps(source.poll()) == [4, 5]


def test_an_overwritten_dump_is_recomputed_and_an_unchanged_one_never(tmp_path: Path) -> None:
    source = RolloutDir(tmp_path)
    path = tmp_path / "7.jsonl"
    dump(path, [v1("a", 0, 1.0), v1("a", 1, 1.0)], mtime_s=100)
    source.poll()
    first = source.poll().stats
    assert [(step, s.all_one_fraction) for step, s in first] == [(7, 1.0)]
    dump(path, [v1("b", 0, 1.0), v1("b", 1, 0.0)], mtime_s=300)  # the step was replayed
    source.poll()
    second = source.poll().stats
    assert [(step, s.effective_group_ratio) for step, s in second] == [(7, 1.0)]
    for _ in range(3):
        assert source.poll().stats == []


def test_bad_lines_are_reported_with_file_and_line_and_odd_names_ignored(tmp_path: Path) -> None:
    path = tmp_path / "2.jsonl"
    path.write_text(json.dumps(v1("a", 0, 1.0)) + "\n{oops\n[1, 2]\n\n" + json.dumps(v1("a", 1, float("nan"))) + "\n")
    for name in ("latest.jsonl", "1.5.jsonl", "3.json", "-4.jsonl", "٣.jsonl"):
        (tmp_path / name).write_text(json.dumps(v1("x", 0, 1.0)) + "\n")
    source = RolloutDir(tmp_path)
    source.poll()
    batch = source.poll()
    assert steps(batch) == [2]
    stats = batch.stats[0][1]
    assert (stats.samples, stats.skipped_rows) == (1, 1)  # the NaN score (bare NaN token) is skipped
    assert len(batch.bad) == 2
    assert batch.bad[0].startswith(f"{path}:2: not JSON")
    assert batch.bad[1] == f"{path}:3: not a JSON object"
    assert source.poll() == RolloutBatch(stats=[], bad=[])


def test_an_empty_dump_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_bytes(b"")
    source = RolloutDir(tmp_path)
    source.poll()
    assert source.poll().stats == []
