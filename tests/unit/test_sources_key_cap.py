"""The per-step key cap (``max_keys``) on real files: keys under ``CHECKED_PREFIXES`` count against it.

A logger writing one ``val-core/`` key per sample must not escape the memory bound the cap promises,
whether the file is tailed whole (``MetricsFile``) or replayed keeping only the checked keys.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from guardian.config import MAX_KEYS_PER_STEP
from guardian.core import StepRecord
from guardian.keys import CHECKED_KEYS
from guardian.sources.jsonl import MetricsFile, iter_records

PER_SAMPLE = 20_000
EXACT = {"actor/entropy": 0.5, "critic/score/mean": 0.25}


def val_key(i: int) -> str:
    return f"val-core/x_{i}/acc/mean@1"


def write_step(path: Path, data: dict[str, float]) -> None:
    path.write_bytes(orjson.dumps({"step": 1, "data": data}) + b"\n")


def per_sample_step(path: Path) -> None:
    """One step: the exact checked keys between 20,000 per-sample val-core keys, then three others."""
    data = {val_key(i): 0.5 for i in range(PER_SAMPLE // 2)}
    data.update(EXACT)
    data.update({val_key(i): 0.5 for i in range(PER_SAMPLE // 2, PER_SAMPLE)})
    data.update({"other/a": 1.0, "other/b": 2.0, "other/c": 3.0})
    write_step(path, data)


def only_record(source: MetricsFile) -> StepRecord:
    batch = source.poll(final=True)
    assert batch.bad_lines == []
    (record,) = [item for item in batch.items if isinstance(item, StepRecord)]
    return record


def test_the_checked_keys_are_in_the_catalogue() -> None:
    assert set(EXACT) <= CHECKED_KEYS


@pytest.mark.parametrize("max_keys", [MAX_KEYS_PER_STEP, 100])
def test_per_sample_val_core_keys_are_capped_and_the_exact_keys_kept(tmp_path: Path, max_keys: int) -> None:
    path = tmp_path / "run.jsonl"
    per_sample_step(path)
    source = MetricsFile(path, max_keys=max_keys)
    record = only_record(source)
    assert set(record.data) == set(EXACT) | {val_key(i) for i in range(max_keys)}
    assert source.capped_keys_dropped == PER_SAMPLE - max_keys + 3
    source.close()


def test_a_replay_keeping_the_checked_keys_caps_the_prefixed_ones(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    per_sample_step(path)
    ((record,), bad) = next(iter_records(path, keys=CHECKED_KEYS, max_keys=100))
    assert bad == []
    assert set(record.data) == set(EXACT) | {val_key(i) for i in range(100)}


def test_prefixed_keys_come_first_and_others_fill_the_rest_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    data = {f"per_sample/{i}": float(i) for i in range(5)}
    data.update({val_key(0): 0.1, "actor/entropy": 0.5, val_key(1): 0.2})
    data.update({f"per_sample/{i}": float(i) for i in range(5, 10)})
    write_step(path, data)
    record = only_record(MetricsFile(path, max_keys=4))
    assert list(record.data) == ["per_sample/0", "per_sample/1", val_key(0), "actor/entropy", val_key(1)]


def test_a_step_within_the_cap_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    data = {val_key(i): 0.5 for i in range(10)} | {"per_sample/0": 1.0}
    write_step(path, data)
    source = MetricsFile(path, max_keys=len(data))
    assert set(only_record(source).data) == set(data)
    assert source.capped_keys_dropped == 0
