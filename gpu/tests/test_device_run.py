"""``gpu.device_run --profile``: each guardian is sampled by the py-spy on PATH, or the call says there is none."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from gpu.device_run import profile


def test_without_py_spy_on_path_no_profile_is_taken_and_it_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert profile(os.getpid(), tmp_path / "out" / "guardian-profile-1.txt") is None
    assert "py-spy is not on PATH" in capsys.readouterr().err


def test_py_spy_records_the_guardian_pid_into_the_scenario_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spy = bin_dir / "py-spy"  # stands in for py-spy: writes its argv where -o points
    spy.write_text(
        f"#!{sys.executable}\nimport sys\nargv = sys.argv[1:]\n"
        "open(argv[argv.index('-o') + 1], 'w').write(' '.join(argv))\nprint('sampling')\n"
    )
    spy.chmod(spy.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    out = tmp_path / "out" / "healthy" / "guardian-profile-4242.txt"
    process = profile(4242, out)
    assert process is not None and process.wait(timeout=30) == 0
    assert out.read_text() == f"record --pid 4242 --rate 100 --nonblocking --format raw -o {out}"
    assert "sampling" in out.with_suffix(".log").read_text()
