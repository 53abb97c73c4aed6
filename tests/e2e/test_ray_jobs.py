"""guardian.rescue.ray_jobs: the trainer as Ray Jobs - against a recording fake of the Jobs API, and against a real
local Ray head on CPU (submit, RUNNING, stop, STOPPED, re-attach by submission id)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from collapse_run import collapse_command, config_for
from conftest import free_port, missing

from guardian.actions.launcher import RunFolder
from guardian.actions.process import ExitStatus, LocalProcessControl
from guardian.config import GuardianConfig
from guardian.faults import is_outage
from guardian.rescue.local import StopFailedError
from guardian.rescue.ray_jobs import (
    RAY_INSTALL,
    JobInfo,
    JobsClient,
    RayJobsError,
    RayJobsTrainer,
    connect,
    entrypoint,
    exit_status_of,
    submission_id,
)
from guardian.rescue.ray_logs import JOB_LOG, JobLogMirror, JobLogsSource, Reading, choose
from guardian.rescue.ray_survivors import StateApi, Survivor, kill_command, per_node, verdict
from guardian.rescue.ray_timeouts import JobsApiTimeout
from guardian.rescue.supervisor import Supervisor
from guardian.sources.console import ConsoleFile
from guardian.sources.jsonl import MetricsFile
from guardian.store import AttemptView, Store, StoredPlan

T0 = 1_800_000_000.0
REPO_ROOT = Path(__file__).resolve().parents[2]  # the demo trainer is imported from here by the job
RUN = "ray-run-1"


@dataclass
class Info:
    status: str
    message: str | None = None
    driver_exit_code: int | None = None
    driver_node_id: str | None = "node-a"
    metadata: dict[str, str] | None = None
    job_id: str | None = "02000000"


@dataclass
class FakeJobs:
    """The Jobs API as a dict of jobs; records every call. A stopped job turns STOPPED after ``stop_polls`` reads
    (None: it never does, a driver stuck in the kernel)."""

    jobs: dict[str, Info] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    submitted: list[dict[str, object]] = field(default_factory=list)
    logs: str = ""
    stop_polls: int | None = 2
    _stopping: dict[str, int] = field(default_factory=dict)

    def submit_job(
        self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, object], metadata: dict[str, str]
    ) -> str:
        self.calls.append(("submit", submission_id))
        self.submitted.append({"entrypoint": entrypoint, "runtime_env": runtime_env, "metadata": metadata})
        self.jobs[submission_id] = Info("RUNNING", metadata=metadata)
        return submission_id

    def stop_job(self, job_id: str) -> bool:
        self.calls.append(("stop", job_id))
        self._stopping[job_id] = 0
        return True

    def get_job_info(self, job_id: str) -> Info:
        self.calls.append(("info", job_id))
        if job_id not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        if job_id in self._stopping and self.stop_polls is not None:
            self._stopping[job_id] += 1
            if self._stopping[job_id] > self.stop_polls:
                self.jobs[job_id].status = "STOPPED"
        return self.jobs[job_id]

    def get_job_logs(self, job_id: str) -> str:
        self.get_job_info(job_id)
        return self.logs


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as opened:
        opened.ensure_run(
            RUN,
            name="ray",
            metrics_path=str(tmp_path / "metrics.jsonl"),
            rollouts_dir=str(tmp_path / "rollouts"),
            checkpoints_dir=str(tmp_path / "ckpt"),
            mode="enforce",
            now=T0,
        )
        yield opened


def _config(tmp_path: Path, *, sigint: float = 2.0, sigterm: float = 1.0, sigkill: float = 1.0) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(tmp_path / "home"),
            "intervention": {"stop_sigint_s": sigint, "stop_sigterm_s": sigterm, "stop_sigkill_s": sigkill},
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeCluster:
    """The State API: the job's live actors, read by read (the last answer repeats); ``down`` raises."""

    answers: list[list[Survivor]] = field(default_factory=list)
    address: str = "http://head:8265"
    down: bool = False
    reads: int = 0

    def survivors(self, job_id: str) -> list[Survivor]:
        self.reads += 1
        if self.down:
            raise RuntimeError("Ray's State API at http://head:8265 did not answer: connection refused")
        return self.answers[min(self.reads, len(self.answers)) - 1] if self.answers else []

    def node_totals(self) -> dict[str, dict[str, float]]:
        return {"10.0.0.5": {"CPU": 16.0, "GPU": 8.0}}


GPU_KEEPER = Survivor(
    "a1b2c3d4e5f6a7b8", "Keeper", "ALIVE", True, "keeper", "ns", "n1", "10.0.0.5", 4242, {"CPU": 1.0, "GPU": 2.0}
)
CPU_HELPER = Survivor("ffeeddccbbaa0099", "Helper", "ALIVE", True, None, "ns", "n1", "10.0.0.5", 77, {"CPU": 0.5})
OWNED = Survivor("0011223344556677", "Worker", "ALIVE", False, None, "ns", "n1", "10.0.0.5", 99, {"GPU": 1.0})


def _trainer(
    tmp_path: Path,
    store: Store,
    client: JobsClient,
    clock: Clock | None = None,
    cluster: FakeCluster | None = None,
) -> RayJobsTrainer:
    clock = clock or Clock()
    return RayJobsTrainer(
        _config(tmp_path),
        store,
        RUN,
        client,
        RunFolder(tmp_path / "run"),
        tmp_path,
        clock=lambda: T0,
        wait=clock.sleep,
        monotonic=clock,
        cluster=cluster,
    )


def _supervisor(
    config: GuardianConfig, store: Store, tmp_path: Path, jobs: JobsClient, clock: Callable[[], float]
) -> Supervisor:
    """``guardian run``'s supervisor submitting to ``jobs`` (its trainer a Ray job), on ``clock``."""
    from guardian.commands.compose import TrainerSite, supervisor

    return supervisor(
        config,
        store,
        run_id=RUN,
        command=(sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'ckpt'}"),
        cwd=tmp_path,
        site=TrainerSite({}, LocalProcessControl(), jobs, FakeCluster()),
        clock=clock,
    )


def _attempt(store: Store, tmp_path: Path) -> AttemptView:
    return store.start_attempt(RUN, metrics_path=str(tmp_path / "metrics.jsonl"), now=T0, command=["python"])


PLAN = StoredPlan(argv=("python", "-m", "trainer", "x=a b", "y=$(rm -rf /)"), env={"VERL_FILE_LOGGER_PATH": "/m.jsonl"})


# -- the pure parts --------------------------------------------------------------------------------------------------
def test_exit_status_of_each_job_status() -> None:
    assert exit_status_of(Info("PENDING")) is None
    assert exit_status_of(Info("RUNNING")) is None
    assert exit_status_of(Info("SUCCEEDED", driver_exit_code=0)) == ExitStatus(0, None)
    assert exit_status_of(Info("FAILED", driver_exit_code=3)) == ExitStatus(3, None)
    assert exit_status_of(Info("FAILED", driver_exit_code=-9)) == ExitStatus(None, 9)
    assert exit_status_of(Info("FAILED")) == ExitStatus(1, None)  # the supervisor died: no driver exit code
    stopped = exit_status_of(Info("STOPPED"))
    assert stopped is not None and stopped.signal is not None and stopped.exit_code is None


def test_entrypoint_quotes_every_word_and_creates_the_metrics_folder(tmp_path: Path) -> None:
    metrics = tmp_path / "run's $(touch pwned)" / "attempt-1" / "metrics.jsonl"
    line = entrypoint(PLAN.argv, tmp_path / "a dir", {"VERL_FILE_LOGGER_PATH": str(metrics), "OTHER": "/x/y"})
    assert line.count("mkdir -p -- ") == 1 and "/x" not in line  # only the folders verl does not create
    (tmp_path / "a dir").mkdir()
    out = subprocess.run(
        ["bash", "-c", line.replace("exec python -m trainer", "pwd; printf '%s\\n'")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [str(tmp_path / "a dir"), "x=a b", "y=$(rm -rf /)"]
    assert metrics.parent.is_dir() and not (tmp_path / "a dir" / "pwned").exists()
    assert "mkdir" not in entrypoint(PLAN.argv, tmp_path, {})  # nothing to create: the line as before
    relative = entrypoint(["t"], tmp_path, {"VERL_FILE_LOGGER_PATH": "logs/m.jsonl"})
    assert relative == f"cd {tmp_path} && mkdir -p -- logs && exec t"  # after the cd: where verl resolves it


# -- against the fake ------------------------------------------------------------------------------------------------
def test_launch_submits_once_with_the_plans_env(tmp_path: Path, store: Store) -> None:
    jobs = FakeJobs()
    trainer = _trainer(tmp_path, store, jobs)
    attempt = _attempt(store, tmp_path)
    trainer.launch(attempt, PLAN)
    sid = submission_id(RUN, attempt.number)
    assert [c for c in jobs.calls if c[0] == "submit"] == [("submit", sid)]
    sent = jobs.submitted[0]
    env = sent["runtime_env"]["env_vars"]  # type: ignore[index]
    assert env["VERL_FILE_LOGGER_PATH"] == "/m.jsonl"
    assert env["RAY_JOB_STOP_SIGNAL"] == "SIGINT" and env["RAY_JOB_STOP_WAIT_TIME_S"] == "3"
    assert sent["metadata"] == {"guardian_run": RUN, "guardian_attempt_id": str(attempt.id)}
    assert trainer.alive() is True and trainer.exit_status() is None
    record = json.loads((tmp_path / "run/attempt-1/command.json").read_text())
    assert record["ray_job"] == sid and record["entrypoint"] == sent["entrypoint"]
    assert (tmp_path / "run/attempt-1/metrics.jsonl").exists()

    # a guardian started again finds the job: no second submit
    again = _trainer(tmp_path, store, jobs)
    again.launch(attempt, PLAN)
    again.attach(attempt, PLAN.argv)
    assert len(jobs.submitted) == 1 and again.alive() is True


def test_a_job_of_another_store_is_refused(tmp_path: Path, store: Store) -> None:
    jobs = FakeJobs()
    attempt = _attempt(store, tmp_path)
    jobs.jobs[submission_id(RUN, 1)] = Info("RUNNING", metadata={"guardian_attempt_id": "999"})
    with pytest.raises(RayJobsError, match=r"another guardian store.*ray job delete"):
        _trainer(tmp_path, store, jobs).launch(attempt, PLAN)
    assert not jobs.submitted


def test_stop_waits_for_the_job_and_records_the_end(tmp_path: Path, store: Store) -> None:
    jobs = FakeJobs(stop_polls=3)
    trainer = _trainer(tmp_path, store, jobs)
    attempt = _attempt(store, tmp_path)
    trainer.launch(attempt, PLAN)
    trainer.stop(reason="entropy collapse")
    assert trainer.alive() is False
    status = trainer.exit_status()
    assert status is not None and status.signal is not None
    ended = store.latest_attempt(RUN)
    assert ended is not None and ended.ended_at is not None
    trainer.stop(reason="again")  # idempotent: a stopped job is not stopped twice
    assert [c for c in jobs.calls if c[0] == "stop"] == [("stop", submission_id(RUN, 1))]


def test_a_job_that_outlives_the_stop_is_reported(tmp_path: Path, store: Store) -> None:
    jobs = FakeJobs(stop_polls=None)
    clock = Clock()
    trainer = _trainer(tmp_path, store, jobs, clock)
    trainer.launch(_attempt(store, tmp_path), PLAN)
    with pytest.raises(StopFailedError, match=r"node node-a\) is still RUNNING.*ray job stop"):
        trainer.stop(reason="collapse")
    assert clock.now >= 4.0  # SIGINT + SIGTERM + SIGKILL waits


def test_output_tail_and_a_job_the_cluster_forgot(tmp_path: Path, store: Store) -> None:
    jobs = FakeJobs(logs="x" * 5000 + "Traceback: boom\n")
    trainer = _trainer(tmp_path, store, jobs)
    attempt = _attempt(store, tmp_path)
    trainer.launch(attempt, PLAN)
    assert trainer.output_tail().endswith("Traceback: boom") and len(trainer.output_tail()) <= 2048
    jobs.jobs.clear()  # the cluster was restarted
    forgot = _trainer(tmp_path, store, jobs)
    forgot.attach(attempt, PLAN.argv)
    status = forgot.exit_status()
    assert forgot.alive() is False and status is not None and status.lost
    assert forgot.output_tail() == ""


# -- survivors of a stopped job ---------------------------------------------------------------------------------------
def test_what_a_survivor_holds_decides_the_relaunch() -> None:
    in_group = Survivor("a" * 16, "W", "ALIVE", True, resources={"GPU_group_0_ab": 1.0, "GPU_group_ab": 1.0})
    assert in_group.held() == {"GPU": 1.0} and in_group.blocking() == {"GPU": 1.0}
    assert CPU_HELPER.blocking() == {}
    assert verdict([CPU_HELPER]).relaunch and not verdict([CPU_HELPER, GPU_KEEPER]).relaunch
    assert verdict([CPU_HELPER, GPU_KEEPER]).blocking == (GPU_KEEPER,)
    assert per_node([CPU_HELPER, GPU_KEEPER]) == {"10.0.0.5": {"CPU": 1.5, "GPU": 2.0}}
    named = kill_command(GPU_KEEPER, "http://head:8265")
    assert named.startswith("ray job submit --address http://head:8265 -- python -c ")
    assert named.endswith("""'import ray; ray.init(); ray.kill(ray.get_actor("keeper", namespace="ns"))'""")
    assert kill_command(CPU_HELPER, "http://head:8265") == "kill -9 77 on 10.0.0.5"


def test_a_survivor_holding_gpus_refuses_the_relaunch_until_it_is_gone(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    jobs, cluster = FakeJobs(), FakeCluster([[GPU_KEEPER, CPU_HELPER]])
    trainer = _trainer(tmp_path, store, jobs, cluster=cluster)
    trainer.launch(_attempt(store, tmp_path), PLAN)
    with pytest.raises(StopFailedError, match=r"Keeper 'keeper' \(detached actor a1b2c3d4e5f6.*GPU=2.*Refusing"):
        trainer.stop(reason="collapse")
    line = next(r.getMessage() for r in caplog.records if "event=job_survivors" in r.getMessage())
    assert "relaunch=refused" in line and "ray_job=02000000" in line and "GPU=2/8" in line
    ended = store.latest_attempt(RUN)
    assert ended is not None and ended.ended_at is not None  # the job's end is recorded before the refusal
    # the loop retries the stop: the job is not stopped twice, the survivors are read again
    with pytest.raises(StopFailedError):
        trainer.stop(reason="collapse")
    cluster.answers.append([])  # killed by hand
    trainer.stop(reason="collapse")
    assert [c for c in jobs.calls if c[0] == "stop"] == [("stop", submission_id(RUN, 1))]


def test_cpu_only_survivors_are_reported_and_the_relaunch_goes_ahead(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = _trainer(tmp_path, store, FakeJobs(), cluster=FakeCluster([[CPU_HELPER]]))
    trainer.launch(_attempt(store, tmp_path), PLAN)
    trainer.stop(reason="collapse")
    line = next(r.getMessage() for r in caplog.records if "event=job_survivors" in r.getMessage())
    assert "relaunch=goes_ahead" in line and "kill -9 77 on 10.0.0.5" in line


def test_owned_actors_are_given_the_grace_to_die_with_their_driver(tmp_path: Path, store: Store) -> None:
    clock, cluster = Clock(), FakeCluster([[OWNED], [OWNED], []])
    trainer = _trainer(tmp_path, store, FakeJobs(), clock, cluster)
    trainer.launch(_attempt(store, tmp_path), PLAN)
    trainer.stop(reason="collapse")  # an owned GPU actor that dies a moment later is no survivor
    assert cluster.reads == 3
    stuck = FakeCluster([[OWNED]])
    trainer = _trainer(tmp_path, store, FakeJobs(), clock, stuck)
    trainer.launch(_attempt(store, tmp_path), PLAN)
    started = clock.now
    with pytest.raises(StopFailedError, match="owned actor"):
        trainer.stop(reason="collapse")
    assert clock.now - started >= 10.0  # intervention.ray_survivor_grace_s


def test_a_state_api_that_does_not_answer_does_not_hold_the_relaunch(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = _trainer(tmp_path, store, FakeJobs(), cluster=FakeCluster(down=True))
    trainer.launch(_attempt(store, tmp_path), PLAN)
    trainer.stop(reason="collapse")
    line = next(r.getMessage() for r in caplog.records if "event=job_survivors_unknown" in r.getMessage())
    assert (
        "connection refused" in line and "ray list actors --address http://head:8265 --filter job_id=02000000" in line
    )


def test_a_job_that_ended_by_itself_has_its_survivors_reported_not_refused(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = FakeJobs()
    trainer = _trainer(tmp_path, store, jobs, cluster=FakeCluster([[GPU_KEEPER]]))
    trainer.launch(_attempt(store, tmp_path), PLAN)
    jobs.jobs[submission_id(RUN, 1)].status = "SUCCEEDED"
    trainer.finish(ExitStatus(0, None))
    line = next(r.getMessage() for r in caplog.records if "event=job_survivors" in r.getMessage())
    assert "relaunch=none_needed" in line and not [c for c in jobs.calls if c[0] == "stop"]


# -- the job's logs: mirror and metrics source ------------------------------------------------------------------------
def test_choose_the_metrics_source() -> None:
    assert choose("never", metrics_file_written=False, logs_have_steps=True) is Reading.METRICS_FILE
    assert choose("always", metrics_file_written=True, logs_have_steps=False) is Reading.JOB_LOGS
    assert choose("auto", metrics_file_written=True, logs_have_steps=True) is Reading.METRICS_FILE
    assert choose("auto", metrics_file_written=False, logs_have_steps=True) is Reading.JOB_LOGS
    assert choose("auto", metrics_file_written=False, logs_have_steps=False) is None


def test_the_mirror_appends_only_what_is_new_and_reads_once_more_at_the_end(tmp_path: Path) -> None:
    jobs, clock, ended = FakeJobs(), Clock(), [False]
    jobs.jobs["j"] = Info("RUNNING")
    path = tmp_path / "attempt-1" / JOB_LOG
    mirror = JobLogMirror(jobs, "j", path, 1.0, lambda: ended[0], monotonic=clock)
    jobs.logs = "config dump\n"
    assert mirror.pull() == 12
    jobs.logs += "step:1 - x:1\n"
    assert mirror.pull() == 0  # within ray_job_logs_poll_s
    clock.sleep(1.0)
    assert mirror.pull() == 13
    jobs.logs += "step:2 - x:2\n"
    ended[0] = True
    assert mirror.pull() == 13 and mirror.pull() == 0  # the last read, then no more
    assert path.read_text() == "config dump\nstep:1 - x:1\nstep:2 - x:2\n"
    # a guardian started again goes on from the file's size: nothing twice, nothing truncated
    again = JobLogMirror(jobs, "j", path, 1.0, lambda: True, monotonic=clock)
    jobs.logs += "done\n"
    assert again.pull() == 5 and path.read_text().endswith("step:2 - x:2\ndone\n")
    assert JobLogMirror(jobs, "gone", tmp_path / "g.log", 1.0, lambda: True).pull() == 0  # unknown to the cluster


def test_auto_reads_the_job_logs_only_while_the_metrics_file_is_out_of_sight(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_path, metrics = tmp_path / JOB_LOG, tmp_path / "metrics.jsonl"
    log_path.write_text("Total steps: 3\n(TaskRunner pid=12, ip=10.0.0.9) step:1 - critic/score/mean:np.float64(0.5)\n")
    metrics.touch()  # the guardian prepares it empty
    source = JobLogsSource(MetricsFile(metrics), ConsoleFile(log_path), None, "auto", RUN)
    held = source.poll()
    assert held.items == [] and held.more and source.reading is None  # the file may yet get its line
    batch = source.poll()
    assert [getattr(i, "step", None) for i in batch.items if hasattr(i, "step")] == [1]
    assert source.reading is Reading.JOB_LOGS and source.path == log_path
    assert any("event=metrics_from_job_logs" in r.getMessage() for r in caplog.records)
    # the file seen from the start: the JSONL is read, the console lines are not
    metrics.write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    local = JobLogsSource(MetricsFile(metrics), ConsoleFile(log_path), None, "auto", RUN)
    assert len([i for i in local.poll().items if hasattr(i, "step")]) == 1 and local.reading is Reading.METRICS_FILE
    # the console line seen a moment before the file's: the file is read, nothing twice
    raced = tmp_path / "raced.jsonl"
    raced.touch()
    racing = JobLogsSource(MetricsFile(raced), ConsoleFile(log_path), None, "auto", RUN)
    assert racing.poll().items == []
    raced.write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    assert len([i for i in racing.poll().items if hasattr(i, "step")]) == 1 and racing.reading is Reading.METRICS_FILE
    # neither yet: nothing, and undecided
    (tmp_path / "empty.log").write_text("loading the model\n")
    waiting = JobLogsSource(
        MetricsFile(tmp_path / "none.jsonl"), ConsoleFile(tmp_path / "empty.log"), None, "auto", RUN
    )
    assert waiting.poll().items == [] and waiting.reading is None


# -- a real Ray head -------------------------------------------------------------------------------------------------
TICKER = (
    "import json, sys, time\n"
    "path = sys.argv[1]\n"
    "for step in range(1, 10_000):\n"
    "    with open(path, 'a') as f:\n"
    "        f.write(json.dumps({'step': step, 'data': {'critic/score/mean': 0.1}}) + '\\n')\n"
    "    print('step', step, flush=True)\n"
    "    time.sleep(0.2)\n"
)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray head on CPU with its dashboard (the Jobs API); stopped at the end."""
    absent = [name for name in ("ray", "aiohttp", "aiohttp_cors") if importlib.util.find_spec(name) is None]
    if absent:
        missing(f"the Ray Jobs tests need ray with its dashboard ({', '.join(absent)} missing): {RAY_INSTALL}")
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        missing(f"the ray command is not installed beside this Python: {RAY_INSTALL}")
    tmp = tmp_path_factory.mktemp("ray")
    port = free_port()
    # token auth off: a head enables it when a token file from an earlier cluster is found in ~/.ray
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(tmp), "RAY_AUTH_MODE": "disabled"}
    # one logical GPU (no device behind it): what a survivor holding a GPU holds
    head = [ray, "start", "--head", "--num-cpus", "2", "--num-gpus", "1", "--include-dashboard=true"]
    head += ["--dashboard-host", "127.0.0.1"]
    head += ["--dashboard-port", str(port), "--port", str(free_port()), "--temp-dir", str(tmp), "--disable-usage-stats"]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=120, check=False)
    if started.returncode != 0:
        pytest.fail(f"ray start failed ({started.returncode}): {started.stderr[-2000:]}")
    try:
        address = f"http://127.0.0.1:{port}"
        _warm_up(address)
        yield address
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120, check=False)


def _warm_up(address: str, timeout_s: float = 180.0) -> None:
    """One throwaway job through the head (it stays in the head's job list): a fresh head's first submission
    starts its job agent and a worker (seconds on a busy 2-core machine), which would otherwise count against the
    first test's request bound (``ray.request_timeout_s``)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client = JobSubmissionClient(address)
            job = client.submit_job(entrypoint=f"{shlex.quote(sys.executable)} -c pass")
            break
        except Exception as exc:  # the dashboard is still starting
            if time.monotonic() > deadline:
                pytest.fail(f"the Ray head at {address} took no job within {timeout_s:.0f}s: {exc}")
            time.sleep(1.0)
    while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        if time.monotonic() > deadline:
            pytest.fail(f"the Ray head at {address} did not finish a trivial job within {timeout_s:.0f}s")
        time.sleep(0.5)
    assert status == JobStatus.SUCCEEDED, client.get_job_logs(job)[-2000:]


def _until(condition: object, timeout_s: float) -> float:
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s}s")
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.slow
def test_a_real_job_submitted_stopped_and_found_again(ray_head: str, tmp_path: Path, store: Store) -> None:
    client = connect(ray_head)
    config = _config(tmp_path, sigint=5.0, sigterm=2.0, sigkill=10.0)
    metrics = tmp_path / "metrics.jsonl"
    (tmp_path / "ticker.py").write_text(TICKER)
    plan = StoredPlan(argv=(sys.executable, "ticker.py", str(metrics)), env={"VERL_FILE_LOGGER_PATH": str(metrics)})

    def trainer() -> RayJobsTrainer:
        return RayJobsTrainer(config, store, RUN, client, RunFolder(tmp_path / "run"), tmp_path, clock=time.time)

    first = trainer()
    attempt = _attempt(store, tmp_path)
    first.launch(attempt, plan)
    sid = submission_id(RUN, attempt.number)
    to_running = _until(lambda: str(client.get_job_info(sid).status) == "RUNNING", 60)
    to_first_line = _until(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 60)
    assert first.alive() is True
    assert json.loads(metrics.read_text().splitlines()[0])["step"] == 1
    info = client.get_job_info(sid)
    assert (info.metadata or {}).get("guardian_attempt_id") == str(attempt.id)

    # a restarted guardian finds the running job by its submission id and does not submit a second
    again = trainer()
    again.launch(attempt, plan)
    runs_jobs = [j for j in client.list_jobs() if str(j.submission_id).startswith(f"guardian-{RUN}-")]  # type: ignore[attr-defined]
    assert again.alive() is True and len(runs_jobs) == 1

    stopping = time.monotonic()
    again.stop(reason="test")
    to_terminal = time.monotonic() - stopping
    assert str(client.get_job_info(sid).status) == "STOPPED"
    status = again.exit_status()
    assert status is not None and status.signal is not None and again.alive() is False
    assert "step 1" in again.output_tail()
    lines = metrics.read_text().count("\n")
    time.sleep(0.6)
    assert metrics.read_text().count("\n") == lines  # nothing writes any more
    print(  # the figures the report quotes (pytest -s)
        f"\nray jobs: submit->RUNNING {to_running:.2f}s, then 2 metrics lines {to_first_line:.2f}s, "
        f"stop->STOPPED {to_terminal:.2f}s"
    )


@pytest.mark.slow
def test_the_demo_collapse_guarded_as_ray_jobs(ray_head: str, tmp_path: Path) -> None:
    """guardian run --ray-address: the collapse is stopped with stop_job, rolled back, patched and resubmitted."""

    from guardian.commands.run import RunRequest, run_guarded
    from guardian.rescue.policy import State

    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    request = RunRequest(tuple(collapse_command(ckpt)), REPO_ROOT, "ray-collapse", ray_address=ray_head)
    started = time.monotonic()
    assert run_guarded(config, request) == 0
    with Store.open(config.database_url()) as store:
        (intervention,) = [i for i in store.interventions("ray-collapse") if i.state != State.RELAPSED]
        assert intervention.state == State.RESOLVED
        attempts = store.attempts("ray-collapse")
    client = connect(ray_head)
    assert len(attempts) >= 2
    assert str(client.get_job_info(submission_id("ray-collapse", 1)).status) == "STOPPED"
    assert str(client.get_job_info(submission_id("ray-collapse", len(attempts))).status) == "SUCCEEDED"
    record = json.loads((home / "runs/ray-collapse/attempt-2/command.json").read_text())
    assert f"trainer.resume_from_path={ckpt}/global_step_{intervention.target_step}" in record["argv"]
    print(f"\nray jobs demo: collapse -> resolved in {time.monotonic() - started:.1f}s, {len(attempts)} jobs")


# verl's file logger: opens $VERL_FILE_LOGGER_PATH as given, without creating its folder (tracking.py FileLogger)
FILE_LOGGER_TICKER = (
    "import json, os, time\n"
    "out = open(os.environ['VERL_FILE_LOGGER_PATH'], 'wb', buffering=0)\n"
    "for step in range(1, 10_000):\n"
    "    out.write(json.dumps({'step': step, 'data': {'critic/score/mean': 0.1}}).encode() + b'\\n')\n"
    "    time.sleep(0.2)\n"
)


@dataclass
class FolderGoneAtSubmit:
    """The real Jobs API, but the attempt's folder is removed just before the job is submitted: the guardian created
    it on its own machine only, and the driver's node has no such folder."""

    client: JobsClient
    folder: Path

    def submit_job(
        self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, object], metadata: dict[str, str]
    ) -> str:
        shutil.rmtree(self.folder)
        return self.client.submit_job(
            entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env, metadata=metadata
        )

    def stop_job(self, job_id: str) -> bool:
        return self.client.stop_job(job_id)

    def get_job_info(self, job_id: str) -> JobInfo:
        return self.client.get_job_info(job_id)

    def get_job_logs(self, job_id: str) -> str:
        return self.client.get_job_logs(job_id)


@pytest.mark.slow
def test_a_job_whose_metrics_folder_is_missing_on_its_node_still_writes_its_metrics(
    ray_head: str, tmp_path: Path, store: Store
) -> None:
    client = connect(ray_head)
    (tmp_path / "file_logger.py").write_text(FILE_LOGGER_TICKER)
    folder = RunFolder(tmp_path / "run's folder")
    run_id = "ray-no-folder"
    attempt = _attempt(store, tmp_path)
    metrics = folder.metrics(attempt.number)
    gone = FolderGoneAtSubmit(client, folder.attempt(attempt.number))
    config = _config(tmp_path, sigint=5.0, sigterm=2.0, sigkill=10.0)
    trainer = RayJobsTrainer(config, store, run_id, gone, folder, tmp_path, clock=time.time)
    trainer.start(
        attempt.id, attempt.number, (sys.executable, "file_logger.py"), {"VERL_FILE_LOGGER_PATH": str(metrics)}
    )
    sid = submission_id(run_id, attempt.number)

    def written_or_ended() -> bool:
        return (metrics.exists() and metrics.read_text().count("\n") >= 2) or trainer.exit_status() is not None

    try:
        _until(written_or_ended, 90)
    finally:
        trainer.halt(reason="test")
    assert metrics.exists(), f"no metrics; the job's logs: {client.get_job_logs(sid)[-2000:]}"
    assert json.loads(metrics.read_text().splitlines()[0])["step"] == 1


KEEPER = (
    "import ray, time\n"
    "ray.init()\n"
    "@ray.remote(num_cpus=0.1, num_gpus=1)\n"
    "class Keeper:\n"
    "    def ping(self):\n"
    "        return 1\n"
    "@ray.remote(num_cpus=0.1)\n"
    "class Owned:\n"
    "    def ping(self):\n"
    "        return 1\n"
    "keeper = Keeper.options(lifetime='detached', name='keeper', namespace='guardian-test').remote()\n"
    "owned = Owned.remote()\n"
    "ray.get([keeper.ping.remote(), owned.ping.remote()])\n"
    "print('actors up', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.2)\n"
)


def _run_printed(command: str) -> None:
    """Run a kill command as the guardian printed it, with this venv's ray and python."""
    argv = shlex.split(command)
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    assert argv[0] == "ray" and ray is not None and argv[argv.index("--") + 1] == "python"
    argv[0], argv[argv.index("--") + 1] = ray, sys.executable
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_a_detached_actor_holding_a_gpu_outlives_its_stopped_job_and_holds_the_relaunch(
    ray_head: str, tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver leaves a detached actor holding the head's (logical) GPU: the stop reports it and refuses the
    relaunch with the command that kills it; once it is killed that way the stop goes through. The owned actor died
    with its driver and is no survivor. The job is kept."""
    client = connect(ray_head)
    (tmp_path / "keeper.py").write_text(KEEPER)
    config = _config(tmp_path, sigint=5.0, sigterm=2.0, sigkill=10.0)
    # its own job ids: the module's cluster keeps the jobs of the tests before (guardian-ray-run-1-1 among them)
    run_id = "ray-survivor"
    trainer = RayJobsTrainer(
        config,
        store,
        run_id,
        client,
        RunFolder(tmp_path / "run"),
        tmp_path,
        clock=time.time,
        cluster=StateApi(ray_head),
    )
    attempt = _attempt(store, tmp_path)
    trainer.launch(attempt, StoredPlan(argv=(sys.executable, "keeper.py"), env={}))
    sid = submission_id(run_id, attempt.number)
    _until(lambda: "actors up" in client.get_job_logs(sid), 90)
    with pytest.raises(StopFailedError, match=r"Keeper 'keeper' \(detached actor .*GPU=1.*Refusing to relaunch") as err:
        trainer.stop(reason="test")
    line = next(r.getMessage() for r in caplog.records if "event=job_survivors " in r.getMessage())
    assert "relaunch=refused" in line and "detached=1" in line and "Owned" not in line
    job_id = str(client.get_job_info(sid).job_id)
    (keeper,) = StateApi(ray_head).survivors(job_id)
    kill = kill_command(keeper, ray_head)
    assert kill in str(err.value)  # the log line carries it too, quoted
    _run_printed(kill)
    _until(lambda: not StateApi(ray_head).survivors(job_id), 30)
    trainer.stop(reason="test")  # nothing left: the relaunch may go ahead
    assert str(client.get_job_info(sid).status) == "STOPPED"  # kept, not deleted


# the demo trainer as if on another node: its file logger writes where this guardian does not look
OTHER_NODE = (
    "import os, runpy, sys\n"
    "hidden = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'other-node', 'metrics.jsonl')\n"
    "key = '++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='\n"
    "sys.argv = ['guardian.demo.trainer'] + [key + hidden if a.startswith(key) else a for a in sys.argv[1:]]\n"
    "os.environ['VERL_FILE_LOGGER_PATH'] = hidden\n"
    "sys.path.insert(0, os.getcwd())\n"
    "runpy.run_module('guardian.demo.trainer', run_name='__main__')\n"
)


@pytest.mark.slow
def test_the_collapse_guarded_from_the_job_logs_alone(ray_head: str, tmp_path: Path) -> None:
    """The metrics file is on 'another node': the guardian reads verl's console lines from the mirrored job logs
    (sources.ray_job_logs auto) and still stops, rolls back, patches and resolves the collapse."""

    from guardian.commands.run import RunRequest, run_guarded
    from guardian.rescue.policy import State

    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    (tmp_path / "other-node").mkdir()
    (tmp_path / "other_node.py").write_text(OTHER_NODE)
    command = [sys.executable, str(tmp_path / "other_node.py"), *collapse_command(ckpt)[3:]]
    config = config_for(home)
    assert run_guarded(config, RunRequest(tuple(command), REPO_ROOT, "ray-logs", ray_address=ray_head)) == 0
    with Store.open(config.database_url()) as store:
        (intervention,) = [i for i in store.interventions("ray-logs") if i.state != State.RELAPSED]
        assert intervention.state == State.RESOLVED
        attempts = store.attempts("ray-logs")
    run = home / "runs/ray-logs"
    assert (tmp_path / "other-node/metrics.jsonl").stat().st_size > 0  # written, only not where the guardian looks
    for attempt in attempts:
        assert not (run / f"attempt-{attempt.number}/metrics.jsonl").read_bytes()  # prepared empty, never written
        assert "step:1 - " in (run / f"attempt-{attempt.number}" / JOB_LOG).read_text() or attempt.number > 1
    guardian_log = (run / "guardian.log").read_text()
    assert guardian_log.count("event=metrics_from_job_logs") >= len(attempts)


@pytest.mark.slow
def test_a_guardian_killed_while_its_job_runs_is_attached_again_and_submits_nothing_twice(
    ray_head: str, tmp_path: Path
) -> None:
    """guardian run --ray-address, SIGKILLed while attempt 1 runs; guardian run --attach finds the running job
    (event=job_attached), submits no second one for it, and guards the run to its end."""

    from guardian.rescue.policy import State

    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    (tmp_path / "guardian.yaml").write_text(
        "sources: {poll_interval_s: 0.05}\n"
        "intervention: {probation_steps: 15, stop_sigint_s: 5, stop_sigterm_s: 5, stop_sigkill_s: 5}\n"
    )
    guardian = [
        sys.executable,
        "-m",
        "guardian",
        "--log-level",
        "WARNING",
        "run",
        "--config",
        str(tmp_path / "guardian.yaml"),
    ]
    env = {**os.environ, "GUARDIAN_HOME": str(home), "PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}
    env.pop("GUARDIAN_DB_URL", None)
    first_log = (tmp_path / "first.log").open("wb")
    first = subprocess.Popen(
        [*guardian, "--no-live", "--run-id", "ray-kill", "--ray-address", ray_head, "--", *collapse_command(ckpt)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=first_log,
    )
    client = connect(ray_head)
    sid = submission_id("ray-kill", 1)
    metrics = home / "runs/ray-kill/attempt-1/metrics.jsonl"
    try:
        _until(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 120)
    finally:
        first.kill()  # SIGKILL: no goodbye, the job goes on
        first.wait(30)
        first_log.close()
    assert b"event=job_submitted run=ray-kill attempt=1" in (tmp_path / "first.log").read_bytes()
    assert str(client.get_job_info(sid).status) == "RUNNING"
    second = subprocess.run(
        [*guardian, "--no-live", "--attach", "ray-kill"], cwd=REPO_ROOT, env=env, capture_output=True, timeout=400
    )
    stderr = second.stderr.decode()
    assert second.returncode == 0, stderr[-3000:]
    assert f"event=job_attached run=ray-kill attempt=1 job={sid} status=RUNNING" in stderr
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        attempts = store.attempts("ray-kill")
        interventions = store.interventions("ray-kill")
    ours = sorted(
        str(j.submission_id) for j in client.list_jobs() if str(j.submission_id).startswith("guardian-ray-kill-")
    )  # type: ignore[attr-defined]
    assert ours == sorted(submission_id("ray-kill", a.number) for a in attempts)  # one job per attempt, no second
    assert any(i.state == State.RESOLVED for i in interventions)
    assert stderr.count("event=job_submitted") == len(attempts) - 1  # the second guardian submitted only relaunches


@pytest.mark.slow
def test_measure_submit_to_first_step_and_stop_to_terminal(ray_head: str, tmp_path: Path, store: Store) -> None:
    """The figures the report quotes (pytest -s): submit -> the first step the guardian's source returns (the
    metrics file; the job logs' mirror), and stop_job -> terminal, 3 runs each."""
    client = connect(ray_head)
    config = _config(tmp_path, sigint=5.0, sigterm=2.0, sigkill=10.0)
    (tmp_path / "ticker.py").write_text(CONSOLE_TICKER)
    to_file: list[float] = []
    to_logs: list[float] = []
    to_terminal: list[float] = []
    for run in range(3):
        metrics = tmp_path / f"metrics-{run}.jsonl"
        folder = RunFolder(tmp_path / f"run-{run}")
        trainer = RayJobsTrainer(config, store, f"{RUN}-m{run}", client, folder, tmp_path, clock=time.time)
        attempt = store.start_attempt(RUN, metrics_path=str(metrics), now=T0, command=["python"])
        plan = StoredPlan(argv=(sys.executable, "ticker.py", str(metrics)), env={})
        submitted = time.monotonic()
        trainer.launch(attempt, plan)
        file_source = MetricsFile(metrics)
        mirror = trainer.log_mirror(attempt.number, folder.attempt(attempt.number) / JOB_LOG)
        log_source = JobLogsSource(MetricsFile(tmp_path / "none"), ConsoleFile(mirror.path), mirror, "always", RUN)
        seen: dict[str, float] = {}
        while len(seen) < 2 and time.monotonic() - submitted < 120:
            for name, source in (("file", file_source), ("logs", log_source)):
                if name not in seen and any(hasattr(i, "step") for i in source.poll().items):
                    seen[name] = time.monotonic() - submitted
            time.sleep(0.05)
        to_file.append(seen["file"])
        to_logs.append(seen["logs"])
        stopping = time.monotonic()
        trainer.halt(reason="measure")
        to_terminal.append(time.monotonic() - stopping)
        assert trainer.exit_status() is not None

    def span(values: list[float]) -> str:
        return f"{min(values):.2f}-{max(values):.2f}s"

    print(
        f"\nray jobs, 3 runs: submit->first step from the metrics file {span(to_file)}, from the job logs "
        f"{span(to_logs)} (ray_job_logs_poll_s {config.sources.ray_job_logs_poll_s}); "
        f"stop->terminal {span(to_terminal)}"
    )


CONSOLE_TICKER = (
    "import json, sys, time\n"
    "path = sys.argv[1]\n"
    "for step in range(1, 10_000):\n"
    "    print(f'step:{step} - critic/score/mean:np.float64(0.1)', flush=True)\n"
    "    with open(path, 'a') as f:\n"
    "        f.write(json.dumps({'step': step, 'data': {'critic/score/mean': 0.1}}) + '\\n')\n"
    "    time.sleep(0.2)\n"
)


# ------------------------------------------------------------------------------- the Jobs API goes away


@dataclass
class FlakyJobs(FakeJobs):
    """The Jobs API whose dashboard can be taken away: while ``down`` every call is refused, as requests does."""

    down: bool = False

    def _answer(self) -> None:
        if self.down:
            raise ConnectionError("HTTPConnectionPool(host='head', port=8265): Max retries exceeded (refused)")

    def stop_job(self, job_id: str) -> bool:
        self._answer()
        return super().stop_job(job_id)

    def get_job_info(self, job_id: str) -> Info:
        self._answer()
        return super().get_job_info(job_id)


def _line(step: int, entropy: float | None) -> str:
    data = {"actor/entropy": entropy, "critic/score/mean": 0.5, "response_length/mean": 300.0, "actor/grad_norm": 1.0}
    return json.dumps({"step": step, "data": data}) + "\n"


def _healthy_steps_then_nan_with_the_api_down(
    supervisor: Supervisor, store: Store, jobs: FlakyJobs | HangingJobs
) -> None:
    """The run registered and launched; three healthy steps ticked; then the Jobs API goes down and the trainer
    logs NaN steps 4-6 (nobody can reach its control)."""
    from guardian.commands.run import register_run

    register_run(store, supervisor.layout, mode=supervisor.config.mode, name="ray")
    supervisor.start()
    metrics = supervisor.folder.metrics(1)
    with metrics.open("a") as out:
        out.writelines(_line(step, 0.7) for step in range(1, 4))
    assert supervisor.tick() is None
    jobs.down = True
    with metrics.open("a") as out:
        out.writelines(_line(step, None) for step in range(4, 7))


def test_while_the_jobs_api_is_down_the_metrics_are_still_judged_and_the_rescue_waits_for_it(tmp_path: Path) -> None:
    from guardian.loop.guard import guard
    from guardian.loop.pace import PollPace

    config = _config(tmp_path).model_copy(update={"tick_failure_limit": 3, "outage_limit_s": 60.0})
    jobs = FlakyJobs(stop_polls=0)
    clock = Clock()
    with Store.open(config.database_url()) as store:
        supervisor = _supervisor(config, store, tmp_path, jobs, clock)
        _healthy_steps_then_nan_with_the_api_down(supervisor, store, jobs)
        for _ in range(3):  # a critical finding ends a tick's reading at its step (the rescue acts there)
            with pytest.raises(ConnectionError):
                supervisor.tick()
        assert supervisor.incident_tick.history.last_step == 6
        (incident,) = store.list_incidents(RUN)
        assert incident.check == "non_finite" and incident.is_open  # judged, stored, alerted
        assert not store.interventions(RUN) and ("stop", f"guardian-{RUN}-1") not in jobs.calls

        # the guard loop rides the outage out past tick_failure_limit ticks, then the rescue goes on
        ticks = {"n": 0}

        def wait(seconds: float) -> bool:
            ticks["n"] += 1
            clock.now += 1.0
            jobs.down = ticks["n"] < 6
            return ticks["n"] > 12

        code = guard(
            supervisor,
            pace=PollPace(0.0, 0.0),
            wait=wait,
            failure_limit=config.tick_failure_limit,
            outage_limit_s=config.outage_limit_s,
            resume="",
        )
        assert code is None  # told to stop (wait), never gave up
        assert ("stop", f"guardian-{RUN}-1") in jobs.calls  # the rescue stopped the job once the API answered
        assert store.interventions(RUN)


def test_a_guardian_that_gives_up_while_the_jobs_api_is_down_says_the_trainer_is_unknown(
    tmp_path: Path, store: Store
) -> None:

    jobs = FlakyJobs()
    supervisor = _supervisor(_config(tmp_path), store, tmp_path, jobs, Clock())
    supervisor.start()
    jobs.down = True
    alerts: list[object] = []
    supervisor.announce = alerts.append
    assert supervisor.cannot_continue(cause="the Jobs API is down", fix="fix it") == 1
    assert alerts and "unknown, UNGUARDED" in str(alerts[0])


# ------------------------------------------------------------------------------- a dashboard that does not answer
BOUND_S = 0.5  # ray.request_timeout_s in these tests
SLACK_S = 1.5  # what a call may take past the bound (a loaded machine)


class SilentDashboard:
    """A dashboard on loopback that answers Ray's version check (``answers_version``) and leaves every other request
    it reads unanswered, the connection held open: a hung dashboard. ``backlog_full``: it never accepts, and its
    accept queue is filled first, so the kernel drops the next connections' SYNs: packets dropped on the way."""

    def __init__(self, *, answers_version: bool = True, backlog_full: bool = False) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(0)
        self.address = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.answers_version = answers_version
        self.held: list[socket.socket] = []
        self.requests: list[str] = []
        self._closed = threading.Event()
        if backlog_full:
            self._fill_backlog()
        else:
            threading.Thread(target=self._serve, daemon=True).start()

    def _fill_backlog(self) -> None:
        while True:
            sock = socket.socket()
            sock.settimeout(0.3)
            self.held.append(sock)
            try:
                sock.connect(self.server.getsockname())
            except TimeoutError:
                return  # the queue is full: this SYN was dropped

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            self.held.append(conn)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode(errors="replace")
            self.requests.append(line)
            if self.answers_version and line.startswith("GET /api/version "):
                body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    def __enter__(self) -> SilentDashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self.server.close()
        for sock in self.held:
            sock.close()


def _timed(call: Callable[[], object]) -> tuple[Exception, float]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # the test looks at what it is
        return exc, time.monotonic() - started
    raise AssertionError("the call returned: the dashboard answered")


@pytest.mark.parametrize("backlog_full", [False, True], ids=["accepted-never-answered", "packets-dropped"])
def test_connecting_to_a_dashboard_that_does_not_answer_fails_within_the_bound(backlog_full: bool) -> None:
    pytest.importorskip("ray.job_submission")
    with SilentDashboard(answers_version=False, backlog_full=backlog_full) as dashboard:
        exc, seconds = _timed(lambda: connect(dashboard.address, timeout_s=BOUND_S))
    assert isinstance(exc, RayJobsError) and is_outage(exc)
    assert BOUND_S <= seconds < BOUND_S + SLACK_S, seconds
    assert dashboard.address in str(exc) and "GET /api/version" in str(exc) and "ray.request_timeout_s" in str(exc)
    print(f"\nhung dashboard ({'SYN dropped' if backlog_full else 'no answer'}): connect failed in {seconds:.2f}s")


def test_every_call_to_a_hung_jobs_api_fails_as_an_outage_within_the_bound_and_a_tick_pays_it_once() -> None:
    pytest.importorskip("ray.job_submission")
    with SilentDashboard() as dashboard:
        client = connect(dashboard.address, timeout_s=BOUND_S)
        calls: dict[str, Callable[[], object]] = {
            "POST /api/jobs/": lambda: client.submit_job(
                entrypoint="true", submission_id="guardian-x-1", runtime_env={}, metadata={}
            ),
            "POST /api/jobs/guardian-x-1/stop": lambda: client.stop_job("guardian-x-1"),
            "GET /api/jobs/guardian-x-1": lambda: client.get_job_info("guardian-x-1"),
            "GET /api/jobs/guardian-x-1/logs": lambda: client.get_job_logs("guardian-x-1"),
        }
        for name, call in calls.items():
            exc, seconds = _timed(call)
            assert isinstance(exc, JobsApiTimeout) and is_outage(exc), repr(exc)
            assert BOUND_S <= seconds < BOUND_S + SLACK_S, (name, seconds)
            assert f"did not answer {name} within 0.5s (ray.request_timeout_s)" in str(exc)
            assert dashboard.address in str(exc)
            # the calls right after it fail at once, unsent: a tick pays the timeout once, not once per call
            again, fast = _timed(calls["GET /api/jobs/guardian-x-1"])
            assert isinstance(again, JobsApiTimeout) and "not sent" in str(again) and fast < 0.1
            time.sleep(BOUND_S)  # then the dashboard is asked again
        sent = [line.split(" HTTP/")[0] for line in dashboard.requests if "/api/version" not in line]
        assert sent == list(calls)  # one request per call: the unsent ones never reached it


def test_a_state_api_that_does_not_answer_fails_within_the_bound() -> None:
    pytest.importorskip("ray.util.state")
    with SilentDashboard() as dashboard:
        exc, seconds = _timed(lambda: StateApi(dashboard.address, timeout_s=1.0).survivors("02000000"))
    assert isinstance(exc, RuntimeError) and "ray.request_timeout_s (1s)" in str(exc) and is_outage(exc)
    assert 1.0 <= seconds < 1.0 + SLACK_S, seconds  # Ray's State API waits at least 1 s


@dataclass
class HangingJobs:
    """The Jobs API of ``fake`` while it answers; while ``down`` each call goes to a dashboard that never answers,
    through the guardian's real bounded client."""

    fake: FakeJobs
    hung: JobsClient
    down: bool = False

    def _to(self) -> JobsClient:
        return self.hung if self.down else self.fake

    def submit_job(
        self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, object], metadata: dict[str, str]
    ) -> str:
        return self._to().submit_job(
            entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env, metadata=metadata
        )

    def stop_job(self, job_id: str) -> bool:
        return self._to().stop_job(job_id)

    def get_job_info(self, job_id: str) -> JobInfo:
        return self._to().get_job_info(job_id)

    def get_job_logs(self, job_id: str) -> str:
        return self._to().get_job_logs(job_id)


def test_a_tick_while_the_dashboard_hangs_judges_the_metrics_and_fails_as_an_outage_in_one_bound(
    tmp_path: Path,
) -> None:
    """The tick reads the exit status (times out), the metrics (judged: the incident opens), the checks' 'is it
    alive' and the job-log mirror (both fail at once): one bound, not three."""
    pytest.importorskip("ray.job_submission")

    config = _config(tmp_path)
    with SilentDashboard() as dashboard, Store.open(config.database_url()) as store:
        jobs = HangingJobs(FakeJobs(), connect(dashboard.address, timeout_s=BOUND_S))
        supervisor = _supervisor(config, store, tmp_path, jobs, time.time)
        _healthy_steps_then_nan_with_the_api_down(supervisor, store, jobs)
        exc, seconds = _timed(supervisor.tick)
        assert isinstance(exc, JobsApiTimeout) and is_outage(exc)
        assert BOUND_S <= seconds < BOUND_S + SLACK_S, seconds
        (incident,) = store.list_incidents(RUN)
        assert incident.check == "non_finite" and incident.is_open  # judged while the control did not answer
        print(f"\na tick while the dashboard hangs: {seconds:.2f}s with ray.request_timeout_s {BOUND_S}")


# ------------------------------------------------------- ray.address: guardian.yaml's --ray-address
def test_the_flag_then_the_runs_stored_address_then_ray_address() -> None:
    from guardian.commands.run import ray_address_of

    config = GuardianConfig.model_validate({"ray": {"address": "http://cfg:8265"}})
    stored = {"command": ["python"], "ray_address": "http://stored:8265"}
    assert ray_address_of("http://flag:8265", stored, config) == "http://flag:8265"
    assert ray_address_of(None, stored, config) == "http://stored:8265"  # re-attached: the address it started with
    assert ray_address_of(None, {"command": ["python"]}, config) is None  # a known local run stays local
    assert ray_address_of(None, None, config) == "http://cfg:8265"  # a new run
    assert ray_address_of(None, None, GuardianConfig()) is None


def test_the_ray_section_is_checked_field_by_field(tmp_path: Path) -> None:
    from guardian.config import ConfigError, load_config

    good = tmp_path / "good.yaml"
    good.write_text("ray:\n  address: http://head:8265\n  request_timeout_s: 2.5\n")
    loaded = load_config(good, env={})
    assert (loaded.ray.address, loaded.ray.request_timeout_s) == ("http://head:8265", 2.5)
    assert GuardianConfig().ray.request_timeout_s == 10.0 and GuardianConfig().ray.address is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("ray:\n  request_timeout_s: 0\n  adress: http://head:8265\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad, env={})
    assert "ray.request_timeout_s: Input should be greater than 0" in str(err.value)
    assert "ray.adress: unknown key" in str(err.value)


def _refused() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: the dashboard refuses at once


def test_guardian_run_submits_to_ray_address_unless_the_flag_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from guardian.cli import main

    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    from_config, from_flag = _refused(), _refused()
    config = tmp_path / "guardian.yaml"
    config.write_text(f"ray:\n  address: {from_config}\n  request_timeout_s: 2\n")
    command = ["--", sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    run = ["--log-level", "WARNING", "run", "--config", str(config), "--no-live"]
    assert main([*run, "--run-id", "from-config", *command]) == 1
    assert main([*run, "--run-id", "from-flag", "--ray-address", from_flag, *command]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if "event=ray_unavailable" in line]
    assert len(lines) == 2
    assert f"run=from-config address={from_config}" in lines[0] and f"address={from_flag}" not in lines[0]
    assert f"run=from-flag address={from_flag}" in lines[1]


def test_a_fleet_run_takes_its_own_ray_address_else_its_configs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from guardian.commands.fleet import guard_fleet
    from guardian.fleet.spec import load_fleet

    own, configured = _refused(), _refused()
    (tmp_path / "ray.yaml").write_text(f"ray:\n  address: {configured}\n")
    fleet = tmp_path / "fleet.yaml"
    command = f"[{sys.executable}, -m, verl.trainer.main_ppo, 'trainer.default_local_dir={tmp_path / 'ckpt'}']"
    fleet.write_text(
        "runs:\n"
        f"  - {{run_id: own, command: {command}, config: ray.yaml, ray_address: '{own}'}}\n"
        f"  - {{run_id: configured, command: {command}, config: ray.yaml}}\n"
    )
    base = GuardianConfig.model_validate({"home": str(tmp_path / "home")})
    codes = guard_fleet(base, load_fleet(fleet, base), threading.Event())
    assert codes == {"own": 1, "configured": 1}
    lines = [r.getMessage() for r in caplog.records if "event=ray_unavailable" in r.getMessage()]
    assert any(f"run=own address={own}" in line for line in lines)
    assert any(f"run=configured address={configured}" in line for line in lines)


@pytest.mark.slow
def test_one_fleet_guards_a_local_run_and_a_collapse_run_as_ray_jobs(ray_head: str, tmp_path: Path) -> None:
    """guardian fleet: one run a local process group, one run submitted to the cluster (its ray_address); the
    collapse on the cluster is rescued through the Jobs API while the local run goes on, both in one store."""
    import threading

    from guardian.commands.fleet import guard_fleet
    from guardian.fleet.spec import load_fleet
    from guardian.rescue.policy import State

    local = [sys.executable, "-m", "guardian.demo.trainer", "trainer.total_training_steps=60", "trainer.save_freq=10"]
    local += [f"trainer.default_local_dir={tmp_path / 'ckpt-local'}", "+trainer.fault.slow_steps=0.05"]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "runs:\n"
        f"  - run_id: fleet-local\n    command: {local!r}\n"
        f"  - run_id: fleet-on-ray\n    command: {collapse_command(tmp_path / 'ckpt-ray')!r}\n"
        f"    cwd: {REPO_ROOT}\n    ray_address: {ray_head}\n"
    )
    config = config_for(tmp_path / "home")
    codes = guard_fleet(config, load_fleet(fleet, config), threading.Event())
    assert codes == {"fleet-local": 0, "fleet-on-ray": 0}
    with Store.open(config.database_url()) as store:
        (intervention,) = [i for i in store.interventions("fleet-on-ray") if i.state != State.RELAPSED]
        assert intervention.state == State.RESOLVED
        assert not store.interventions("fleet-local")
        assert store.latest_step("fleet-local")[0] == 60  # type: ignore[index]
        attempts = len(store.attempts("fleet-on-ray"))
    client = connect(ray_head)
    assert str(client.get_job_info(submission_id("fleet-on-ray", 1)).status) == "STOPPED"
    assert str(client.get_job_info(submission_id("fleet-on-ray", attempts)).status) == "SUCCEEDED"
    with pytest.raises(RuntimeError, match="404"):  # the local run never went to the cluster
        client.get_job_info(submission_id("fleet-local", 1))
