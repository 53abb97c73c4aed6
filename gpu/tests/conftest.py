"""The harness's CPU tests. test_bundle.py needs nothing beyond the standard library; the tiny-model, generate and
plugin tests need torch, transformers, pyarrow, Ray and verl (``make gpu-test-deps``): without them they are not
collected (the report header says so), and in CI (where .ci/run installs them) their absence is an error."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

NEEDED = ("torch", "transformers", "pyarrow", "ray", "verl")
MISSING = [name for name in NEEDED if importlib.util.find_spec(name) is None]
NEEDS_THEM = ["test_tiny.py", "test_hf_generate.py", "test_verl_plugin.py"]

if MISSING and os.environ.get("CI"):
    raise pytest.UsageError(f"gpu/tests need {', '.join(MISSING)} in CI (.ci/run installs them: make gpu-test-deps)")
collect_ignore = NEEDS_THEM if MISSING else []


def pytest_report_header(config: pytest.Config) -> str | None:
    if MISSING:
        return f"gpu/tests: {', '.join(MISSING)} not installed, so {', '.join(NEEDS_THEM)} are not collected"
    return None


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny build shared by the tests (seed 0)."""
    from gpu import tiny

    return tiny.build(tmp_path_factory.mktemp("tiny")).root
