"""The checks keep per-position results on the history (smoothing, the reward's trend, grad-norm references) and
extend them step by step. At every step of real traces they must judge as a history built from scratch does."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from guardian.checks import CheckContext, build_checks, evaluate
from guardian.config import ChecksConfig
from guardian.history.timeline import RunHistory
from guardian.sources.jsonl import read_all

# collapses, spikes, NaN steps and a healthy run, a few hundred steps at most (each step rebuilds the history)
TRACES = ("aopd-1", "aopd-2", "verlnb-1", "tinyzero-exp-nan-1", "trl-rhogrpo-rho1.00-s43")


@pytest.mark.parametrize("name", TRACES)
def test_judged_step_by_step_as_from_scratch(name: str) -> None:
    config = ChecksConfig()
    rules = build_checks(config)
    records, _bad = read_all(FIXTURES / "traces" / f"{name}.jsonl")
    assert records
    live = RunHistory()
    for count, record in enumerate(records, start=1):
        live.add(record)
        fresh = RunHistory()
        for earlier in records[:count]:
            fresh.add(earlier)
        incremental = evaluate(CheckContext(live, config.baseline), rules)
        from_scratch = evaluate(CheckContext(fresh, config.baseline), rules)
        assert repr(incremental) == repr(from_scratch), f"{name}: step {record.step}"
