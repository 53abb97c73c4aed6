"""``guardian fleet``: several runs guarded by one guardian process (one store, one ``/metrics``, a thread each).

The fleet file's checks read real files; the end-to-end tests run real demo trainers (real processes, real GRPO on
CPU) under one in-process fleet and scrape its real exporter on loopback: a collapse whose trainer ignores SIGINT
and SIGTERM (its stop runs the whole escalation to SIGKILL), a healthy run that must keep being guarded meanwhile,
and a run whose metrics source fails every tick until its guardian gives up - each ends on its own terms.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from collapse_run import collapse_command

from guardian.commands.fleet import guard_fleet
from guardian.config import ConfigError, GuardianConfig
from guardian.exits import EXIT_ERROR, EXIT_GAVE_UP, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE
from guardian.fleet.outcome import fleet_exit
from guardian.fleet.spec import load_fleet
from guardian.logs import event, get_logger, logging_to_file
from guardian.rescue.policy import State
from guardian.sinks.export import FleetSource
from guardian.sinks.snapshot import RunSnapshot
from guardian.store import Store

# ------------------------------------------------------------------------------------------ the fleet file


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_fleet_file_resolves_paths_configs_and_the_one_store(tmp_path: Path) -> None:
    (tmp_path / "runs" / "b").mkdir(parents=True)
    write(tmp_path / "strict.yaml", "mode: advise\ncheckpoints:\n  pin_keep: 5\n")
    fleet = write(
        tmp_path / "fleet.yaml",
        """
runs:
  - run_id: a
    command: [python, -m, verl.trainer.main_ppo, trainer.experiment_name=a]
  - run_id: b
    command: "python -m verl.trainer.main_ppo 'trainer.experiment_name=b c'"
    cwd: runs/b
    config: strict.yaml
    ray_address: http://head:8265
  - run_id: c
    command: [python, train.py]
    config: strict.yaml
    mode: observe
""",
    )
    base = GuardianConfig.model_validate(
        {"home": str(tmp_path / "home"), "db_url": "sqlite:///" + str(tmp_path / "x.db")}
    )
    a, b, c = load_fleet(fleet, base)
    assert a.command == ("python", "-m", "verl.trainer.main_ppo", "trainer.experiment_name=a")
    assert a.cwd == tmp_path and a.config == base and a.ray_address is None
    assert b.command[-1] == "trainer.experiment_name=b c" and b.cwd == tmp_path / "runs" / "b"
    assert b.ray_address == "http://head:8265"
    assert (b.config.mode, b.config.checkpoints.pin_keep) == ("advise", 5)
    assert c.config.mode == "observe"
    # every run writes to the fleet's store, whatever its own guardian.yaml would default to
    assert {run.config.database_url() for run in (a, b, c)} == {base.database_url()}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "runs: Field required"),
        ("runs: []\n", "runs: List should have at least 1 item"),
        ("runs:\n  - run_id: a\n    command: [x]\n    cmd: [y]\n", "runs[1].cmd (run a): unknown key"),
        ("runs:\n  - run_id: a\n    command: ''\n", "the training command is empty"),
        ("runs:\n  - run_id: 'a b'\n    command: [x]\n", "runs[1].run_id"),
        ("runs:\n  - run_id: a\n    command: [x]\n  - run_id: a\n    command: [y]\n", "runs[2] repeats run_id 'a'"),
        ("runs:\n  - run_id: a\n    command: [x]\n    mode: panic\n", "runs[1].mode (run a)"),
        ("runs: [a\n", "is not valid YAML"),
        ("runs:\n  - run_id: a\n    command: [x]\n    config: nowhere.yaml\n", "run a of the fleet: cannot read"),
    ],
)
def test_a_wrong_fleet_file_says_where(tmp_path: Path, text: str, expected: str) -> None:
    fleet = write(tmp_path / "fleet.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_fleet(fleet, GuardianConfig())
    assert str(fleet) in str(caught.value) or "run a of the fleet" in str(caught.value)
    assert expected in str(caught.value)


def test_a_run_config_that_is_wrong_names_the_run_and_the_key(tmp_path: Path) -> None:
    write(tmp_path / "bad.yaml", "checks:\n  entropy_collapse:\n    nonsense: 1\n")
    fleet = write(tmp_path / "fleet.yaml", "runs:\n  - run_id: r7\n    command: [x]\n    config: bad.yaml\n")
    with pytest.raises(ConfigError, match=r"run r7 of the fleet: invalid configuration in .*bad.yaml"):
        load_fleet(fleet, GuardianConfig())


def test_the_missing_fleet_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_fleet(tmp_path / "absent.yaml", GuardianConfig())


# ---------------------------------------------------------------------------------------------- outcome


@pytest.mark.parametrize(
    ("codes", "interrupted", "expected"),
    [
        ({"a": 0, "b": 0}, False, EXIT_OK),
        ({"a": 0, "b": 93}, False, EXIT_GAVE_UP),
        ({"a": 3, "b": 3, "c": 0}, False, EXIT_UNHEALTHY),
        ({"a": 3, "b": 93}, False, EXIT_ERROR),
        ({"a": 0, "b": 0}, True, EXIT_INTERRUPTED),
    ],
)
def test_the_fleets_exit_code(codes: dict[str, int], interrupted: bool, expected: int) -> None:
    assert fleet_exit(codes, interrupted=interrupted) == expected


# ------------------------------------------------------------------------------- one log, several runs


def test_each_runs_log_file_takes_its_own_thread_and_the_lines_naming_it(tmp_path: Path) -> None:
    log = get_logger("fleet-test")
    logging.getLogger("guardian").setLevel(logging.INFO)
    files = {run: tmp_path / f"{run}.log" for run in ("r1", "r11")}
    ready, done = threading.Barrier(3), threading.Barrier(3)

    def guard(run: str) -> None:
        with logging_to_file(files[run], quiet_terminal=False, only_run=run):
            ready.wait()
            log.info(event("tick", {"note": f"from the thread of {run}"}))
            done.wait()

    threads = [threading.Thread(target=guard, args=(run,)) for run in files]
    for thread in threads:
        thread.start()
    ready.wait()
    log.info(event("delivered", {"run": "r11"}))  # another thread's line naming a run: that run's file only
    log.info(event("delivered", {"run": "r1", "to": "slack"}))
    log.info(event("unrelated", {}))
    done.wait()
    for thread in threads:
        thread.join()
    r1, r11 = (files[run].read_text() for run in ("r1", "r11"))
    assert "from the thread of r1" in r1 and "from the thread of r11" not in r1
    assert "run=r1 to=slack" in r1 and "run=r11" not in r1 and "unrelated" not in r1
    assert "from the thread of r11" in r11 and "run=r11" in r11 and "run=r1 " not in r11


# ------------------------------------------------------------------------------------------ end to end


def fleet_config(home: Path) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "sources": {"poll_interval_s": 0.05},
            "tick_failure_limit": 8,
            "intervention": {"probation_steps": 15, "stop_sigint_s": 2, "stop_sigterm_s": 2, "stop_sigkill_s": 5},
            "exporter": {"enabled": True, "port": 0, "linger_s": 0},
        }
    )


def demo_run(ckpt: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "guardian.demo.trainer",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        "trainer.save_freq=10",
        f"trainer.default_local_dir={ckpt}",
        "+trainer.fault.slow_steps=0.05",
    ]


DEAF = """import runpy, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.argv[0] = "guardian.demo.trainer"
runpy.run_module("guardian.demo.trainer", run_name="__main__")
"""
# its metrics file is a directory: the run's source fails every tick
BROKEN = """import os, time
path = os.environ["VERL_FILE_LOGGER_PATH"]
if os.path.isfile(path):
    os.remove(path)
os.makedirs(path, exist_ok=True)
time.sleep(0.2)  # ends before its guardian gives up (which would leave it running)
"""


def deaf_to(command: list[str], script: Path) -> list[str]:
    """The demo trainer's ``command`` with SIGINT and SIGTERM ignored: only SIGKILL stops it."""
    write(script, DEAF)
    assert command[1:3] == ["-m", "guardian.demo.trainer"]
    # paced so that it is still training when its stop begins
    paced = [word.replace("slow_steps=0.02", "slow_steps=0.1") for word in command[3:]]
    return [command[0], str(script), *paced]


class Scraper:
    """Scrapes the fleet's /metrics every 0.1 s: (time, {run_id: step}), and every run id seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.seen: set[str] = set()
        self.stop = threading.Event()

    def __call__(self) -> None:
        while not self.stop.wait(0.1):
            try:
                body = urllib.request.urlopen(self.url, timeout=5).read().decode()
            except OSError:
                continue
            steps: dict[str, float] = {}
            for line in body.splitlines():
                if line.startswith("guardian_up{"):
                    self.seen.add(line.split('run_id="')[1].split('"')[0])
                if line.startswith("guardian_step{"):
                    steps[line.split('run_id="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
            self.samples.append((time.time(), steps))


def stop_window(log_file: Path) -> tuple[float, float]:
    """When the first stop of the run's trainer began (its SIGINT) and ended (gone), from its guardian.log."""

    def at(line: str) -> float:
        stamp = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
        return time.mktime(stamp) + int(line[20:23]) / 1000

    lines = log_file.read_text().splitlines()
    began = next(at(line) for line in lines if "event=trainer_signal" in line and "signal=SIGINT" in line)
    ended = next(at(line) for line in lines if "event=trainer_stop " in line and "result=gone" in line)
    return began, ended


@pytest.mark.slow
def test_one_fleet_guards_a_stubborn_collapse_a_healthy_run_and_a_broken_source_each_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = fleet_config(tmp_path / "home")
    fleet = write(
        tmp_path / "fleet.yaml",
        "runs:\n"
        f"  - run_id: stubborn\n    command: {deaf_to(collapse_command(tmp_path / 'ckpt-s'), tmp_path / 'deaf.py')!r}\n"
        f"  - run_id: steady\n    command: {demo_run(tmp_path / 'ckpt-steady', 220)!r}\n"
        f"  - run_id: broken\n    command: {[sys.executable, str(write(tmp_path / 'broken.py', BROKEN))]!r}\n"
        # not a python command: refused at its start, alone
        "  - run_id: shell\n    command: [sh, -c, 'true']\n",
    )
    runs = load_fleet(fleet, config)
    stop = threading.Event()
    codes: dict[str, int] = {}
    lines = Lines()
    logging.getLogger("guardian").addHandler(lines)
    logging.getLogger("guardian").setLevel(logging.INFO)
    fleet_thread = threading.Thread(target=lambda: codes.update(guard_fleet(config, runs, stop)))
    fleet_thread.start()
    try:
        scraper = Scraper(lines.exporter_url())
        scraping = threading.Thread(target=scraper)
        scraping.start()
        fleet_thread.join(240)
        assert not fleet_thread.is_alive(), "the fleet did not end in 240 s"
    finally:
        stop.set()
        fleet_thread.join(30)
        scraper.stop.set()
        logging.getLogger("guardian").removeHandler(lines)
    assert codes == {"stubborn": EXIT_OK, "steady": EXIT_OK, "broken": EXIT_ERROR, "shell": EXIT_USAGE}
    assert scraper.seen == {"stubborn", "steady", "broken"}  # the refused run never joined

    with Store.open(config.database_url()) as store:
        (intervention,) = store.interventions("stubborn")
        assert intervention.state == State.RESOLVED
        assert store.latest_step("steady") is not None and store.latest_step("steady")[0] == 220
        assert not store.interventions("steady") and not store.interventions("broken")

    # while the stubborn trainer took its whole escalation to stop, the steady run kept being guarded
    runs_dir = tmp_path / "home" / "runs"
    began, ended = stop_window(runs_dir / "stubborn" / "guardian.log")
    assert ended - began >= 3.5  # SIGINT 2 s + SIGTERM 2 s, then SIGKILL
    during = [steps["steady"] for at, steps in scraper.samples if began <= at <= ended and "steady" in steps]
    assert len(during) >= 10 and during[-1] - during[0] >= 5, during

    # each run's guardian.log holds its own lines
    logs = {run: (runs_dir / run / "guardian.log").read_text() for run in ("stubborn", "steady", "broken")}
    assert "event=guardian_cannot_continue run=broken" in logs["broken"]
    for run, text in logs.items():
        for other in set(logs) - {run}:
            assert f"run={other}" not in text, (run, other)
    assert "event=trainer_signal" in logs["stubborn"] and "event=trainer_signal" not in logs["steady"]


class Lines(logging.Handler):
    """Every guardian log line of the test, whichever thread logged it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def exporter_url(self, timeout_s: float = 30) -> str:
        """The fleet exporter's URL, from its ``event=exporter`` line (port 0 picks a free port)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith("event=exporter "):
                    return line.split("url=")[1].split()[0]
            time.sleep(0.05)
        raise AssertionError("no event=exporter line")


@pytest.mark.slow
def test_sigterm_stops_the_fleets_guardians_not_the_trainers_and_the_fleet_again_picks_them_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(tmp_path / "guardian.yaml", f"home: {home}\nsources:\n  poll_interval_s: 0.05\n")
    fleet = write(
        tmp_path / "fleet.yaml",
        "runs:\n"
        + "".join(
            f"  - run_id: {run}\n    command: {demo_run(tmp_path / f'ckpt-{run}', 120)!r}\n" for run in ("one", "two")
        ),
    )
    argv = [sys.executable, "-m", "guardian", "fleet", "--config", str(tmp_path / "guardian.yaml"), str(fleet)]
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            (s := store.latest_step(run)) is not None and s[0] >= 5 for run in ("one", "two")
        ):
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
        assert first.returncode == EXIT_INTERRUPTED, err[-2000:]
        assert "one  exit 130" in out and "two  exit 130" in out
        for run in ("one", "two"):
            launched = re.search(r"event=trainer_launch pid=(\d+)", (home / "runs" / run / "guardian.log").read_text())
            assert launched is not None
            os.kill(int(launched.group(1)), 0)  # the trainers were left running
        again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        assert again.returncode == EXIT_OK, again.stderr[-2000:]
        for run in ("one", "two"):
            attempts = store.attempts(run)
            assert len(attempts) == 1  # re-attached, not launched twice
            assert store.latest_step(run)[0] == 120  # type: ignore[index]
        assert again.stderr.count("event=fleet_run_ended") == 2


@dataclass
class Published:
    """One run's published snapshot, as a guard loop's ``GuardianSource`` hands it out."""

    run_id: str
    up: bool = True

    def snapshot(self) -> tuple[RunSnapshot, ...]:
        return (RunSnapshot(self.run_id, self.run_id, up=self.up),)

    def stopped(self) -> None:
        self.up = False


def test_a_fleet_source_keeps_a_run_that_ended_as_down() -> None:
    fleet = FleetSource()
    for run in ("a", "b"):
        fleet.join(run, Published(run))
    fleet.stopped("a")
    fleet.stopped("never-joined")
    assert [(snap.run_id, snap.up) for snap in fleet.snapshot()] == [("a", False), ("b", True)]


def test_a_guarded_tick_measures_itself_raised_or_not() -> None:
    from guardian.loop.outage import TickFailures
    from guardian.loop.ticks import GuardedTick

    now = [10.0]

    def tick(seconds: float, fail: bool = False) -> str:
        now[0] += seconds
        if fail:
            raise OSError("metrics file gone")
        return "ok"

    guarded = GuardedTick("r", TickFailures(limit=3), timer=lambda: now[0])
    assert guarded(lambda: tick(0.5)) == (True, "ok") and guarded.last_seconds == pytest.approx(0.5)
    assert guarded(lambda: tick(2.0, fail=True)) == (False, None) and guarded.last_seconds == pytest.approx(2.0)
