"""What the guard loop reads of each attempt of a run: its metrics (its file, or a Ray job's mirrored logs), its
rollout dumps, the check that a local trainer got the guardian's arguments, and the files the next attempt gets.

One attempt's readers at a time are followed; a launch (``ports.Launched``) switches them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from guardian.actions.patch import RunFiles
from guardian.config import SourcesConfig
from guardian.core import Clock
from guardian.incidents.tick import MetricsSource
from guardian.keys import CHECKED_KEYS
from guardian.overrides import parse_command
from guardian.rescue.layout import RunLayout
from guardian.rescue.local import LocalTrainer
from guardian.rescue.ray_jobs import RayJobsTrainer
from guardian.rescue.ray_logs import JOB_LOG, JobLogMirror, JobLogsSource
from guardian.sources.console import ConsoleFile
from guardian.sources.forwarding import ForwardingWatch
from guardian.sources.jsonl import MetricsFile
from guardian.sources.printed_config import read_printed_config
from guardian.sources.rollouts import RolloutDir
from guardian.store import Store

JobLogs = Callable[[int, Path], JobLogMirror]
"""A Ray trainer's mirror of attempt N's job logs into a file (``RayJobsTrainer.log_mirror``)."""


@dataclass(frozen=True)
class AttemptReaders:
    sources: SourcesConfig
    run_id: str
    layout: RunLayout
    clock: Clock
    job_logs: JobLogs | None = None  # None: a local trainer, whose metrics file is on this machine

    def metrics(self, path: Path, number: int) -> MetricsSource:
        """Attempt ``number``'s metrics: its metrics file, or for a Ray job also its mirrored logs (``ray_logs``)."""
        mode = self.sources.ray_job_logs
        if self.job_logs is None or mode == "never":
            return self._metrics_file(path)
        console = ConsoleFile(path.parent / JOB_LOG, max_line_bytes=self.sources.max_line_bytes)
        mirror = self.job_logs(number, console.path)
        return JobLogsSource(self._metrics_file(path), console, mirror, mode, self.run_id)

    def rollouts(self, number: int, argv: Sequence[str]) -> RolloutDir:
        """Attempt ``number``'s rollout dumps: its own folder, or the folder the user's command names."""
        rollout_dir = self.layout.run_files(number).prepare(argv).rollout_dir
        return RolloutDir(rollout_dir, max_line_bytes=self.sources.max_line_bytes)

    def forwarding(self, number: int) -> ForwardingWatch | None:
        """The check that attempt ``number`` of a local trainer got the guardian's arguments (None for a Ray job)."""
        if self.job_logs is not None:
            return None
        folder = self.layout.folder
        return ForwardingWatch(
            folder.stdout(number),
            folder.metrics(number),
            self.sources.forwarding_grace_s,
            self.clock,
            self.sources.max_line_bytes,
        )

    def _metrics_file(self, path: Path) -> MetricsFile:
        limits = self.sources  # the keys the checks read, as a replay and guardian watch read them
        return MetricsFile(
            path, keys=CHECKED_KEYS, max_keys=limits.max_keys_per_step, max_line_bytes=limits.max_line_bytes
        )


@dataclass(frozen=True)
class NextAttemptFiles:
    """``LocalPlanner``'s files of the attempt a plan would launch; for a launch script run locally, with the config
    the current attempt printed (``sources.printed_config``): the script's own values, which its command line does
    not show."""

    store: Store
    layout: RunLayout
    trainer: LocalTrainer | RayJobsTrainer

    def __call__(self) -> RunFiles:
        latest = self.store.latest_attempt(self.layout.run_id)
        files = self.layout.run_files((latest.number if latest else 0) + 1)
        attempt = self.trainer.attempt
        local = isinstance(self.trainer, LocalTrainer)
        if not local or attempt is None or not parse_command(self.trainer.argv(self.layout.command)).script:
            return files
        return replace(files, recorded=read_printed_config(self.layout.folder.stdout(attempt.number)))
