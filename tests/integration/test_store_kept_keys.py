"""What the store keeps of a metrics line: the keys the checks read (``keys.is_checked_key``), not every key.

A run stored the new way reads back as one stored with every key (the old way, and every store written before):
the report's plots and cost, the checklist's rebuilt timeline and the exporter's latest step are the same.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from guardian.config import GuardianConfig
from guardian.core import StepRecord
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import replay_file
from guardian.incidents.tick import IncidentTick
from guardian.keys import CHECKED_KEYS, VAL_CORE_PREFIX, checked_values, is_checked_key, signals_present
from guardian.report.assemble import run_report
from guardian.review.cost import step_times
from guardian.review.facts import rebuilt_history
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store

NOW = 1_700_000_000.0
STEPS = 40


def _data(step: int) -> dict[str, float | None]:
    data: dict[str, float | None] = {
        "actor/entropy": 0.6 - 0.002 * step,
        "actor/kl_loss": 0.001 * step,
        "critic/score/mean": 0.3 + 0.005 * step,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "response_length/mean": 500.0 + step,
        "actor/grad_norm": None if step == 30 else 0.3,  # verl's NaN
        "timing_s/step": 60.0,
        f"{VAL_CORE_PREFIX}gsm8k/reward/mean@1": 0.5 + 0.001 * step,
    }
    data.update({f"perf/filler_{i:03d}": float(i) for i in range(200)})  # read by no check
    return data


def _write_file(path: Path) -> None:
    path.write_bytes(b"".join(orjson.dumps({"step": s, "data": _data(s)}) + b"\n" for s in range(1, STEPS + 1)))


def _register(store: Store, run_id: str, metrics: Path) -> None:
    store.ensure_run(
        run_id, name=run_id, metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="observe", now=NOW
    )


def _series(history: RunHistory) -> dict[str, tuple[list[int], list[float]]]:
    return {
        s.value: (series.steps, [v if math.isfinite(v) else -1.0 for v in series.values])
        for s, series in history.series.items()
    }


def _stored_both_ways(tmp_path: Path) -> tuple[GuardianConfig, Store]:
    metrics = tmp_path / "metrics.jsonl"
    _write_file(metrics)
    config = GuardianConfig(home=tmp_path / "home")
    store = Store.open(config.database_url())
    _register(store, "new", metrics)
    guardian = IncidentTick(config=config, store=store, run_id="new", metrics=MetricsFile(metrics), clock=lambda: NOW)
    while guardian.tick().new_steps:
        pass
    _register(store, "old", metrics)  # every key of every step, as the store kept them before
    attempt = store.start_attempt("old", metrics_path=str(metrics), now=NOW)
    records = [
        StepRecord(s, {k: math.nan if v is None else v for k, v in _data(s).items()}) for s in range(1, STEPS + 1)
    ]
    store.write_steps("old", attempt.id, 0, records, NOW)
    return config, store


def test_the_store_keeps_the_checked_keys_of_a_line_and_nothing_else(tmp_path: Path) -> None:
    _config, store = _stored_both_ways(tmp_path)
    with store:
        latest = store.latest_step("new")
        assert latest is not None and latest[0] == STEPS
        assert set(latest[1]) == {k for k in _data(STEPS) if is_checked_key(k)}
        assert not any(k.startswith("perf/filler_") for k in latest[1])
        old = store.latest_step("old")
        assert old is not None and len(old[1]) == len(_data(STEPS))
        (nan_step,) = [r for r in store.active_records("new") if r.step == 30]
        assert math.isnan(nan_step.data["actor/grad_norm"])  # a non-finite value is kept as it was


def test_a_run_stored_the_new_way_reads_back_as_one_stored_with_every_key(tmp_path: Path) -> None:
    config, store = _stored_both_ways(tmp_path)
    with store:
        new, old = run_report(store, "new", config, NOW + 60), run_report(store, "old", config, NOW + 60)
        assert new is not None and old is not None
        assert new.plots == old.plots and new.steps == old.steps == (1, STEPS)
        assert any(p.finite for p in new.plots)
        assert new.cost.rate == old.cost.rate and step_times(store, "new") == step_times(store, "old")
        runs = {r.id: r for r in store.list_runs()}
        rebuilt_new, rebuilt_old = (rebuilt_history(store, runs[r], config) for r in ("new", "old"))
        assert _series(rebuilt_new) == _series(rebuilt_old)
        assert rebuilt_new.non_finite == rebuilt_old.non_finite == {30: frozenset({"actor/grad_norm"})}
        assert signals_present(frozenset(rebuilt_new.keys_seen)) == signals_present(frozenset(rebuilt_old.keys_seen))


def test_checked_values_keeps_exact_and_prefixed_keys_in_order() -> None:
    data = {"perf/x": 1.0, "actor/entropy": 0.5, f"{VAL_CORE_PREFIX}a/b/mean@1": 0.2, "timing_s/gen": 3.0}
    assert list(checked_values(data)) == ["actor/entropy", f"{VAL_CORE_PREFIX}a/b/mean@1"]
    assert "actor/entropy" in CHECKED_KEYS and not is_checked_key("perf/x")


def test_guardian_watch_reads_the_checked_keys_of_a_line_as_a_replay_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The live source parses the keys the checks read, as ``replay_file`` does: a line over the key cap with
    keys no check reads is no longer reported as capped (nothing the guardian keeps was dropped)."""
    from guardian.cli import main

    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    metrics = tmp_path / "metrics.jsonl"
    # a logger gone wrong: more keys than sources.max_keys_per_step (5,000), none of them read by a check
    wide = {f"perf/per_sample_{i:05d}": 1.0 for i in range(5_010)}
    metrics.write_bytes(
        b"".join(orjson.dumps({"step": s, "data": {**_data(s), **wide}}) + b"\n" for s in range(1, STEPS + 1))
    )
    replayed = replay_file(metrics, GuardianConfig().checks)
    code = main(["watch", "--metrics", str(metrics), "--no-follow", "--no-live", "--run-id", "wide"])
    assert code == (0 if replayed.verdict == "healthy" else 3)
    said = capsys.readouterr()
    assert "event=signals" in said.err and "metrics_keys_dropped" not in said.err
    with Store.open(GuardianConfig(home=tmp_path / "home").database_url()) as store:
        latest = store.latest_step("wide")
    assert latest is not None and set(latest[1]) == {k for k in _data(STEPS) if is_checked_key(k)}
