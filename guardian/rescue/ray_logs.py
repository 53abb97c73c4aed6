"""A Ray job's logs as evidence and, when the metrics file is out of sight, as the metrics source.

``JobLogMirror`` appends new log text to ``<run>/attempt-N/job.log`` (never truncated; reads spaced
``sources.ray_job_logs_poll_s`` apart, one more after the job ends). ``JobLogsSource`` reads the JSONL while it
exists here, else console lines from the mirror; the choice holds for the attempt."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from guardian.core import StepRecord
from guardian.logs import event, get_logger
from guardian.sources.console import ConsoleFile
from guardian.sources.jsonl import MetricsBatch, MetricsFile

log = get_logger("ray_logs")
JOB_LOG = "job.log"
NOT_FOUND = "status code 404"


class LogsClient(Protocol):
    def get_job_logs(self, job_id: str) -> str: ...


class Reading(StrEnum):
    METRICS_FILE = "metrics_file"
    JOB_LOGS = "job_logs"


def choose(mode: str, *, metrics_file_written: bool, logs_have_steps: bool) -> Reading | None:
    """Which source an attempt's metrics come from; None while it cannot be told yet (auto: the metrics file - which
    the guardian creates empty - has no line yet, and the job's logs no step line either, or only since this poll:
    verl prints the console line just before it writes the file's, so one more poll confirms the file stays empty)."""
    if mode == "always":
        return Reading.JOB_LOGS
    if mode == "never" or metrics_file_written:
        return Reading.METRICS_FILE
    return Reading.JOB_LOGS if logs_have_steps else None


@dataclass
class JobLogMirror:
    """Append a job's new log text to ``path``."""

    client: LogsClient
    submission_id: str
    path: Path
    poll_s: float
    ended: Callable[[], bool]  # whether the job is terminal (then one last read, and no more)
    monotonic: Callable[[], float] = time.monotonic
    _last_read: float | None = None
    _done: bool = False
    _warned: bool = field(default=False, repr=False)

    def pull(self) -> int:
        """Read the job's logs when due; the bytes appended."""
        ended = self.ended()
        now = self.monotonic()
        if self._done or (not ended and self._last_read is not None and now - self._last_read < self.poll_s):
            return 0
        self._last_read = now
        try:
            text = self.client.get_job_logs(self.submission_id)
        except RuntimeError as exc:
            if NOT_FOUND in str(exc):  # not submitted yet, or the cluster forgot it: nothing to mirror
                self._done = ended
                return 0
            raise OSError(
                f"Ray job {self.submission_id}'s logs cannot be read ({exc}); the mirror {self.path} goes on once "
                "the dashboard answers"
            ) from exc
        self._done = ended
        return self._append(text.encode("utf-8", errors="replace"))

    def _append(self, data: bytes) -> int:
        written = self.path.stat().st_size if self.path.exists() else 0
        if len(data) < written:
            if not self._warned:  # the job's log is shorter than the mirror: not this job's, or rewritten
                fields = {"job": self.submission_id, "mirror": self.path, "mirrored": written, "log": len(data)}
                log.warning(event("job_log_shorter_than_mirror", fields))
                self._warned = True
            return 0
        new = data[written:]
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as handle:
                handle.write(new)
        return len(new)


class JobLogsSource:
    """An attempt's metrics: its metrics file, or its job's logs (see the module docstring)."""

    def __init__(
        self, metrics: MetricsFile, console: ConsoleFile, mirror: JobLogMirror | None, mode: str, run_id: str
    ) -> None:
        self.metrics, self.console, self.mirror, self.mode, self.run_id = metrics, console, mirror, mode, run_id
        self.reading: Reading | None = None
        self._held: MetricsBatch | None = None  # the console's first step lines, until the file stayed empty a poll
        self._unreadable = False  # the last pull of the job's logs failed (the Jobs API does not answer)
        if choose(mode, metrics_file_written=False, logs_have_steps=False) is Reading.JOB_LOGS:
            self._chose(Reading.JOB_LOGS)

    @property
    def path(self) -> Path:
        return self.console.path if self.reading is Reading.JOB_LOGS else self.metrics.path

    def poll(self, *, final: bool = False) -> MetricsBatch:
        self._mirror()
        if self.reading is Reading.METRICS_FILE:
            return self.metrics.poll(final=final)
        if self.reading is Reading.JOB_LOGS:
            return self.console.poll(final=final)
        written = self.metrics.path.exists() and self.metrics.path.stat().st_size > 0
        if choose(self.mode, metrics_file_written=written, logs_have_steps=False) is Reading.METRICS_FILE:
            self._chose(Reading.METRICS_FILE)
            self._held = None
            return self.metrics.poll(final=final)
        if self._held is not None:  # the file stayed empty for a poll after the logs showed a step
            self._chose(Reading.JOB_LOGS)
            held, self._held = self._held, None
            batch = self.console.poll(final=final)
            return MetricsBatch(held.items + batch.items, held.bad_lines + batch.bad_lines, more=batch.more)
        batch = self.console.poll(final=final)
        if any(isinstance(item, StepRecord) for item in batch.items):
            self._held = batch
            return MetricsBatch(items=[], bad_lines=[], more=True)  # poll again: a replay must not stop here
        return MetricsBatch(items=[], bad_lines=batch.bad_lines, more=batch.more)

    def _mirror(self) -> None:
        """Pull the job's new log lines; while the Jobs API does not answer the metrics are read on from what is
        here (the metrics file, or the mirror so far), said once per outage."""
        if self.mirror is None:
            return
        try:
            self.mirror.pull()
        except OSError as exc:
            if not self._unreadable:
                fields = {"run": self.run_id, "mirror": self.mirror.path, "error": str(exc), "reading": self.path}
                log.warning(event("job_logs_unreadable", fields))
            self._unreadable = True
        else:
            self._unreadable = False

    def _chose(self, reading: Reading) -> None:
        self.reading = reading
        if reading is Reading.JOB_LOGS:
            fields = {"run": self.run_id, "log": self.console.path, "missing": self.metrics.path}
            log.warning(event("metrics_from_job_logs", fields))

    def close(self) -> None:
        self.metrics.close()
        self.console.close()
