from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny build shared by the tests (seed 0)."""
    from gpu import tiny

    return tiny.build(tmp_path_factory.mktemp("tiny")).root
