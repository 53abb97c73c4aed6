"""Replay and watch on a run too short or without a reward: "not enough data", never "healthy" (the rule itself:
tests/unit/test_decision_policy.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardian.cli import main
from guardian.exits import EXIT_OK, EXIT_TOO_LITTLE

R = "critic/score/mean"


def _write(path: Path, rows: list[dict[str, float]]) -> Path:
    path.write_text("".join(json.dumps({"step": i, "data": row}) + "\n" for i, row in enumerate(rows, 1)))
    return path


def test_replay_and_watch_say_not_enough_data_instead_of_healthy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    short = _write(tmp_path / "short.jsonl", [{"actor/entropy": 1.0, R: 0.2}] * 4)
    assert main(["--log-level", "ERROR", "replay", str(short)]) == EXIT_TOO_LITTLE
    assert "NOT ENOUGH DATA (not enough data: 4 steps (the checks need 10))" in capsys.readouterr().out
    no_reward = _write(tmp_path / "no-reward.jsonl", [{"actor/entropy": 1.0}] * 30)
    assert main(["--log-level", "ERROR", "replay", "--json", str(no_reward)]) == EXIT_TOO_LITTLE
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "not_enough_data" and document["too_little"].endswith("no reward signal")
    argv = ["--log-level", "ERROR", "watch", "--metrics", str(short), "--no-live", "--max-ticks", "3"]
    assert main(argv) == EXIT_TOO_LITTLE
    assert "verdict: NOT ENOUGH DATA" in capsys.readouterr().out
    enough = _write(tmp_path / "enough.jsonl", [{"actor/entropy": 1.0, R: 0.2 + 0.01 * i} for i in range(30)])
    assert main(["--log-level", "ERROR", "replay", str(enough)]) == EXIT_OK
