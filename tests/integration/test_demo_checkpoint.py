"""Checkpoints in verl's layout and verl's resume semantics, traps included (facts §3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guardian.checkpoints.scan import read_tracker, scan_checkpoints
from guardian.demo import trainer
from guardian.demo.checkpoint import load_arrays

ACTOR = "actor_rollout_ref.actor"


class Run:
    """In-process demo runs sharing one checkpoint folder, each with its own metrics file."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.ckpt = root / "ckpt"
        self.monkeypatch = monkeypatch
        self.launches = 0
        monkeypatch.chdir(root)

    def __call__(self, *overrides: str) -> list[dict[str, Any]]:
        self.launches += 1
        metrics = self.root / f"metrics-{self.launches}.jsonl"
        self.monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))
        argv = [
            "trainer.logger=[file]",
            f"trainer.default_local_dir={self.ckpt}",
            "trainer.total_epochs=1000",
            *overrides,
        ]
        assert trainer.main(argv) == 0
        return [json.loads(line) for line in metrics.read_text().splitlines()]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    return Run(tmp_path, monkeypatch)


def lrs(records: list[dict[str, Any]]) -> set[float]:
    return {r["data"]["actor/lr"] for r in records if "actor/lr" in r["data"]}


def test_layout_and_tracker(run: Run) -> None:
    run("trainer.total_training_steps=6", "trainer.save_freq=4")
    assert sorted(p.name for p in run.ckpt.iterdir()) == [
        "global_step_4",
        "global_step_6",
        "latest_checkpointed_iteration.txt",
    ], "every save_freq steps and at the last step"
    assert (run.ckpt / "latest_checkpointed_iteration.txt").read_bytes() == b"6"
    actor = run.ckpt / "global_step_6" / "actor"
    assert sorted(p.name for p in actor.iterdir()) == [
        "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json",
        "huggingface",
        "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt",
    ]
    assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 1, "world_size": 1}
    assert (run.ckpt / "global_step_6" / "data.pt").is_file()
    assert set(load_arrays(str(actor / "model_world_size_1_rank_0.pt"))) == {"shared", "table"}
    assert not list(run.ckpt.rglob("*.tmp-*")), "files are written to a temporary name, then renamed"
    assert read_tracker(run.ckpt) == 6
    assert [c.step for c in scan_checkpoints(run.ckpt)] == [4, 6], "the guardian's reader sees the same"


def test_save_contents_limits_what_is_written(run: Run) -> None:
    run("trainer.total_training_steps=2", "trainer.save_freq=2", f"{ACTOR}.checkpoint.save_contents=[model]")
    names = {p.name for p in (run.ckpt / "global_step_2" / "actor").iterdir()}
    assert "model_world_size_1_rank_0.pt" in names
    assert "optim_world_size_1_rank_0.pt" not in names and "extra_state_world_size_1_rank_0.pt" not in names


def test_resume_continues_the_same_trajectory(run: Run) -> None:
    straight = run("trainer.total_training_steps=8", "trainer.resume_mode=disable", "trainer.save_freq=4")
    resumed = run(
        "trainer.total_training_steps=8",
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=ckpt/global_step_4",
    )
    assert resumed[0]["step"] == 4 and "actor/lr" not in resumed[0]["data"], "validation-before-train at step N"
    assert [r["step"] for r in resumed[1:]] == [5, 6, 7, 8], "training continues at N+1"
    by_step = {r["step"]: r["data"] for r in straight}
    for record in resumed[1:]:
        assert record["data"]["critic/score/mean"] == by_step[record["step"]]["critic/score/mean"]
        assert record["data"]["actor/entropy"] == pytest.approx(by_step[record["step"]]["actor/entropy"])


def test_lr_trap_and_load_contents(run: Run) -> None:
    run("trainer.total_training_steps=4", "trainer.save_freq=4", f"{ACTOR}.optim.lr=5e-5")
    common = ("trainer.total_training_steps=6", "trainer.val_before_train=false", f"{ACTOR}.optim.lr=1e-6")
    trapped = run(*common, "trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_4")
    assert lrs(trapped) == {5e-5}, "optimizer and scheduler state bring the old LR back"
    fresh = run(
        *common,
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=ckpt/global_step_4",
        f"{ACTOR}.checkpoint.load_contents=[model]",
    )
    assert lrs(fresh) == {1e-6}, "without optimizer/extra the patched LR takes effect"
    assert fresh[0]["step"] == 5, "val_before_train=false: the first line is the first trained step"
    half = run(
        *common,
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=ckpt/global_step_4",
        f"{ACTOR}.checkpoint.load_contents=[model,optimizer]",
    )
    assert lrs(half) == {1e-6}, "a fresh scheduler's base LR is what actor/lr reports after its step"


def test_auto_resume_follows_the_tracker_only(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    run("trainer.total_training_steps=4", "trainer.save_freq=2")
    capsys.readouterr()
    assert run("trainer.total_training_steps=6")[0]["step"] == 4
    assert "Found checkpoint: %s" in capsys.readouterr().out, "verl's print, format string and all"
    (run.ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    assert run("trainer.total_training_steps=6", "trainer.save_freq=-1")[0]["step"] == 2, "not the newest folder"
    (run.ckpt / "latest_checkpointed_iteration.txt").write_text("40")
    assert run("trainer.total_training_steps=3")[0]["step"] == 0, "a tracker pointing nowhere: silently from scratch"
    assert "Checkpoint does not exist" in capsys.readouterr().out
    (run.ckpt / "latest_checkpointed_iteration.txt").unlink()
    assert run("trainer.total_training_steps=3")[0]["step"] == 0
    assert "Training from scratch" in capsys.readouterr().out


def test_resume_path_rules(run: Run) -> None:
    run("trainer.total_training_steps=2", "trainer.save_freq=2")
    with pytest.raises(ValueError, match="invalid literal"):
        run("trainer.resume_mode=resume_path", f"trainer.resume_from_path={run.ckpt}/global_step_2/")
    with pytest.raises(AssertionError, match="global_steps"):
        run("trainer.resume_mode=resume_path", f"trainer.resume_from_path={run.ckpt}")
    with pytest.raises(FileNotFoundError):
        run("trainer.resume_mode=resume_path", f"trainer.resume_from_path={run.ckpt}/global_step_9")


def test_retention_forgets_earlier_processes_and_keeps_data(run: Run) -> None:
    run("trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.resume_mode=disable")
    run(
        "trainer.total_training_steps=12",
        "trainer.save_freq=2",
        "trainer.max_actor_ckpt_to_keep=2",
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=ckpt/global_step_4",
    )
    with_actor = sorted(int(p.parent.name.split("_")[-1]) for p in run.ckpt.glob("global_step_*/actor"))
    assert with_actor == [2, 4, 10, 12], "the first process's 2 and 4 survive; this process keeps its last 2"
    for step in (6, 8):
        folder = run.ckpt / f"global_step_{step}"
        assert (folder / "data.pt").is_file() and not (folder / "actor").exists(), "only actor/ is deleted"


def test_resume_restores_rng_and_data_order(run: Run) -> None:
    run("trainer.total_training_steps=3", "trainer.save_freq=3")
    data = load_arrays(str(run.ckpt / "global_step_3" / "data.pt"))
    assert int(data["position"]) == 48 and data["order"].size == 48, "3 batches of 16: the epoch is consumed"
    extra = load_arrays(str(run.ckpt / "global_step_3" / "actor" / "extra_state_world_size_1_rank_0.pt"))
    assert set(extra) == {"lr_scheduler", "rng"}
    assert np.asarray(extra["rng"]).dtype.kind == "U", "numpy archive, no pickles"
