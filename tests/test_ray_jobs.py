"""guardian.rescue.ray_jobs: the trainer as Ray Jobs - against a recording fake of the Jobs API, and against a real
local Ray head on CPU (submit, RUNNING, stop, STOPPED, re-attach by submission id)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import free_port, missing

from guardian.actions.launcher import RunFolder
from guardian.actions.process import ExitStatus
from guardian.config import GuardianConfig
from guardian.rescue.local import StopFailedError
from guardian.rescue.ray_jobs import (
    RAY_INSTALL,
    JobsClient,
    RayJobsError,
    RayJobsTrainer,
    connect,
    entrypoint,
    exit_status_of,
    submission_id,
)
from guardian.store import AttemptView, Store, StoredPlan

T0 = 1_800_000_000.0
REPO_ROOT = Path(__file__).resolve().parents[1]  # the demo trainer is imported from here by the job
RUN = "ray-run-1"


@dataclass
class Info:
    status: str
    message: str | None = None
    driver_exit_code: int | None = None
    driver_node_id: str | None = "node-a"
    metadata: dict[str, str] | None = None


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


def _trainer(tmp_path: Path, store: Store, client: JobsClient, clock: Clock | None = None) -> RayJobsTrainer:
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


def test_entrypoint_quotes_every_word(tmp_path: Path) -> None:
    line = entrypoint(PLAN.argv, tmp_path / "a dir")
    (tmp_path / "a dir").mkdir()
    out = subprocess.run(
        ["bash", "-c", line.replace("exec python -m trainer", "pwd; printf '%s\\n'")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [str(tmp_path / "a dir"), "x=a b", "y=$(rm -rf /)"]


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
    head = [ray, "start", "--head", "--num-cpus", "2", "--include-dashboard=true", "--dashboard-host", "127.0.0.1"]
    head += ["--dashboard-port", str(port), "--port", str(free_port()), "--temp-dir", str(tmp), "--disable-usage-stats"]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=120, check=False)
    if started.returncode != 0:
        pytest.fail(f"ray start failed ({started.returncode}): {started.stderr[-2000:]}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120, check=False)


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
    assert again.alive() is True and len(client.list_jobs()) == 1  # type: ignore[attr-defined]

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
    from test_run_e2e import collapse_command, config_for

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
