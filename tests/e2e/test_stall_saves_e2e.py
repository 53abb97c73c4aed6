"""``guardian run`` in enforce mode on the demo trainer (real processes, real files): a slow checkpoint save and a slow
validation, each silent for many times the median step, are not stalls - nothing is stopped or restarted - while a
real hang in an ordinary step is still caught and answered with a restart."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import orjson
import pytest

from guardian.commands.run import RunRequest, run_guarded
from guardian.config import GuardianConfig
from guardian.states import Kind
from guardian.store import Store

pytestmark = pytest.mark.slow

SLOW_S = 6.0  # each slow save and each slow validation
STALL = {
    "min_seconds": 2.5,  # an ordinary step (~0.07 s here) is a stall after this (slack for a busy machine)
    "save_seconds": 2.0,  # below SLOW_S: only the folder growing keeps the save alive
    "validation_seconds": 7.0,  # above SLOW_S: verl writes nothing while it validates
    "startup_seconds": 60.0,
}


def command(ckpt: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "guardian.demo.trainer",
        "trainer.total_training_steps=12",
        "trainer.save_freq=6",
        "trainer.test_freq=8",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={ckpt}",
        "+trainer.seed=1",
        "+trainer.fault.slow_steps=0.05",
        *extra,
    ]


def config_for(home: Path) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "mode": "enforce",
            "sources": {"poll_interval_s": 0.05},
            "checks": {"stall": STALL},
            "intervention": {"probation_steps": 3, "stop_sigint_s": 5, "stop_sigterm_s": 5, "stop_sigkill_s": 5},
        }
    )


def said(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_slow_save_and_a_slow_validation_are_not_stalls(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    slow = (f"+trainer.fault.slow_save_s={SLOW_S}", f"+trainer.fault.slow_validation_s={SLOW_S}")
    with caplog.at_level("INFO", logger="guardian"):
        assert run_guarded(config, RunRequest(tuple(command(ckpt, *slow)), tmp_path, "slow")) == 0
    with Store.open(config.database_url()) as store:
        assert store.interventions("slow") == []
        assert [i.check for i in store.list_incidents("slow")] == []
        assert len(store.attempts("slow")) == 1
    lines = [orjson.loads(x)["data"] for x in (home / "runs/slow/attempt-1/metrics.jsonl").read_bytes().splitlines()]
    median_step = statistics.median(d["timing_s/step"] for d in lines)
    saves = [d["timing_s/save_checkpoint"] for d in lines if "timing_s/save_checkpoint" in d]
    validations = [d["timing_s/testing"] for d in lines if "timing_s/testing" in d]
    # steps 6 and 12 save, 8 and 12 validate; each far longer than 5x the median step and the stall's 2.5 s floor
    assert len(saves) == 2 and len(validations) == 2
    assert min(saves + validations) >= SLOW_S > 5 * median_step
    log = said(caplog)
    assert "event=sign_of_life run=slow step=6 what=checkpoint" in log
    assert "event=incident_opened" not in log and "check=stall" not in log


def test_a_real_hang_is_still_caught_and_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    hang = ("+trainer.fault.hang_at_step=4", "+trainer.fault.transient=true")
    with caplog.at_level("INFO", logger="guardian"):
        run_guarded(config, RunRequest(tuple(command(ckpt, *hang)), tmp_path, "hang"))
    with Store.open(config.database_url()) as store:
        (stalled,) = [i for i in store.list_incidents("hang") if i.check == "stall"]
        assert stalled.opened_step == 3
        (iv,) = store.interventions("hang")
        assert iv.kind is Kind.RESTART
        assert len(store.attempts("hang")) == 2
    assert "event=startup_learned run=hang" in said(caplog)


def test_a_healthy_window_verls_retention_outruns_is_said_at_launch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    script = Path(__file__).parents[1] / "scripted_trainer.py"
    keys = ("trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.max_actor_ckpt_to_keep=2")
    argv = (sys.executable, str(script), f"trainer.default_local_dir={ckpt}", *keys)
    assert config.checkpoints.healthy_window_steps == 5
    with caplog.at_level("WARNING", logger="guardian"):
        assert run_guarded(config, RunRequest(argv, tmp_path, "window")) == 0
    (line,) = [r.getMessage() for r in caplog.records if "event=healthy_window_too_wide" in r.getMessage()]
    assert "healthy_window_steps=5 save_freq=2 max_actor_ckpt_to_keep=2" in line
    assert "set checkpoints.healthy_window_steps below 4 or raise trainer.max_actor_ckpt_to_keep" in line
