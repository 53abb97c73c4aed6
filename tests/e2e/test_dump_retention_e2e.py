"""Rollout dump retention end to end (issue 25, item 6): ``guardian run`` on the CPU trainer with a cap far below what
the run dumps. Old dumps go, the incident's neighbourhood, the abandoned branch and the recent window stay, one
``event=rollouts_pruned`` line says so, and the incident's report still shows samples from around it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from collapse_run import collapse_command

from guardian.commands.run import RunRequest, run_guarded
from guardian.config import GuardianConfig
from guardian.report.assemble import incident_report
from guardian.states import State
from guardian.store import Store

pytestmark = pytest.mark.slow

AROUND = 10
RECENT = 40  # longer than this run's detection lag (rollback point 20, detected at 50): see docs/rollouts.md


def steps_in(folder: Path) -> set[int]:
    return {int(p.stem) for p in folder.glob("*.jsonl")}


def test_old_dumps_are_pruned_and_the_incidents_are_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = GuardianConfig.model_validate(
        {
            "home": str(home),
            "sources": {"poll_interval_s": 0.05},
            "intervention": {"probation_steps": 15, "stop_sigint_s": 5, "stop_sigterm_s": 5, "stop_sigkill_s": 5},
            "report": {"context_steps": AROUND},
            # a cap no run fits (about 1 KiB): everything not kept for a reason goes
            "rollouts": {
                "keep_gib": 1e-6,
                "keep_recent_steps": RECENT,
                "keep_around_incident_steps": AROUND,
                "prune_every_steps": 5,
            },
        }
    )
    with caplog.at_level("INFO", logger="guardian"):
        assert run_guarded(config, RunRequest(tuple(collapse_command(ckpt)), tmp_path, "pruned")) == 0
    with Store.open(config.database_url()) as store:
        (iv,) = [i for i in store.interventions("pruned") if i.state != State.RELAPSED]
        detail = store.get_incident(iv.incident_id)
        assert detail is not None and iv.target_step is not None
        report = incident_report(store, iv.incident_id, config, time.time())
    assert report is not None and report.trajectories is not None and report.steps is not None
    first = home / "runs/pruned/attempt-1/rollouts"
    second = home / "runs/pruned/attempt-2/rollouts"
    old, new = steps_in(first), steps_in(second)
    removed_old = set(range(1, max(old) + 1)) - old
    removed_new = set(range(iv.target_step + 1, max(new) + 1)) - new

    # the oldest dumps went, said in one stable line per pass
    lines = [r.getMessage() for r in caplog.records if "event=rollouts_pruned" in r.getMessage()]
    assert lines and all(re.search(r" files=\d+ bytes=\d+ kept_files=\d+ kept_bytes=\d+ cap_bytes=", m) for m in lines)
    assert removed_new, sorted(new)
    # the evidence alone is over this cap: said once, with what to do
    (over,) = [r.getMessage() for r in caplog.records if "event=rollouts_over_cap" in r.getMessage()]
    assert "fix=" in over and "rollouts.keep_gib" in over
    # what the judgment needs stayed: the baseline, the incident's steps and those around them (the report's span),
    # the whole branch the rollback abandoned, the newest steps
    lo, hi = report.steps
    assert set(range(1, 6)) <= old
    assert set(range(lo, max(old) + 1)) <= old and not removed_old & set(range(lo, hi + 1))
    assert set(range(iv.target_step + 1, hi + 1)) <= new and min(removed_new) > hi
    assert set(range(max(new) - RECENT + 1, max(new) + 1)) <= new
    # so the incident's report still shows the samples around it, of both branches
    sample = report.trajectories
    assert sample.dumps == len(old & set(range(lo, hi + 1))) + len(new & set(range(lo, hi + 1)))
    assert sample.shown and {t.abandoned for t in sample.shown} == {True, False}
