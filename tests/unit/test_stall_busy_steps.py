"""Saves, validation and relaunches are not stalls: the stall check gives a step that saves or validates its own
allowance, counts its checkpoint folder or validation dump changing on disk as a sign of life, and allows a
relaunch a multiple of the first launch's start-up - while a real hang is still caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardian.actions.schedule import read_saves, retention_problem
from guardian.checks import CheckContext
from guardian.checks.signs import LifeSigns, note_footprint
from guardian.checks.stall import stall
from guardian.config import BaselineConfig, StallConfig
from guardian.core import Finding, Footprint, Severity, StepRecord, StepSchedule
from guardian.history.timeline import RunHistory
from guardian.sources.footprint import look

CFG = StallConfig(min_seconds=60.0, save_seconds=900.0, validation_seconds=3600.0)
STEP_S = 30.0
LAST = 199  # the newest step logged; step 200 is in progress
LAST_ARRIVAL = 1000.0 + STEP_S * LAST
WARN_S, CRITICAL_S = 3 * STEP_S, 5 * STEP_S  # an ordinary step's limits: 90 s, 150 s
EVERY_200 = StepSchedule(save_freq=200, test_freq=200)
GROWING = Footprint(checkpoint=(3, 1 << 30, 1))


def steady() -> RunHistory:
    """Steps 1-199 of 30 s each."""
    h = RunHistory()
    for step in range(1, LAST + 1):
        h.add(StepRecord(step, {"timing_s/step": STEP_S}), arrived_at=1000.0 + STEP_S * step)
    return h


def judged(
    silent: float,
    schedule: StepSchedule | None = None,
    signs: LifeSigns | None = None,
    first_startup_s: float | None = None,
) -> Finding:
    ctx = CheckContext(
        steady(),
        BaselineConfig(),
        now=LAST_ARRIVAL + silent,
        trainer_alive=True,
        schedule=schedule,
        life_signs=signs,
        first_startup_s=first_startup_s,
    )
    return stall(ctx, CFG)


def saving(*seen_at: float) -> LifeSigns:
    """Step 200's checkpoint folder: absent at the first look, then growing at each of ``seen_at`` (seconds after
    the last step)."""
    signs = note_footprint(LifeSigns(), LAST + 1, Footprint(), LAST_ARRIVAL + 1)
    for i, at in enumerate(seen_at):
        signs = note_footprint(signs, LAST + 1, Footprint(checkpoint=(3, (i + 1) << 30, i)), LAST_ARRIVAL + at)
    return signs


def test_a_step_that_saves_and_validates_gets_both_allowances_on_top_of_an_ordinary_steps() -> None:
    extra = CFG.save_seconds + CFG.validation_seconds
    allowed = CRITICAL_S + extra
    finding = judged(WARN_S + extra - 1, EVERY_200)
    assert finding.severity == Severity.OK
    assert finding.message == "step 200 saves a checkpoint and validates: allowed longer"
    assert finding.evidence["allowed_seconds"] == allowed
    late = judged(allowed + 1, EVERY_200)
    assert late.severity == Severity.CRITICAL
    assert late.message.endswith(f"; step 200 saves a checkpoint and validates, allowed {allowed:.0f}s of silence")


def test_an_ordinary_step_is_still_held_to_five_typical_steps() -> None:
    assert judged(CRITICAL_S + 1, StepSchedule(save_freq=200, test_freq=300)).severity == Severity.OK  # saves only
    ordinary = StepSchedule(save_freq=150, test_freq=300)
    finding = judged(CRITICAL_S + 1, ordinary)
    assert finding.severity == Severity.CRITICAL
    assert finding.message == "no new step for 151s (5.0x the typical 30s step)"


def test_validation_alone_gets_the_validation_allowance() -> None:
    only_val = StepSchedule(save_freq=0, test_freq=50)
    assert judged(WARN_S + CFG.validation_seconds - 1, only_val).severity == Severity.OK
    assert judged(CRITICAL_S + CFG.validation_seconds - 1, only_val).severity == Severity.WARN
    assert judged(CRITICAL_S + CFG.validation_seconds + 1, only_val).severity == Severity.CRITICAL


def test_the_last_step_saves_and_validates() -> None:
    last = StepSchedule(save_freq=7, test_freq=9, last_step=LAST + 1)
    assert judged(WARN_S + CFG.save_seconds + CFG.validation_seconds - 1, last).severity == Severity.OK


def test_a_growing_checkpoint_folder_keeps_a_long_save_alive_and_one_that_stopped_is_a_hang() -> None:
    save_only = StepSchedule(save_freq=200)
    allowed = CRITICAL_S + CFG.save_seconds
    long_after = allowed + 3000
    # the folder grew a minute ago: the silence counts from there
    alive = judged(long_after, save_only, saving(100, 2000, long_after - 60))
    assert alive.severity == Severity.OK and alive.evidence["seconds_since_sign_of_life"] == 60
    # it stopped growing long ago: a hang in the save
    hung = judged(long_after, save_only, saving(100, 2000))
    assert hung.severity == Severity.CRITICAL
    assert "its files last changed" in hung.message


def test_a_folder_seen_growing_makes_a_save_step_when_the_schedule_is_not_known() -> None:
    assert judged(CRITICAL_S + 100, None, saving(CRITICAL_S + 50)).severity == Severity.OK
    assert judged(CRITICAL_S + 100, None, None).severity == Severity.CRITICAL


def test_a_folder_an_abandoned_branch_left_is_no_sign_of_life() -> None:
    stale = note_footprint(LifeSigns(), LAST + 1, GROWING, LAST_ARRIVAL + 1)
    stale = note_footprint(stale, LAST + 1, GROWING, LAST_ARRIVAL + 100)
    assert stale.saved_at is None
    assert judged(CRITICAL_S + 1, None, stale).severity == Severity.CRITICAL


def test_life_signs_start_over_with_each_step() -> None:
    signs = saving(10, 20)
    assert signs.saved_at == LAST_ARRIVAL + 20 and signs.latest_at(LAST + 1) == LAST_ARRIVAL + 20
    nxt = note_footprint(signs, LAST + 2, GROWING, LAST_ARRIVAL + 30)
    assert nxt == LifeSigns(LAST + 2, GROWING) and nxt.latest_at(LAST + 2) is None
    # signs of another step count for nothing
    assert judged(CRITICAL_S + 1, None, nxt).severity == Severity.CRITICAL
    dumped = note_footprint(nxt, LAST + 2, Footprint(GROWING.checkpoint, (1, 10, 5)), LAST_ARRIVAL + 40)
    assert dumped.dumped_at == LAST_ARRIVAL + 40 and dumped.saved_at is None


def test_a_relaunch_may_take_a_multiple_of_the_first_launchs_start_up() -> None:
    def startup(waited: float, first: float | None) -> Finding:
        ctx = CheckContext(
            RunHistory(), BaselineConfig(), now=waited, started_at=0.0, trainer_alive=True, first_startup_s=first
        )
        return stall(ctx, StallConfig(startup_seconds=3600.0, startup_learned_factor=3.0))

    assert startup(4000.0, None).severity == Severity.CRITICAL
    assert startup(4000.0, 1500.0).severity == Severity.OK  # 3 x 1500 s
    late = startup(4600.0, 1500.0)
    assert late.severity == Severity.CRITICAL and late.evidence["startup_allowance_seconds"] == 4500
    assert startup(3000.0, 10.0).severity == Severity.OK, "never below startup_seconds"


def test_a_look_at_disk_sees_a_folder_grow_and_a_dump_appear(tmp_path: Path) -> None:
    ckpt, val = tmp_path / "ckpt", tmp_path / "val"
    assert look(ckpt, val, 200) == Footprint()
    actor = ckpt / "global_step_200" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_8_rank_0.pt").write_bytes(bytes(100))
    first = look(ckpt, val, 200)
    assert first.checkpoint is not None and first.checkpoint[:2] == (1, 100) and first.dump is None
    with open(actor / "model_world_size_8_rank_0.pt", "ab") as shard:
        shard.write(bytes(50))
    second = look(ckpt, val, 200)
    assert second.checkpoint is not None and second.checkpoint[:2] == (1, 150)
    val.mkdir()
    (val / "200.jsonl").write_text('{"input": "x"}\n')
    assert look(ckpt, val, 200).dump is not None
    assert look(None, None, 200) == Footprint()


def test_the_saves_are_read_from_the_launchs_effective_config(tmp_path: Path) -> None:
    argv = [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        "trainer.save_freq=200",
        "trainer.test_freq=100",
        "trainer.max_actor_ckpt_to_keep=2",
        "trainer.total_training_steps=1000",
        "trainer.validation_data_dir=val",
    ]
    saves = read_saves(argv, tmp_path)
    assert saves.schedule == StepSchedule(save_freq=200, test_freq=100, last_step=1000)
    assert saves.keep == 2 and saves.validation_dir == tmp_path / "val"
    defaults = read_saves(["python3", "-m", "verl.trainer.main_ppo"], tmp_path)
    assert defaults.schedule == StepSchedule(save_freq=-1, test_freq=-1) and defaults.keep is None
    assert not defaults.schedule.saves(200) and defaults.validation_dir is None


@pytest.mark.parametrize(
    ("window", "save_freq", "keep", "fits"),
    [
        (5, 10, 2, True),
        (19, 10, 2, True),
        (20, 10, 2, False),
        (30, 10, 1, False),
        (5, 2, 2, False),
        (50, 10, None, True),
    ],
)
def test_the_healthy_window_must_end_before_verls_retention_deletes_the_checkpoint(
    window: int, save_freq: int, keep: int | None, fits: bool
) -> None:
    problem = retention_problem(window, save_freq, keep)
    assert (problem is None) == fits
    if problem is not None:
        for named in (
            f"checkpoints.healthy_window_steps={window}",
            f"trainer.save_freq={save_freq}",
            f"trainer.max_actor_ckpt_to_keep={keep}",
        ):
            assert named in problem
