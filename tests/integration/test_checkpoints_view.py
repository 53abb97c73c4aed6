"""The checkpoints view (guardian/checkpoints/view.py: one read of the checkpoint dir a tick) and the verdict rule
(guardian/checkpoints/verdicts.py, pure)."""

from __future__ import annotations

from pathlib import Path

from verl_saves import retention_deletes, save

from guardian.checkpoints.pinning import pin_checkpoint
from guardian.checkpoints.verdicts import NON_FINITE_NOTE, Judged, judge
from guardian.checkpoints.view import CheckpointsView, read_checkpoints
from guardian.states import Verdict


def test_one_read_gives_the_folders_what_verl_can_resume_from_and_the_pins(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save(tmp_path, step)
    pin_checkpoint(tmp_path, 10, min_free_bytes=0)
    retention_deletes(tmp_path / "global_step_10")
    (tmp_path / "global_step_030").mkdir()  # not a name verl writes: left out
    view = read_checkpoints(tmp_path)
    assert [c.step for c in view.folders] == [10, 20, 30]
    assert view.resumable == {20, 30} and view.pinned == {10} and view.available == {10, 20, 30}
    assert view.restores(10) and not view.restores(20)
    assert [view.where(s) for s in (10, 20, 40)] == ["emptied", "present", "moved"]


def test_a_missing_checkpoint_dir_is_an_empty_view(tmp_path: Path) -> None:
    assert read_checkpoints(tmp_path / "nowhere") == CheckpointsView()


def test_the_verdict_of_a_checkpoint() -> None:
    def verdict(step: int, last: int | None, non_finite: set[int] = set(), onsets: list[int] = []) -> Judged:  # noqa: B006
        return judge(step, last_step=last, non_finite=non_finite, onsets=lambda: onsets)

    assert verdict(30, None) == verdict(30, 20) == Judged(Verdict.UNKNOWN, "")
    assert verdict(30, 30, non_finite={30}, onsets=[40]) == Judged(Verdict.UNHEALTHY, NON_FINITE_NOTE)
    assert verdict(30, 40, onsets=[30]) == Judged(Verdict.UNHEALTHY, None), "at the onset: unhealthy, note kept"
    assert verdict(20, 40, onsets=[30]) == Judged(Verdict.HEALTHY, ""), "before it: healthy, an old note cleared"


def test_the_onsets_are_read_only_when_a_verdict_needs_them() -> None:
    def unread() -> list[int]:
        raise AssertionError("read")

    assert judge(30, last_step=20, non_finite=(), onsets=unread).verdict is Verdict.UNKNOWN
    assert judge(30, last_step=40, non_finite={30}, onsets=unread).verdict is Verdict.UNHEALTHY


def test_only_the_view_and_the_moves_under_the_lock_scan_the_checkpoint_dir() -> None:
    """The guard loop, the snapshot, the pin pass and ``guardian checkpoints`` read the view; the quarantine, its
    undoing and the pins' set-aside scan the folders they are about to move."""
    root = Path(__file__).resolve().parents[2] / "guardian"
    scanning = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(f"{name}(" in path.read_text() for name in ("scan_checkpoints", "pinned_steps"))
    }
    movers = {"checkpoints/quarantine.py", "checkpoints/restore.py", "checkpoints/pinning.py"}
    assert scanning == {"checkpoints/scan.py", "checkpoints/view.py", *movers}
