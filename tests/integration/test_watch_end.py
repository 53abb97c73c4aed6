"""`guardian watch` ends when the run ends: the pure end rule, the run's length from its Hydra config, the
loop driven through time by an injected clock, and the command on the real verl 0.9.1 files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ManualClock, events, fixture_path, missing

from guardian.actions.liveness import pid_alive
from guardian.cli import main
from guardian.commands.watch.display import PlainProgress
from guardian.commands.watch.end import EndReason, FileState, WatchState, end_reason
from guardian.commands.watch.loop import FollowedFile, WatchLoop
from guardian.commands.watch.summary import VerdictTracker
from guardian.commands.watch.trainer import TrainerLiveness
from guardian.config import ConfigError, GuardianConfig
from guardian.core import Severity
from guardian.incidents.tick import IncidentTick
from guardian.sources.hydra_config import MAX_RUN_CONFIG_BYTES, config_beside, total_training_steps
from guardian.sources.jsonl import MetricsBatch, MetricsFile
from guardian.store import Store

RUN_30 = fixture_path("verl-0.9.1-run", "metrics-30-steps.jsonl")  # steps 0-30, entropy collapses from ~16
RUN_10 = fixture_path("verl-0.9.1-run", "metrics-10-steps.jsonl")  # steps 1-10, healthy (truncation warns)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


# -- the end rule ---------------------------------------------------------------------------------
def state(
    follow: bool = True,
    file: FileState = FileState.AT_END,
    last_step: int | None = 10,
    total: int | None = None,
    alive: bool | None = None,
) -> WatchState:
    return WatchState(follow, file, last_step, total, alive)


@pytest.mark.parametrize(
    ("watch", "reason"),
    [
        (state(follow=False), EndReason.END_OF_FILE),
        (state(follow=False, file=FileState.UNREAD), None),  # never end with bytes unread
        (state(total=10), EndReason.TOTAL_STEPS),
        (state(total=11), None),
        (state(total=10, file=FileState.UNREAD), None),
        (state(alive=False), EndReason.TRAINER_EXITED),
        (state(alive=False, file=FileState.UNREAD), None),  # read what it wrote before it exited first
        (state(alive=False, file=FileState.MISSING, last_step=None), EndReason.TRAINER_EXITED),
        (state(alive=True), None),
        (state(alive=None), None),  # a silent file with no trainer to ask: the run may only be slow
        (state(last_step=None, total=10), None),
    ],
)
def test_end_rule(watch: WatchState, reason: EndReason | None) -> None:
    assert end_reason(watch) == reason


# -- the run's length from the config verl ran with ------------------------------------------------
def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")  # locates verl without importing it (torch, ray)
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("hydra") is None:
        missing("needs verl==0.9.1 (its config tree) and hydra-core: pip install --no-deps verl==0.9.1 hydra-core")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def hydra_output_config(folder: Path, overrides: list[str]) -> Path:
    """What a verl launch writes to ``<hydra.run.dir>/.hydra/config.yaml``: verl's own tree composed by Hydra."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        composed = compose("ppo_trainer", overrides=overrides)
    path = folder / ".hydra" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(OmegaConf.to_yaml(composed))
    return path


def test_total_steps_from_the_hydra_config_verl_writes(tmp_path: Path) -> None:
    set_length = hydra_output_config(tmp_path / "set", ["trainer.total_training_steps=60"])
    assert total_training_steps(set_length) == 60
    assert config_beside(tmp_path / "set" / "metrics.jsonl") == set_length
    verl_default = hydra_output_config(tmp_path / "default", [])  # null: verl derives it at start
    assert total_training_steps(verl_default) is None
    assert config_beside(tmp_path / "elsewhere" / "metrics.jsonl") is None


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("trainer: {total_training_steps: sixty}\n", "must be a positive integer or null, got 'sixty'"),
        ("trainer: {total_training_steps: 0}\n", "must be a positive integer or null, got 0"),
        ("trainer: [1, 2]\n", "expected a mapping"),
        ("trainer: {total_training_steps: [60\n", "is not valid YAML"),
    ],
)
def test_a_bad_run_config_names_the_file_and_the_key(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="run config") as raised:
        total_training_steps(path)
    assert str(path) in str(raised.value) and complaint in str(raised.value)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"trainer:\n  total_training_steps: 6\xe9\n", "is not UTF-8 text (byte 0xe9 at offset 34)"),
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "is not UTF-8 text (byte 0x89 at offset 0)"),
        (b"# a comment\n" * (MAX_RUN_CONFIG_BYTES // 12 + 1), "is larger than 1 MiB: not a Hydra config.yaml"),
    ],
)
def test_a_binary_or_huge_run_config_is_refused_before_parsing(tmp_path: Path, data: bytes, complaint: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as raised:
        total_training_steps(path)
    assert str(raised.value) == f"run config {path} {complaint}"


def test_a_run_config_without_a_trainer_section_leaves_the_length_unknown(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("data: {train_batch_size: 32}\n")
    assert total_training_steps(path) is None


# -- the loop, through time ---------------------------------------------------------------------
class FailingSource:
    """The metrics file, its first ``failures`` polls raising (a fault of the guardian, not of the file)."""

    def __init__(self, real: MetricsFile, failures: int) -> None:
        self.real = real
        self.failures = failures
        self.polls = 0

    @property
    def path(self) -> Path:
        return self.real.path

    def poll(self, *, final: bool = False) -> MetricsBatch:
        self.polls += 1
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("poll exploded")
        return self.real.poll(final=final)


class Harness:
    """A real guardian over a real file and a real SQLite store, its loop driven by a manual clock: each
    wait of the loop moves the clock on by ``step_s`` and runs the next scripted action (the writer)."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        step_s: float = 30.0,
        alive: Callable[[int], bool] | None = None,
        failing_polls: int = 0,
    ) -> None:
        self.metrics = tmp_path / "run" / "metrics.jsonl"
        self.metrics.parent.mkdir()
        self.clock = ManualClock(1000.0)
        self.step_s = step_s
        self.actions: Iterator[Callable[[], None]] = iter(())
        self.lines: list[str] = []
        self.store = Store.open(f"sqlite:///{tmp_path / 'guardian.db'}")
        self.store.ensure_run(
            "r", name="r", metrics_path="", rollouts_dir="", checkpoints_dir=None, mode="observe", now=1000.0
        )
        self.source = FailingSource(MetricsFile(self.metrics), failing_polls)
        self.file = FollowedFile(self.source)
        self.trainer = TrainerLiveness(None if alive is None else 4242, alive or pid_alive)
        self.tracker = VerdictTracker()
        self.guardian = IncidentTick(
            config=GuardianConfig(),
            store=self.store,
            run_id="r",
            metrics=self.file,
            clock=self.clock,
            tracker=self.tracker,
        )

    def wait(self, _seconds: float) -> bool:
        self.clock.now += self.step_s
        next(self.actions, lambda: None)()
        return False

    def run(self, *, follow: bool = True, total_steps: int | None = None, max_ticks: int | None = 50) -> EndReason:
        display = PlainProgress(self.guardian, self.lines.append, self.clock)
        loop = WatchLoop(
            self.guardian,
            self.file,
            self.trainer,
            display,
            follow=follow,
            total_steps=total_steps,
            wait=self.wait,
            max_ticks=max_ticks,
        )
        return loop.run()

    def append(self, data: bytes) -> Callable[[], None]:
        def write() -> None:
            with self.metrics.open("ab") as out:
                out.write(data)

        return write


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = Harness(tmp_path)
    yield made
    made.store.close()


def test_following_ends_when_the_run_reaches_its_total_steps(harness: Harness) -> None:
    lines = lines_of(RUN_30)
    harness.metrics.write_bytes(b"".join(lines[:12]))
    harness.actions = iter(harness.append(b"".join(lines[i : i + 4])) for i in range(12, len(lines), 4))
    assert harness.run(total_steps=30) is EndReason.TOTAL_STEPS
    assert harness.guardian.history.last_step == 30
    assert harness.tracker.first_critical is not None and harness.tracker.first_critical.check == "entropy_collapse"


def test_waiting_for_a_file_that_appears_later(harness: Harness) -> None:
    lines = lines_of(RUN_10)
    harness.actions = iter([lambda: None, lambda: None, harness.append(b"".join(lines))])
    assert harness.run(total_steps=10) is EndReason.TOTAL_STEPS
    assert harness.lines.count(f"waiting for {harness.metrics}") == 1
    assert harness.guardian.history.last_step == 10
    assert harness.lines[-1].startswith("step 10  reward ")


def test_a_finished_file_with_no_trainer_to_ask_warns_and_never_opens_a_stall_incident(harness: Harness) -> None:
    harness.metrics.write_bytes(RUN_10.read_bytes())
    # 40 waits of 30 s: 20 minutes of silence after the last step (about 240 of its ~5 s steps)
    assert harness.run(max_ticks=40) is EndReason.TICK_LIMIT
    finding = harness.tracker.latest["stall"]
    assert finding.severity == Severity.WARN
    assert "no trainer process to check (pass --pid): the run may have finished, crashed or hung" in finding.message
    assert [i.check for i in harness.store.list_incidents("r")] == []
    assert harness.tracker.first_critical is None  # the verdict does not depend on how long it was watched
    assert any("warn  stall  raised" in line for line in harness.lines)


def test_the_same_silence_while_the_trainer_runs_is_a_hang(tmp_path: Path) -> None:
    harness = Harness(tmp_path, alive=lambda pid: True)
    harness.metrics.write_bytes(RUN_10.read_bytes())
    try:
        assert harness.run(max_ticks=40) is EndReason.TICK_LIMIT
        assert harness.tracker.latest["stall"].severity == Severity.CRITICAL
        assert [i.check for i in harness.store.list_incidents("r")] == ["stall"]
    finally:
        harness.store.close()


def test_following_ends_when_the_trainer_exits_after_its_last_line_is_read(tmp_path: Path) -> None:
    running = [True]
    harness = Harness(tmp_path, alive=lambda pid: running[0])
    lines = lines_of(RUN_10)
    harness.metrics.write_bytes(b"".join(lines[:5]))

    def last_lines_then_exit() -> None:
        harness.append(b"".join(lines[5:9]) + lines[9].rstrip(b"\n"))()  # exits mid-line: no newline at the end
        running[0] = False

    harness.actions = iter([lambda: None, last_lines_then_exit])
    try:
        assert harness.run() is EndReason.TRAINER_EXITED
        assert harness.guardian.history.last_step == 10  # the unterminated last line was read too
        assert harness.tracker.latest["stall"].severity == Severity.UNKNOWN
    finally:
        harness.store.close()


def test_a_path_that_turns_into_a_directory_ends_the_watch_with_an_error_naming_it(
    harness: Harness, logs: pytest.LogCaptureFixture
) -> None:
    harness.actions = iter([harness.metrics.mkdir])
    assert harness.run() is EndReason.UNREADABLE  # the summary and the verdict of the steps read still follow
    (line,) = events(logs, "watch_error")
    assert f"cannot read {harness.metrics}: Is a directory" in line


def test_ticks_failing_in_a_row_give_up_in_one_line_saying_the_run_is_unguarded(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    harness = Harness(tmp_path, failing_polls=10_000)
    harness.metrics.write_bytes(RUN_10.read_bytes())
    try:
        assert harness.run() is EndReason.TICK_FAILURES
    finally:
        harness.store.close()
    limit = GuardianConfig().tick_failure_limit
    assert harness.source.polls == limit
    (failed,) = events(logs, "tick_failed")
    assert "kind=bug type=RuntimeError at=guardian/commands/watch/loop.py:" in failed  # the innermost frame of ours
    assert 'detail="RuntimeError: poll exploded"' in failed
    assert [r.getMessage() for r in logs.records if r.exc_info] == [failed], "the traceback once"
    (line,) = events(logs, "guardian_cannot_continue")
    assert f'cause="{limit} ticks in a row failed: RuntimeError: poll exploded"' in line
    assert "UNGUARDED from now on" in line and "run the same guardian watch command again" in line


def test_a_tick_that_fails_a_few_times_is_retried_and_the_watch_goes_on(
    tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    harness = Harness(tmp_path, failing_polls=2)
    harness.metrics.write_bytes(RUN_10.read_bytes())
    try:
        assert harness.run(follow=False) is EndReason.END_OF_FILE
    finally:
        harness.store.close()
    assert harness.guardian.history.last_step == 10
    assert len(events(logs, "tick_failed")) == 1
    assert "failed_ticks=2" in events(logs, "tick_recovered")[0]
    assert events(logs, "guardian_cannot_continue") == []


def test_plain_progress_every_ten_steps_or_thirty_seconds(harness: Harness) -> None:
    lines = lines_of(RUN_30)
    # one step per wait of 30 s: a line per step (30 s); then 20 steps at once: two lines of ten
    harness.metrics.write_bytes(lines[0])
    harness.actions = iter(
        [harness.append(lines[1]), harness.append(lines[2]), harness.append(b"".join(lines[3:23])), lambda: None]
    )
    harness.run(max_ticks=5)
    progress = [line.split("  ")[0] for line in harness.lines if "  reward " in line]
    assert progress == ["step 1", "step 2", "step 22"]


# -- the command ------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    return tmp_path / "home"


def test_no_follow_on_the_real_verl_run_judges_it_like_replay(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):  # a second watch of the same file (same run id, steps already stored): same verdict
        assert main(["watch", "--metrics", str(RUN_30), "--no-follow"]) == 3
        out = capsys.readouterr().out
        assert "watch ended: read" in out and "steps read: 31 (last step 30)" in out
        assert "verdict: UNHEALTHY from step 24 (entropy_collapse)" in out
        assert "entropy_collapse critical open onset ~15" in out and "stall" not in out
        assert f"history: sqlite:///{home / 'guardian.db'}" in out
    assert main(["watch", "--metrics", str(RUN_10), "--no-follow"]) == 0
    out = capsys.readouterr().out
    assert "verdict: HEALTHY" in out and "incidents: none" in out


def test_paths_that_cannot_be_watched_are_errors_naming_them(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "not-yet.jsonl"
    assert main(["watch", "--metrics", str(absent), "--no-follow"]) == 1
    assert f"metrics file {absent} does not exist" in capsys.readouterr().err
    assert main(["watch", "--metrics", str(tmp_path)]) == 1
    assert f"{tmp_path} is a directory" in capsys.readouterr().err
    config = tmp_path / "config.yaml"
    config.write_text("trainer: {total_training_steps: -1}\n")
    assert main(["watch", "--metrics", str(RUN_10), "--run-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"run config {config}" in err and "Traceback" not in err


def test_bad_rollouts_and_checkpoints_folders_are_refused_naming_the_option_and_path(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "no-such-folder"
    for option in ("--rollouts", "--checkpoints"):
        for argv, complaint in (
            ([option, str(RUN_10)], f"{option} {RUN_10} is not a directory"),
            ([option, str(absent), "--no-follow"], f"{option} {absent} does not exist"),
        ):
            assert main(["watch", "--metrics", str(RUN_10), "--no-live", *argv]) == 1
            err = capsys.readouterr().err
            assert complaint in err and "Traceback" not in err
    assert not (home / "guardian.db").exists(), "refused before the store is opened"


def test_folders_not_there_yet_are_waited_for_while_following(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    later = tmp_path / "created-by-the-trainer"
    argv = ["watch", "--metrics", str(RUN_10), "--no-live", "--total-steps", "10", "--rollouts", str(later)]
    assert main([*argv, "--checkpoints", str(later)]) == 0
    assert "verdict: HEALTHY" in capsys.readouterr().out


def test_a_watch_whose_ticks_keep_failing_exits_1_with_the_summary(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def exploded(self: MetricsFile, *, final: bool = False) -> MetricsBatch:
        raise RuntimeError("poll exploded")

    monkeypatch.setattr(MetricsFile, "poll", exploded)
    assert main(["watch", "--metrics", str(RUN_10), "--no-live", "--no-follow"]) == 1
    captured = capsys.readouterr()
    assert "watch ended: gave up after failed ticks, the run is UNGUARDED" in captured.out
    assert "event=guardian_cannot_continue" in captured.err and "event=internal_error" not in captured.err


def test_an_empty_file_read_to_its_end_has_nothing_to_judge(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "metrics.jsonl"
    empty.write_bytes(b"")
    assert main(["watch", "--metrics", str(empty), "--no-follow"]) == 1
    assert f"verdict: NO STEPS: nothing read from {empty} to judge" in capsys.readouterr().out


def test_pid_liveness_of_a_real_process_its_zombie_and_its_end() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    stat = Path(f"/proc/{child.pid}/stat")
    try:
        if not stat.exists():
            missing("needs /proc (Linux) to tell a zombie")
        assert pid_alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; until it is reaped it is a zombie, which has exited all the same
        deadline = time.monotonic() + 30
        while " Z " not in stat.read_text():
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert not pid_alive(child.pid)
    finally:
        child.wait(timeout=30)
    assert not pid_alive(child.pid)


@pytest.mark.parametrize(
    ("file", "run_id"),
    [("metrics.jsonl", "metrics-"), ("my run (2).jsonl", "my_run_2_-"), (".hidden.jsonl", "hidden-")],
)
def test_derived_run_ids_keep_to_the_run_id_rule(tmp_path: Path, file: str, run_id: str) -> None:
    from guardian.cli.watch import derive_run_id
    from guardian.ids import checked_run_id

    derived = derive_run_id(tmp_path / file)
    assert derived.startswith(run_id) and checked_run_id(derived) == derived
