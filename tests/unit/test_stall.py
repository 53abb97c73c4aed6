"""The stall check reads silence against what is known of the trainer process (CheckContext.trainer_alive)."""

from __future__ import annotations

import pytest

from guardian.checks import CheckContext
from guardian.checks.stall import stall
from guardian.config import BaselineConfig, StallConfig
from guardian.core import Severity, StepRecord
from guardian.history.timeline import RunHistory

CFG = StallConfig()
LAST_ARRIVAL = 1000.0 + 30 * 10


def steady(step_seconds: float = 30.0) -> RunHistory:
    """Ten steps of ``step_seconds`` each, the last arriving at ``LAST_ARRIVAL``."""
    h = RunHistory()
    for step in range(1, 11):
        h.add(StepRecord(step, {"timing_s/step": step_seconds}), arrived_at=1000.0 + 30 * step)
    return h


def judged(h: RunHistory, now: float, alive: bool | None, started_at: float | None = None) -> tuple[Severity, str]:
    finding = stall(CheckContext(h, BaselineConfig(), now=now, started_at=started_at, trainer_alive=alive), CFG)
    return finding.severity, finding.message


@pytest.mark.parametrize("alive", [True, None])
def test_silence_below_the_critical_limit_reads_the_same_whatever_is_known(alive: bool | None) -> None:
    assert judged(steady(), LAST_ARRIVAL + 60, alive)[0] == Severity.OK
    assert judged(steady(), LAST_ARRIVAL + 100, alive)[0] == Severity.WARN


def test_a_running_trainer_that_stops_logging_is_a_critical_stall() -> None:
    severity, message = judged(steady(), LAST_ARRIVAL + 151, alive=True)
    assert severity == Severity.CRITICAL
    assert message == "no new step for 151s (5.0x the typical 30s step)"


def test_silence_with_no_trainer_to_ask_is_a_warning_that_says_what_it_suspects() -> None:
    severity, message = judged(steady(), LAST_ARRIVAL + 312, alive=None)
    assert severity == Severity.WARN
    assert message == (
        "no new step for 312s (10.4x the typical 30s step); no trainer process to check (pass --pid): "
        "the run may have finished, crashed or hung"
    )


def test_an_exited_trainer_is_not_a_stall() -> None:
    severity, message = judged(steady(), LAST_ARRIVAL + 5000, alive=False)
    assert severity == Severity.UNKNOWN  # neither trouble nor a recovery: the watch loop decides the run is over
    assert "exited" in message
    assert judged(RunHistory(), 9000.0, alive=False, started_at=0.0)[0] == Severity.UNKNOWN


def test_no_first_step_is_critical_only_while_a_trainer_is_known_to_run() -> None:
    empty = RunHistory()
    assert judged(empty, 100.0, alive=True, started_at=0.0)[0] == Severity.OK
    assert judged(empty, 4000.0, alive=True, started_at=0.0)[0] == Severity.CRITICAL
    severity, message = judged(empty, 4000.0, alive=None, started_at=0.0)
    assert severity == Severity.WARN
    assert "no trainer process to check (pass --pid)" in message


def test_the_evidence_says_what_was_known_of_the_trainer() -> None:
    h = steady()
    for alive, shown in ((True, "running"), (None, "unknown")):
        finding = stall(CheckContext(h, BaselineConfig(), now=LAST_ARRIVAL + 200, trainer_alive=alive), CFG)
        assert finding.evidence["trainer_process"] == shown
