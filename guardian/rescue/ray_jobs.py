"""The rescue's ``TrainerPort`` for a trainer run as a Ray Job (the dashboard's Jobs API), in place of ``rescue.local``.

Invariants: one job per attempt, its submission id derived from run id and attempt, so a restarted guardian
finds it instead of submitting twice; a job of that id from another store is refused; terminal jobs are kept as
evidence; never two trainers at once (a live job or GPU-holding survivors refuse the relaunch). Not covered:
other drivers' workers, checkpoints the guardian cannot read. Why: docs/decisions/0052-ray-jobs-stop.md."""

from __future__ import annotations

import math
import shlex
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from guardian.actions.launcher import RunFolder, prepare_attempt
from guardian.actions.process import LOST, ExitStatus
from guardian.config import RAY_REQUEST_TIMEOUT_S, GuardianConfig
from guardian.extras import MissingExtra, install_line, need
from guardian.logs import event, get_logger
from guardian.rescue.local import OUTPUT_TAIL_BYTES, StopFailedError
from guardian.rescue.ports import Launched
from guardian.rescue.ray_logs import JobLogMirror
from guardian.rescue.ray_survivors import (
    ClusterState,
    Survivor,
    Verdict,
    fields_of,
    kill_command,
    still_settling,
    verdict,
)
from guardian.store import AttemptView, Store, StoredPlan

log = get_logger("ray_jobs")

RAY_INSTALL = install_line("ray")  # ray[default]==2.60.0, the version the client is tested with
LIVE = frozenset({"PENDING", "RUNNING"})
STOP_SIGNAL = signal.SIGINT  # what stop_job sends first (RAY_JOB_STOP_SIGNAL); a STOPPED job reads as killed by it
POLL_S = 0.2
NOT_FOUND = "status code 404"  # JobSubmissionClient raises RuntimeError with the HTTP status in its text
# the attempt's env vars naming a file whose folder verl does not create: its file logger opens the path as given
# (tracking.py FileLogger). verl creates the rollout dump and checkpoint folders itself.
FOLDER_MUST_EXIST = ("VERL_FILE_LOGGER_PATH",)


class RayJobsError(RuntimeError):
    """The Ray cluster or its Jobs API cannot do what the guardian needs; the message says what to do."""


class JobInfo(Protocol):
    """What the guardian reads of ``JobSubmissionClient.get_job_info`` (ray's ``JobDetails``)."""

    @property
    def status(self) -> str: ...  # a JobStatus, a str enum
    @property
    def job_id(self) -> str | None: ...  # the Ray job id (hex) once the driver started; its actors carry it
    @property
    def message(self) -> str | None: ...
    @property
    def driver_exit_code(self) -> int | None: ...
    @property
    def driver_node_id(self) -> str | None: ...
    @property
    def metadata(self) -> dict[str, str] | None: ...


class JobsClient(Protocol):
    """The few methods of ``ray.job_submission.JobSubmissionClient`` the guardian calls."""

    def submit_job(
        self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, object], metadata: dict[str, str]
    ) -> str: ...
    def stop_job(self, job_id: str) -> bool: ...
    def get_job_info(self, job_id: str) -> JobInfo: ...
    def get_job_logs(self, job_id: str) -> str: ...


def connect(address: str, *, timeout_s: float = RAY_REQUEST_TIMEOUT_S) -> JobsClient:
    """A Jobs API client for the cluster at ``address`` (``http://HEAD:8265``), each of its calls bounded by
    ``timeout_s`` (``ray.request_timeout_s``). Raises ``RayJobsError`` when ray is not installed or the cluster's
    dashboard does not answer."""
    try:
        need("ray", "--ray-address")
    except MissingExtra as exc:
        raise RayJobsError(str(exc)) from None
    try:
        from guardian.rescue.ray_client import BoundedJobsClient
    except ImportError as exc:  # ray is there but its Jobs API does not import (a partial or broken install)
        raise RayJobsError(f"--ray-address needs ray with its Jobs API: {RAY_INSTALL} ({exc})") from exc
    try:
        client: JobsClient = BoundedJobsClient(address, timeout_s=timeout_s)
    except TimeoutError as exc:
        raise RayJobsError(f"{exc}. Nothing was submitted") from exc
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayJobsError(
            f"the Ray Jobs API at {address} does not answer ({exc}): is the head up with its dashboard "
            "(ray start --head --include-dashboard=true) and is this its dashboard address (port 8265 by default)?"
        ) from exc
    return client


def submission_id(run_id: str, number: int) -> str:
    """The job id of a run's attempt: the same for every guardian of that run, so a restart finds its job."""
    return f"guardian-{run_id}-{number}"


def entrypoint(argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> str:
    """The job's shell command: ``argv`` quoted word by word, run in ``cwd`` (the driver's own working directory is
    a Ray session folder, and the user's command may name relative paths), after creating the folders the attempt's
    ``env`` names that verl expects to exist (``FOLDER_MUST_EXIST``) on the driver's node."""
    folders = folders_to_create(env or {})
    made = f"mkdir -p -- {shlex.join(folders)} && " if folders else ""
    return f"cd {shlex.quote(str(cwd))} && {made}exec {shlex.join(argv)}"


def folders_to_create(env: Mapping[str, str]) -> list[str]:
    """The parent folders of the files ``env`` names whose folder verl does not create, in ``FOLDER_MUST_EXIST``'s
    order, each once."""
    folders: list[str] = []
    for key in FOLDER_MUST_EXIST:
        path = env.get(key)
        parent = str(Path(path).parent) if path else ""
        if parent and parent != "." and parent not in folders:
            folders.append(parent)
    return folders


def exit_status_of(info: JobInfo) -> ExitStatus | None:
    """How a job ended: None while it is live; SUCCEEDED exit 0; FAILED the driver's exit code (1 when Ray knows
    none, e.g. its supervisor died); STOPPED killed by the stop signal."""
    status = str(info.status)
    if status in LIVE:
        return None
    if status == "SUCCEEDED":
        return ExitStatus(0, None)
    if status == "STOPPED":
        return ExitStatus(None, STOP_SIGNAL)
    code = info.driver_exit_code
    if code is None or code == 0:
        return ExitStatus(1, None)
    return ExitStatus.from_returncode(code)


def not_found(exc: RuntimeError) -> bool:
    return NOT_FOUND in str(exc)


@dataclass
class JobAttempt:
    """The attempt this guardian follows, as a Ray job."""

    id: int
    number: int
    argv: tuple[str, ...]
    submission_id: str
    started_at: float
    ended: ExitStatus | None = None  # a terminal status, once seen (it never changes)


@dataclass
class RayJobsTrainer:
    """``TrainerPort`` (and what the supervisor reads: ``alive``, ``exit_status``) for a trainer run as Ray Jobs."""

    config: GuardianConfig
    store: Store
    run_id: str
    client: JobsClient
    folder: RunFolder
    cwd: Path
    clock: Callable[[], float]
    wait: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    # the cluster's State API (survivors of a stopped job); None: not looked for
    cluster: ClusterState | None = None
    attempt: JobAttempt | None = None
    stopped_in_outage: int | None = None

    # -- what the snapshot reads ----------------------------------------------------------------------
    def alive(self) -> bool | None:
        if self.attempt is None:
            return None
        return self.exit_status() is None

    def exit_status(self) -> ExitStatus | None:
        if self.attempt is None:
            return None
        if self.attempt.ended is None:
            info = self._info(self.attempt.submission_id)
            self.attempt.ended = LOST if info is None else exit_status_of(info)
        return self.attempt.ended

    def launched_at(self) -> float | None:
        return self.attempt.started_at if self.attempt is not None else None

    def argv(self, default: Sequence[str]) -> tuple[str, ...]:
        return self.attempt.argv if self.attempt is not None else tuple(default)

    # -- launching -------------------------------------------------------------------------------------
    def launch(self, attempt: AttemptView, plan: StoredPlan) -> Launched:
        return self.start(attempt.id, attempt.number, plan.argv, plan.env)

    def start(self, attempt_id: int, number: int, argv: Sequence[str], extra_env: Mapping[str, str]) -> Launched:
        """Submit the attempt's job, or follow it when the cluster already has it (an earlier guardian submitted it)."""
        sid = submission_id(self.run_id, number)
        fields: dict[str, object] = {"run": self.run_id, "attempt": number, "job": sid}
        info = self._info(sid)
        if info is None:
            line = entrypoint(argv, self.cwd, extra_env)
            prepare_attempt(
                self.folder,
                number,
                argv=argv,
                extra_env=extra_env,
                cwd=self.cwd,
                record={"ray_job": sid, "entrypoint": line},
            )
            started = self.monotonic()
            self.client.submit_job(
                entrypoint=line,
                submission_id=sid,
                runtime_env={"env_vars": self._env_vars(sid, extra_env)},
                metadata={"guardian_run": self.run_id, "guardian_attempt_id": str(attempt_id)},
            )
            log.warning(event("job_submitted", {**fields, "seconds": round(self.monotonic() - started, 3)}))
        else:
            self._check_owner(sid, info, attempt_id)
            log.warning(event("job_attached", {**fields, "status": str(info.status)}))
        self.attempt = JobAttempt(attempt_id, number, tuple(argv), sid, self.clock())
        return Launched(attempt_id, number, tuple(argv))

    def attach(self, attempt: AttemptView, argv: Sequence[str]) -> None:
        """Follow the job an earlier guardian submitted for ``attempt``; a job the cluster no longer knows (the cluster
        was restarted, the job deleted) reads as ended with its status lost."""
        sid = submission_id(self.run_id, attempt.number)
        info = self._info(sid)
        if info is not None:
            self._check_owner(sid, info, attempt.id)
        fields = {"run": self.run_id, "attempt": attempt.number, "job": sid}
        log.warning(event("job_attached", {**fields, "status": str(info.status) if info else "unknown to the cluster"}))
        self.attempt = JobAttempt(attempt.id, attempt.number, tuple(argv), sid, self.clock())

    def _env_vars(self, sid: str, extra_env: Mapping[str, str]) -> dict[str, str]:
        ic = self.config.intervention
        return {
            **extra_env,
            "GUARDIAN_TRAINER": sid,
            "RAY_JOB_STOP_SIGNAL": STOP_SIGNAL.name,
            # Ray reads an integer: SIGKILL follows this many seconds after the stop signal
            "RAY_JOB_STOP_WAIT_TIME_S": str(max(1, math.ceil(ic.stop_sigint_s + ic.stop_sigterm_s))),
        }

    def _check_owner(self, sid: str, info: JobInfo, attempt_id: int) -> None:
        owner = (info.metadata or {}).get("guardian_attempt_id")
        if owner != str(attempt_id):
            raise RayJobsError(
                f"Ray job {sid} ({info.status}) belongs to another guardian store (its attempt id {owner}, this "
                f"store's {attempt_id}): the run id is reused on this cluster. Pick another --run-id, or remove the "
                f"old job: ray job stop {sid}; ray job delete {sid}"
            )

    # -- stopping --------------------------------------------------------------------------------------
    def stop(self, *, reason: str) -> None:
        """Stop the job, record its end, then refuse the relaunch while its survivors hold what a trainer needs (also
        when the job had ended already: a retried stop, or one after --attach, looks at the survivors again)."""
        if self.attempt is None:
            return
        self.halt(reason=reason)
        self._record_end(self.exit_status())
        found = self._survivors()
        if found is not None and not found.relaunch:
            raise StopFailedError(self._refusal(found))

    def halt(self, *, reason: str) -> None:
        """Stop the attempt's job and wait until it is terminal (nothing is stored: also while the store is down)."""
        if self.attempt is None or self.exit_status() is not None:
            return
        sid, ic = self.attempt.submission_id, self.config.intervention
        started = self.monotonic()
        self.client.stop_job(sid)
        deadline = started + ic.stop_sigint_s + ic.stop_sigterm_s + ic.stop_sigkill_s
        info = self._info(sid)
        while info is not None and str(info.status) in LIVE and self.monotonic() < deadline:
            self.wait(POLL_S)
            info = self._info(sid)
        if info is None or str(info.status) not in LIVE:
            self.attempt.ended = LOST if info is None else exit_status_of(info)
        status = str(info.status) if info is not None else "unknown to the cluster"
        fields = {"run": self.run_id, "attempt": self.attempt.number, "job": sid, "reason": reason}
        log.warning(
            event("trainer_stopped", {**fields, "status": status, "seconds": round(self.monotonic() - started, 3)})
        )
        if info is not None and status in LIVE:
            node = f" (driver on node {info.driver_node_id})" if info.driver_node_id else ""
            raise StopFailedError(
                f"Ray job {sid}{node} is still {status} {self.monotonic() - started:.0f}s after stop_job; refusing to "
                "relaunch (never two trainers at once). Look with ray job status/logs " + sid + ", stop its driver "
                f"(ray job stop {sid}, or ray stop --force on that node), then guardian run --attach {self.run_id}"
            )

    def halt_in_outage(self, *, reason: str) -> None:
        self.halt(reason=reason)
        self.stopped_in_outage = self.attempt.id if self.attempt is not None else None

    def finish(self, status: ExitStatus) -> None:
        """The job ended by itself: its survivors are reported (nothing is relaunched, nothing is killed)."""
        self._survivors(relaunch=False)
        self._record_end(status)

    # -- survivors --------------------------------------------------------------------------------------
    def _survivors(self, *, relaunch: bool = True) -> Verdict | None:
        """The stopped job's actors still alive, logged; None when there are none or the cluster cannot say."""
        if self.cluster is None or self.attempt is None:
            return None
        sid = self.attempt.submission_id
        info = self._info(sid)
        job_id = info.job_id if info is not None else None
        if not job_id:  # the driver never started (or the cluster forgot the job): nothing of it can be alive
            return None
        fields: dict[str, object] = {"run": self.run_id, "attempt": self.attempt.number, "job": sid, "ray_job": job_id}
        try:
            found = verdict(self._settled(job_id))
            totals = self.cluster.node_totals() if found.survivors else {}
        except RuntimeError as exc:
            fix = f"look yourself: ray list actors --address {self.cluster.address} --filter job_id={job_id}"
            log.warning(event("job_survivors_unknown", {**fields, "message": str(exc), "fix": fix}))
            return None
        if not found.survivors:
            return None
        decision = ("refused" if not found.relaunch else "goes_ahead") if relaunch else "none_needed"
        fix = "; ".join(kill_command(s, self.cluster.address) for s in found.survivors)
        log.warning(event("job_survivors", {**fields, **fields_of(found, totals), "relaunch": decision, "fix": fix}))
        return found

    def _settled(self, job_id: str) -> list[Survivor]:
        """The job's live actors once its owned actors had ``ray_survivor_grace_s`` to die with the driver."""
        assert self.cluster is not None
        deadline = self.monotonic() + self.config.intervention.ray_survivor_grace_s
        alive = self.cluster.survivors(job_id)
        while still_settling(alive) and self.monotonic() < deadline:
            self.wait(POLL_S)
            alive = self.cluster.survivors(job_id)
        return alive

    def _refusal(self, found: Verdict) -> str:
        assert self.attempt is not None and self.cluster is not None
        sid, address = self.attempt.submission_id, self.cluster.address
        held = ", ".join(s.label() for s in found.blocking)
        kills = "; ".join(kill_command(s, address) for s in found.blocking)
        return (
            f"Ray job {sid} is stopped, but {len(found.blocking)} of its actors are still alive and hold resources a "
            f"resubmitted trainer would wait for: {held}. Refusing to relaunch. Stop them ({kills}), then guardian "
            f"run --attach {self.run_id} (the stop is retried for tick_failure_limit polls, then the guardian gives "
            f"up with this message). The job is kept: ray job logs {sid}"
        )

    def log_mirror(self, number: int, path: Path) -> JobLogMirror:
        """The mirror of attempt ``number``'s job logs into ``path`` (``rescue.ray_logs``)."""
        sid = submission_id(self.run_id, number)

        def ended() -> bool:
            followed = self.attempt is not None and self.attempt.submission_id == sid
            return not followed or self.attempt is None or self.attempt.ended is not None  # the tick read it first

        poll_s = self.config.sources.ray_job_logs_poll_s
        return JobLogMirror(self.client, sid, path, poll_s, ended, monotonic=self.monotonic)

    def _record_end(self, status: ExitStatus | None) -> None:
        if self.attempt is not None:
            exit_code = status.exit_code if status else None
            self.store.end_attempt(self.attempt.id, exit_code=exit_code, now=self.clock())

    def output_tail(self) -> str:
        if self.attempt is None:
            return ""
        try:
            logs = self.client.get_job_logs(self.attempt.submission_id)
        except RuntimeError as exc:
            if not_found(exc):
                return ""
            raise OSError(f"Ray job {self.attempt.submission_id}'s logs cannot be read: {exc}") from exc
        return logs[-OUTPUT_TAIL_BYTES:].strip()

    def _info(self, sid: str) -> JobInfo | None:
        """The job's details, None when the cluster has no job of that id."""
        try:
            return self.client.get_job_info(sid)
        except RuntimeError as exc:
            if not_found(exc):
                return None
            raise
