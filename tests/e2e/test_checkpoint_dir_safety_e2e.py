"""The checkpoint dir as someone else may have left it, end to end (hard-edges-2026-12, C4): a collapse beside
step folders whose names verl does not write is rolled back and resolved under ``guardian run`` on the demo trainer,
the odd folders left alone. The refusals and scans themselves: tests/integration/test_checkpoint_dir_safety.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from collapse_run import collapse_command, config_for

from guardian.checkpoints.scan import read_tracker
from guardian.commands.run import RunRequest, run_guarded
from guardian.states import State
from guardian.store import Store

ODD_NAMES = ("global_step_0300", "global_step_\u0663\u0660\u0660")  # names verl does not write


@pytest.mark.slow
def test_c4_a_collapse_beside_non_canonical_folders_is_rolled_back_and_resolved(tmp_path: Path) -> None:
    """The red-team repro: ``global_step_0300`` (and Unicode digits) in the checkpoint dir used to kill every
    rollback (FileNotFoundError x5, guardian_cannot_continue, the trainer left stopped)."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    for name in ODD_NAMES:
        (ckpt / name / "actor").mkdir(parents=True)
    config = config_for(home)
    assert run_guarded(config, RunRequest(tuple(collapse_command(ckpt)), tmp_path, "odd2")) == 0
    with Store.open(config.database_url()) as store:
        (iv,) = store.interventions("odd2")
    assert iv.state == State.RESOLVED and iv.target_step is not None
    assert read_tracker(ckpt) is not None and (ckpt / f"global_step_{read_tracker(ckpt)}").is_dir()
    assert all((ckpt / name / "actor").is_dir() for name in ODD_NAMES)  # not the guardian's: left alone
