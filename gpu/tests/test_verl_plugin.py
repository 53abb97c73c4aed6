"""Registration of the ``hf`` rollout in real verl 0.9.1 (needs verl and its import chain: see gpu/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl.workers.rollout.replica", reason="verl 0.9.1 and ray are not installed in this venv")

REPO = Path(__file__).resolve().parents[2]


def test_verl_own_hook_registers_hf_in_both_registries() -> None:
    """In a fresh interpreter, VERL_USE_EXTERNAL_MODULES alone makes verl resolve rollout name `hf`."""
    probe = (
        "import verl\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "print(get_rollout_class('hf', 'async').__qualname__, get_rollout_replica_class('hf').__qualname__)\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "gpu.verl_plugin", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["HFServerAdapter", "HFReplica"]


def test_without_the_hook_verl_does_not_know_hf() -> None:
    probe = "from verl.workers.rollout.base import get_rollout_class\nget_rollout_class('hf', 'async')\n"
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "Rollout hf with mode async not found" in out.stderr
