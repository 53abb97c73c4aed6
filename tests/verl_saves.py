"""verl-like checkpoint folders for the tests of every tier: a ``global_step_N`` as verl saves it and what verl's
retention leaves of it."""

from __future__ import annotations

import shutil
from pathlib import Path

WEIGHTS = b"w" * 4096


def save(root: Path, step: int) -> Path:
    """A verl-like ``global_step_N``: actor shards, an HF config folder, an empty folder, a symlink, data.pt."""
    folder = root / f"global_step_{step}"
    (folder / "actor" / "huggingface").mkdir(parents=True)
    (folder / "actor" / "model_world_size_1_rank_0.pt").write_bytes(WEIGHTS + str(step).encode())
    (folder / "actor" / "optim_world_size_1_rank_0.pt").write_bytes(b"o" * 1000)
    (folder / "actor" / "huggingface" / "config.json").write_text(f'{{"step": {step}}}')
    (folder / "actor" / "empty").mkdir()
    (folder / "actor" / "latest.pt").symlink_to("model_world_size_1_rank_0.pt")
    (folder / "data.pt").write_bytes(b"d" * 100)
    return folder


def retention_deletes(folder: Path) -> None:
    """What verl's max_actor_ckpt_to_keep does to an old save: global_step_N/actor goes, data.pt stays."""
    shutil.rmtree(folder / "actor")
