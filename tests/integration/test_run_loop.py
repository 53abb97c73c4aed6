"""guardian run's loop, tick by tick: a failed tick is reported to the exporter as a failed poll, the loop goes
on, and a tick that keeps failing ends it through the supervisor's one line."""

from __future__ import annotations

import io
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from guardian.commands.compose import supervisor as local_supervisor
from guardian.commands.run import _render, guard_loop, register_run
from guardian.config import GuardianConfig
from guardian.store import Store


@dataclass
class TickingSupervisor:
    """The part of ``Supervisor`` the loop drives: ``tick`` follows a script of results and failures."""

    script: list[int | Exception | None]
    config: GuardianConfig = field(default_factory=lambda: GuardianConfig(tick_failure_limit=3))
    run_id: str = "run-a"
    gave_up: list[str] = field(default_factory=list)
    moves: list[bool] = field(default_factory=list)  # per tick: did it see something move (default: no)
    busy: bool = False

    def tick(self) -> int | None:
        self.busy = self.moves.pop(0) if self.moves else False
        outcome = self.script.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def cannot_continue(self, *, cause: str, fix: str) -> int:
        self.gave_up.append(cause)
        return 1


def test_failed_ticks_are_failed_polls_and_the_loop_goes_on_to_the_run_end() -> None:
    supervisor = TickingSupervisor([None, RuntimeError("disk"), RuntimeError("disk"), None, 0])
    polls: list[bool] = []
    code = guard_loop(supervisor, threading.Event(), 0.0, live=False, after_tick=polls.append)  # type: ignore[arg-type]
    assert code == 0 and polls == [True, False, False, True, True] and not supervisor.gave_up


def test_a_tick_failing_every_time_gives_up_after_the_configured_limit() -> None:
    supervisor = TickingSupervisor([RuntimeError("store gone")] * 5)
    polls: list[bool] = []
    code = guard_loop(supervisor, threading.Event(), 0.0, live=False, after_tick=polls.append)  # type: ignore[arg-type]
    assert code == 1 and polls == [False, False, False]
    assert supervisor.gave_up == ["3 ticks in a row failed: RuntimeError: store gone"]


class RecordedWaits(threading.Event):
    """A stop event that is never set and records how long the loop asked to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return False


def test_the_loop_polls_less_while_nothing_moves_and_at_full_pace_once_something_does() -> None:
    supervisor = TickingSupervisor(
        [None, None, None, None, None, None, RuntimeError("once"), None, 0],
        moves=[True, False, False, False, False, True, False, False, False],
    )
    stop = RecordedWaits()
    assert guard_loop(supervisor, stop, 0.25, live=False) == 0  # type: ignore[arg-type]
    # a new line (tick 1, 6) or a failed tick (7) brings the base pace back; quiet ticks double it up to 2 s
    assert stop.waits == [0.25, 0.5, 1.0, 2.0, 2.0, 0.25, 0.25, 0.5]


def test_an_exporter_that_fails_on_a_failed_tick_does_not_end_the_loop() -> None:
    def exporter(ok: bool) -> None:
        if not ok:
            raise OSError("exporter broken too")

    supervisor = TickingSupervisor([RuntimeError("once"), 0])
    assert guard_loop(supervisor, threading.Event(), 0.0, live=False, after_tick=exporter) == 0  # type: ignore[arg-type]


def test_the_live_view_says_when_the_store_cannot_be_read(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    config = GuardianConfig(home=tmp_path / "home")
    with Store.open(config.database_url()) as store:
        supervisor = local_supervisor(config, store, run_id="r1", command=command, cwd=tmp_path)
        register_run(store, supervisor.layout, mode=config.mode, name="r1")
        store.close()
        with (config.home / "guardian.db").open("r+b") as damaged:  # the schema page: no query can be planned
            damaged.write(b"\xa5" * 4096)
        console = Console(file=io.StringIO(), width=200)
        console.print(_render(supervisor))
    assert "intervention: unknown (the store cannot be read)" in console.file.getvalue()  # type: ignore[attr-defined]


def test_the_trainer_gets_neither_the_guardians_database_url_nor_a_metrics_path_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDIAN_DB_URL", "postgresql+psycopg://guardian:s3cret@db/guardian")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "/elsewhere/metrics.jsonl")
    monkeypatch.setenv("WANDB_API_KEY", "the trainer's own")
    command = [sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    config = GuardianConfig(home=tmp_path / "home")
    with Store.open(config.database_url()) as store:
        supervisor = local_supervisor(config, store, run_id="r1", command=command, cwd=tmp_path)
    env = supervisor.trainer.env  # type: ignore[union-attr]
    assert "GUARDIAN_DB_URL" not in env and "VERL_FILE_LOGGER_PATH" not in env
    assert env["WANDB_API_KEY"] == "the trainer's own"


def test_a_streak_of_outages_is_given_its_time_a_streak_with_a_bug_is_not() -> None:
    config = GuardianConfig(tick_failure_limit=3, outage_limit_s=30.0)
    outages = TickingSupervisor([ConnectionError("refused")] * 8 + [0], config=config)
    assert guard_loop(outages, threading.Event(), 0.0, live=False) == 0 and not outages.gave_up  # type: ignore[arg-type]
    mixed = TickingSupervisor(
        [ConnectionError("refused"), RuntimeError("bug"), ConnectionError("refused"), 0], config=config
    )
    assert guard_loop(mixed, threading.Event(), 0.0, live=False) == 1  # type: ignore[arg-type]
    assert mixed.gave_up == ["3 ticks in a row failed: ConnectionError: refused"]


def test_an_outage_streak_past_its_time_gives_up_saying_how_long() -> None:
    from guardian.loop.outage import TickFailures

    failures = TickFailures(limit=3, outage_limit_s=30.0)
    for now in (0.0, 10.0, 20.0, 29.0):
        failures.failed(outage=True, now=now)
    assert not failures.exhausted
    failures.failed(outage=True, now=31.0)
    assert failures.exhausted
