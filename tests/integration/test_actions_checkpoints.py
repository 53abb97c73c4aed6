"""Rollback on disk: target choice, quarantine (moves + tracker rewrite), crash idempotency, restore."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from guardian.checkpoints.quarantine import QUARANTINE_DIR, list_quarantine, quarantine_after, quarantine_dumps_after
from guardian.checkpoints.restore import restore_quarantine
from guardian.checkpoints.scan import TRACKER_FILE, CheckpointError, read_tracker, scan_checkpoints
from guardian.checkpoints.target import choose_rollback_target, resume_path_for
from guardian.store.views import CheckpointView


@dataclass(frozen=True)
class Ckpt:
    step: int
    path: str
    verdict: str


def ckpts(*pairs: tuple[int, str]) -> list[Ckpt]:
    return [Ckpt(step, f"/c/global_step_{step}", verdict) for step, verdict in pairs]


SERIES = ckpts((10, "healthy"), (20, "healthy"), (30, "unhealthy"), (40, "healthy"), (50, "unhealthy"))


ON_DISK = frozenset(c.step for c in SERIES)


def choose(
    onset: int | None,
    detected: int = 55,
    margin: int = 0,
    exclude: tuple[int, ...] = (),
    skip: int = 0,
    available: frozenset[int] = ON_DISK,
) -> int | None:
    got = choose_rollback_target(
        SERIES,
        onset_step=onset,
        detected_step=detected,
        margin_steps=margin,
        exclude_steps=exclude,
        available=available,
        skip_newest=skip,
    )
    return None if got is None else got.step


def test_target_is_newest_healthy_at_or_before_onset_minus_margin() -> None:
    assert choose(onset=45) == 40
    assert choose(onset=40) == 40  # "at or before"
    assert choose(onset=45, margin=6) == 20  # 39: 30 is unhealthy, so 20
    assert choose(onset=None, detected=45) == 40  # onset unknown: detection step


def test_target_skips_unhealthy_and_excluded() -> None:
    assert choose(onset=35) == 20  # 30 unhealthy
    assert choose(onset=45, exclude=(40,)) == 20  # relapse: one further back
    assert choose(onset=45, skip=1) == 20  # rung asks for one more checkpoint back


def test_target_must_be_on_disk_or_pinned() -> None:
    """``available``: what verl can resume from, and what was pinned before verl's retention deleted it."""
    assert choose(onset=45, available=ON_DISK - {40}) == 20, "40 deleted by verl's retention, not pinned"
    assert choose(onset=45, available=frozenset({10})) == 10
    assert choose(onset=45, available=frozenset()) is None


def test_target_none_when_nothing_qualifies() -> None:
    assert choose(onset=9) is None
    assert choose(onset=45, exclude=(10, 20, 40)) is None
    none = choose_rollback_target([], onset_step=5, detected_step=5, margin_steps=0, exclude_steps=(), available={5})
    assert none is None


def test_store_checkpoint_view_fits_the_protocol() -> None:
    view = CheckpointView(1, "run", 20, "/c/global_step_20", datetime.now(UTC), "healthy", None)
    got = choose_rollback_target(
        [view], onset_step=25, detected_step=30, margin_steps=0, exclude_steps=(), available={20}
    )
    assert got is view


def test_resume_path_is_absolute_without_trailing_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resume_path_for(f"{tmp_path}/ck/global_step_50/") == f"{tmp_path}/ck/global_step_50"
    monkeypatch.chdir(tmp_path)
    assert resume_path_for(Path("ck/global_step_7")) == f"{tmp_path}/ck/global_step_7"
    for bad in ("/c/global_step_50/actor", "/c/step_50", "/c/global_step_x"):
        with pytest.raises(CheckpointError, match="global_step_"):
            resume_path_for(bad)


def make_run(root: Path, steps: tuple[int, ...] = (10, 20, 30, 40), tracker: int | None = 40) -> Path:
    """A verl-like checkpoint dir: each step with actor shards and data.pt."""
    for step in steps:
        actor = root / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "model_world_size_1_rank_0.pt").write_text(f"weights {step}")
        (root / f"global_step_{step}" / "data.pt").write_text(f"data {step}")
    if tracker is not None:
        (root / TRACKER_FILE).write_text(str(tracker))
    return root


def steps_in(root: Path) -> list[int]:
    return [c.step for c in scan_checkpoints(root)]


def test_quarantine_moves_newer_steps_and_rewrites_the_tracker(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    result = quarantine_after(root, 20, incident_id=7)
    assert steps_in(root) == [10, 20]
    assert (root / TRACKER_FILE).read_text() == "20"  # verl's format: digits, no newline
    assert (result.tracker_before, result.tracker_after) == (40, 20)
    folder = root / QUARANTINE_DIR / "incident-7"
    assert [(m.step, m.source.name, m.dest) for m in result.moved] == [
        (30, "global_step_30", folder / "global_step_30"),
        (40, "global_step_40", folder / "global_step_40"),
    ]
    assert (folder / "global_step_40" / "actor" / "model_world_size_1_rank_0.pt").read_text() == "weights 40"
    assert list_quarantine(root) == {7: [folder / "global_step_30", folder / "global_step_40"]}
    assert not list(root.glob(".*guardian-tmp"))


def test_quarantine_is_idempotent(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    quarantine_after(root, 20, incident_id=7)
    again = quarantine_after(root, 20, incident_id=7)
    assert again.moved == () and again.tracker_before == 20
    assert len(list_quarantine(root)[7]) == 2


def test_quarantine_finishes_after_a_crash_in_the_middle(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    folder = root / QUARANTINE_DIR / "incident-7"
    folder.mkdir(parents=True)
    os.rename(root / "global_step_30", folder / "global_step_30")  # the crashed call got this far
    result = quarantine_after(root, 20, incident_id=7)
    assert [m.step for m in result.moved] == [40]
    assert steps_in(root) == [10, 20] and read_tracker(root) == 20
    assert sorted(p.name for p in list_quarantine(root)[7]) == ["global_step_30", "global_step_40"]


def test_quarantine_keeps_both_when_a_name_is_already_quarantined(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    quarantine_after(root, 20, incident_id=7)
    make_run(root, steps=(30,), tracker=30)  # the relaunched branch saved step 30 again, then the same incident replays
    result = quarantine_after(root, 20, incident_id=7)
    folder = root / QUARANTINE_DIR / "incident-7"
    assert [m.dest for m in result.moved] == [folder / "global_step_30.dup1"]
    assert (folder / "global_step_30" / "data.pt").read_text() == "data 30"
    assert (folder / "global_step_30.dup1" / "data.pt").read_text() == "data 30"


def test_quarantine_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        quarantine_after(tmp_path / "missing", 20, incident_id=1)
    root = make_run(tmp_path / "run")
    with pytest.raises(CheckpointError, match="global_step_25 does not exist"):
        quarantine_after(root, 25, incident_id=1)
    assert steps_in(root) == [10, 20, 30, 40]
    (root / TRACKER_FILE).write_text("30")
    with pytest.raises(CheckpointError, match="newer than the tracker"):
        quarantine_after(root, 40, incident_id=1)
    assert quarantine_after(root, 40, incident_id=1, allow_newer_than_tracker=True).tracker_after == 40


def test_quarantine_without_a_tracker_writes_one(tmp_path: Path) -> None:
    root = make_run(tmp_path, tracker=None)
    result = quarantine_after(root, 30, incident_id=2)
    assert result.tracker_before is None and read_tracker(root) == 30


def test_restore_moves_back_and_resets_the_tracker(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    quarantine_after(root, 20, incident_id=7)
    result = restore_quarantine(root, 7)
    assert steps_in(root) == [10, 20, 30, 40]
    assert (result.tracker_before, result.tracker_after) == (20, 40) and read_tracker(root) == 40
    assert [m.step for m in result.restored] == [30, 40]
    assert result.quarantine_removed and not (root / QUARANTINE_DIR).exists()
    with pytest.raises(CheckpointError, match="nothing quarantined for incident 7"):
        restore_quarantine(root, 7)


def test_restore_refuses_to_overwrite(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    quarantine_after(root, 20, incident_id=7)
    make_run(root, steps=(40,), tracker=40)  # the new branch reached 40
    with pytest.raises(CheckpointError, match=r"global_step_40 exists"):
        restore_quarantine(root, 7)
    assert steps_in(root) == [10, 20, 40]  # nothing moved: checked before the first move
    assert (root / "global_step_40" / "data.pt").read_text() == "data 40"
    assert len(list_quarantine(root)[7]) == 2


def test_restore_leaves_duplicates_in_quarantine(tmp_path: Path) -> None:
    root = make_run(tmp_path)
    quarantine_after(root, 20, incident_id=7)
    make_run(root, steps=(30,), tracker=30)
    quarantine_after(root, 20, incident_id=7)
    result = restore_quarantine(root, 7)
    assert [p.name for p in result.left_in_quarantine] == ["global_step_30.dup1"]
    assert not result.quarantine_removed and steps_in(root) == [10, 20, 30, 40]


def test_further_back_goes_as_far_as_there_are_healthy_checkpoints() -> None:
    from dataclasses import dataclass as _dc

    @_dc(frozen=True)
    class C:
        step: int
        path: str
        verdict: str

    only = [C(10, "/c/global_step_10", "healthy")]
    chosen = choose_rollback_target(
        only, onset_step=20, detected_step=21, margin_steps=0, exclude_steps=(), available={10}, skip_newest=1
    )
    assert chosen is not None and chosen.step == 10


def test_the_abandoned_branchs_rollout_dumps_go_to_quarantine(tmp_path: Path) -> None:
    dumps = tmp_path / "rollouts"
    dumps.mkdir()
    for step in (9, 10, 11, 12):
        (dumps / f"{step}.jsonl").write_text(f'{{"step": {step}}}\n')
    (dumps / "notes.txt").write_text("the user's own file\n")
    assert quarantine_dumps_after(dumps, 10, incident_id=3) == (11, 12)
    assert sorted(p.name for p in dumps.iterdir() if p.is_file()) == ["10.jsonl", "9.jsonl", "notes.txt"]
    kept = dumps / QUARANTINE_DIR / "incident-3"
    assert (kept / "12.jsonl").read_text() == '{"step": 12}\n', "moved, never deleted"
    # the resumed run writes step 11 again; a second rollback of the same incident keeps both versions
    (dumps / "11.jsonl").write_text('{"step": 11, "branch": 2}\n')
    assert quarantine_dumps_after(dumps, 10, incident_id=3) == (11,)
    assert (kept / "11.jsonl.dup1").read_text() == '{"step": 11, "branch": 2}\n'
    assert quarantine_dumps_after(dumps, 10, incident_id=3) == () and quarantine_dumps_after(tmp_path / "x", 1, 1) == ()
