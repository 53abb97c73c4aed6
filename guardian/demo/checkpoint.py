"""Checkpoints in verl 0.9.1's FSDP layout, with verl's resume and retention semantics (facts §3).

``global_step_N/`` holds ``data.pt`` and ``actor/`` (model, optim, extra state, ``fsdp_config.json``,
``huggingface/config.json``); the ``.pt`` files are numpy ``.npz`` archives. Every file is written to a temporary
name and renamed; the tracker ``latest_checkpointed_iteration.txt`` last. verl's traps are kept (``auto`` trusts
only the tracker; ``resume_path`` parses the step after ``global_step_``, so a trailing slash raises; retention
deletes only this process's saves, ``actor/`` only). Layout: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

TRACKER = "latest_checkpointed_iteration.txt"
WORLD = "world_size_1_rank_0"
MODEL_FILE = f"model_{WORLD}.pt"
OPTIM_FILE = f"optim_{WORLD}.pt"
EXTRA_FILE = f"extra_state_{WORLD}.pt"

Arrays = Mapping[str, NDArray[Any]]


def _atomic_bytes(path: str, payload: bytes) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(payload)
    os.replace(temporary, path)


def save_arrays(path: str, arrays: Arrays) -> None:
    """A numpy archive under ``path`` (any name, e.g. ``*.pt``), written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **dict(arrays))  # type: ignore[arg-type]
    _atomic_bytes(path, buffer.getvalue())


def load_arrays(path: str) -> dict[str, NDArray[Any]]:
    with np.load(path, allow_pickle=False) as archive:
        return {name: np.array(archive[name]) for name in archive.files}


def pack_json(value: object) -> NDArray[Any]:
    """A JSON-able value (RNG state with big ints, scheduler state) as a 0-d string array."""
    return np.array(json.dumps(value))


def unpack_json(array: NDArray[Any]) -> Any:
    return json.loads(str(array))


def tracker_path(root: str) -> str:
    return os.path.join(root, TRACKER)


class CheckpointManager:
    """Writes checkpoints and enforces ``max_actor_ckpt_to_keep`` over *this process's* saves."""

    def __init__(self, root: str, max_to_keep: int | None) -> None:
        self.root = root
        self.max_to_keep = max_to_keep
        self.previous_saved_paths: list[str] = []

    def _remove(self, paths: list[str]) -> None:
        for path in paths:
            absolute = os.path.abspath(path)
            print(f"Checkpoint manager remove previous save local path: {absolute}", flush=True)
            if os.path.exists(absolute):
                shutil.rmtree(absolute, ignore_errors=True)

    def _ensure_capacity(self) -> None:
        keep = self.max_to_keep
        if not (keep and keep > 1) or len(self.previous_saved_paths) < keep:
            return
        start = len(self.previous_saved_paths) - keep + 1
        self._remove(self.previous_saved_paths[:start])
        self.previous_saved_paths = self.previous_saved_paths[start:]

    def _register(self, path: str) -> None:
        self.previous_saved_paths.append(path)
        keep = self.max_to_keep
        if not (keep and keep > 0) or len(self.previous_saved_paths) <= keep:
            return
        start = len(self.previous_saved_paths) - keep
        self._remove(self.previous_saved_paths[:start])
        self.previous_saved_paths = self.previous_saved_paths[start:]

    def save(
        self,
        step: int,
        contents: tuple[str, ...],
        actor: Mapping[str, Arrays],
        data_state: Arrays,
        hf_config: Mapping[str, object],
    ) -> str:
        """Save step ``step``: ``actor`` maps content names (model/optimizer/extra) to arrays."""
        folder = os.path.join(self.root, f"global_step_{step}")
        print(f"Saving checkpoint to {folder}", flush=True)
        actor_dir = os.path.join(folder, "actor")
        self._ensure_capacity()
        os.makedirs(os.path.join(actor_dir, "huggingface"), exist_ok=True)
        for name, filename in (("model", MODEL_FILE), ("optimizer", OPTIM_FILE), ("extra", EXTRA_FILE)):
            if name in contents:
                save_arrays(os.path.join(actor_dir, filename), actor[name])
        fsdp = json.dumps({"FSDP_version": 1, "world_size": 1}, indent=4)
        _atomic_bytes(os.path.join(actor_dir, "fsdp_config.json"), fsdp.encode())
        hf_dir = os.path.join(actor_dir, "huggingface")
        _atomic_bytes(os.path.join(hf_dir, "config.json"), json.dumps(hf_config, indent=2).encode())
        if "hf_model" in contents:
            save_arrays(os.path.join(hf_dir, "model.npz"), actor["model"])
        self._register(actor_dir)
        save_arrays(os.path.join(folder, "data.pt"), data_state)
        _atomic_bytes(tracker_path(self.root), str(step).encode())
        return folder


def find_latest(root: str) -> str | None:
    """verl's ``find_latest_ckpt_path``: follow the tracker; None (with verl's prints) if it leads nowhere."""
    tracker = tracker_path(root)
    if not os.path.exists(tracker):
        print(f"Checkpoint tracker file does not exist: {tracker}", flush=True)
        return None
    with open(tracker, "rb") as handle:
        iteration = int(handle.read().decode())
    folder = os.path.join(root, f"global_step_{iteration}")
    if not os.path.exists(folder):
        print("Checkpoint does not exist: %s", folder, flush=True)
        return None
    print("Found checkpoint: %s", folder, flush=True)
    return folder


def resume_folder(mode: str, default_local_dir: str, resume_from_path: object) -> str | None:
    """The ``global_step_N`` folder to resume from, or None to train from scratch (verl V1 rules)."""
    if mode == "disable":
        return None
    if mode == "auto":
        root = default_local_dir if os.path.isabs(default_local_dir) else os.path.join(os.getcwd(), default_local_dir)
        folder = find_latest(root)
        if folder is None:
            print("Training from scratch", flush=True)
        return folder
    assert isinstance(resume_from_path, str), "resume ckpt must be str type"
    assert "global_step_" in resume_from_path, "resume ckpt must specify the global_steps"
    return resume_from_path if os.path.isabs(resume_from_path) else os.path.join(os.getcwd(), resume_from_path)


def step_of(folder: str) -> int:
    """verl's ``int(global_step_folder.split("global_step_")[-1])``: a trailing slash raises ValueError."""
    return int(folder.split("global_step_")[-1])


def load_actor(folder: str, contents: tuple[str, ...]) -> dict[str, dict[str, NDArray[Any]]]:
    """The actor files named by ``load_contents``; a missing one raises FileNotFoundError, as in verl."""
    actor_dir = os.path.join(folder, "actor")
    loaded: dict[str, dict[str, NDArray[Any]]] = {}
    for name, filename in (("model", MODEL_FILE), ("optimizer", OPTIM_FILE), ("extra", EXTRA_FILE)):
        if name in contents:
            loaded[name] = load_arrays(os.path.join(actor_dir, filename))
            print(f"Loaded {name} from {os.path.join(actor_dir, filename)}", flush=True)
    return loaded


def load_data_state(folder: str) -> dict[str, NDArray[Any]] | None:
    path = os.path.join(folder, "data.pt")
    if not os.path.exists(path):
        print(f"Warning: No dataloader state found at {path}, will start from scratch", flush=True)
        return None
    return load_arrays(path)
