"""The composition root: builds a guarded run's object graph from its config and layout (trainer adapter, readers,
incident tick, executor with its ports, pinner, pruner, outlets), and the same for ``guardian watch``.

Only wiring: no decision is taken here and nothing runs until the caller starts the supervisor or the watch loop.
``guardian run``, ``demo`` and ``fleet`` build through ``guarded_run``; tests and benches through ``supervisor``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from guardian.actions.process import LocalProcessControl, TrainerControl
from guardian.checkpoints.pinner import Pinner
from guardian.commands.outlets import Outlets, outlets
from guardian.config import GuardianConfig
from guardian.core import Clock
from guardian.incidents.tick import IncidentTick, MetricsSource
from guardian.incidents.tracker import StatusTracker
from guardian.loop.outage import CannotContinue
from guardian.rescue.executor import Executor
from guardian.rescue.layout import RunLayout, run_layout
from guardian.rescue.local import LocalCheckpoints, LocalPlanner, LocalTrainer
from guardian.rescue.pruner import DumpPruner
from guardian.rescue.ray_jobs import JobsClient, RayJobsTrainer
from guardian.rescue.ray_survivors import ClusterState
from guardian.rescue.readers import AttemptReaders, NextAttemptFiles
from guardian.rescue.supervisor import Supervisor
from guardian.sources.rollouts import RolloutDir
from guardian.states import Mode
from guardian.store import Store

# VERL_FILE_LOGGER_PATH: every attempt gets its own; GUARDIAN_DB_URL: the guardian's store, whose URL may hold a
# password the trainer has no use for
NOT_FOR_THE_TRAINER = frozenset({"VERL_FILE_LOGGER_PATH", "GUARDIAN_DB_URL"})
Trainer = LocalTrainer | RayJobsTrainer


@dataclass(frozen=True)
class TrainerSite:
    """Where the trainer runs: a local process group per attempt in ``env``, or, given ``jobs``, a Ray job per
    attempt (the cluster's environment, plus the attempt's own variables; ``cluster`` finds what a stopped job
    left alive)."""

    env: Mapping[str, str]
    control: TrainerControl
    jobs: JobsClient | None = None
    cluster: ClusterState | None = None


def local_site(jobs: JobsClient | None = None, cluster: ClusterState | None = None) -> TrainerSite:
    """This machine: the trainer gets this process's environment less ``NOT_FOR_THE_TRAINER``."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_THE_TRAINER}
    return TrainerSite(env, LocalProcessControl(), jobs, cluster)


def trainer_adapter(
    config: GuardianConfig, store: Store, layout: RunLayout, site: TrainerSite, clock: Clock
) -> Trainer:
    """The run's trainer: a local process group per attempt, or a Ray job per attempt."""
    if site.jobs is None:
        return LocalTrainer(config, store, layout.run_id, site.control, layout.folder, site.env, layout.cwd, clock)
    return RayJobsTrainer(
        config, store, layout.run_id, site.jobs, layout.folder, layout.cwd, clock, cluster=site.cluster
    )


def attempt_readers(config: GuardianConfig, layout: RunLayout, trainer: Trainer, clock: Clock) -> AttemptReaders:
    job_logs = trainer.log_mirror if isinstance(trainer, RayJobsTrainer) else None
    return AttemptReaders(config.sources, layout.run_id, layout, clock, job_logs)


def run_incident_tick(
    config: GuardianConfig, store: Store, layout: RunLayout, readers: AttemptReaders, clock: Clock
) -> IncidentTick:
    """``guardian run``'s tick, reading attempt 1 until the supervisor follows another; under enforce mode the
    intervention owns an incident's end."""
    first = layout.first
    return IncidentTick(
        config=config,
        store=store,
        run_id=layout.run_id,
        metrics=readers.metrics(first.metrics_path, 1),
        clock=clock,
        rollouts=RolloutDir(first.rollout_dir, max_line_bytes=config.sources.max_line_bytes),
        checkpoints_dir=layout.checkpoint_dir,
        close_on_clear=Mode(config.mode) is not Mode.ENFORCE,
        schedule=layout.saves.schedule,
        validation_dir=layout.saves.validation_dir,
    )


def executor(
    config: GuardianConfig,
    store: Store,
    layout: RunLayout,
    trainer: Trainer,
    tick: IncidentTick,
    clock: Clock,
    after_commit: Callable[[str], None],
) -> Executor:
    """The rescue's executor over the run's trainer, checkpoint dir and planner."""
    users_dumps = layout.first.rollout_dir_is_users

    def dumps_dir() -> Path | None:  # the user's dump dir, which every attempt shares (the tick follows it)
        return tick.rollouts.path if users_dumps and tick.rollouts else None

    checkpoints = LocalCheckpoints(
        layout.run_id, layout.checkpoint_dir, dumps_dir, copy_min_free_bytes=config.checkpoints.copy_min_free_bytes
    )
    planner = LocalPlanner(config, lambda: trainer.argv(layout.command), NextAttemptFiles(store, layout, trainer))
    return Executor(
        config,
        store,
        layout.run_id,
        layout.folder,
        clock,
        trainer=trainer,
        checkpoints=checkpoints,
        planner=planner,
        after_commit=after_commit,
    )


def pinner(config: GuardianConfig, store: Store, layout: RunLayout, clock: Clock) -> Pinner | None:
    """Observe mode changes nothing on disk; advise and enforce keep healthy rollback targets out of verl's
    retention (None: no pins)."""
    pins = config.checkpoints
    if Mode(config.mode) is Mode.OBSERVE or pins.pin_keep <= 0:
        return None
    return Pinner(pins, store, layout.run_id, layout.checkpoint_dir, clock, reread_s=config.store.reread_s)


def supervisor(
    config: GuardianConfig,
    store: Store,
    *,
    run_id: str,
    command: Sequence[str],
    cwd: Path,
    site: TrainerSite | None = None,
    clock: Clock = time.time,
    after_commit: Callable[[str], None] = lambda state: None,
    announce: Callable[[CannotContinue], None] = lambda ending: None,
) -> Supervisor:
    """A run's supervisor without outlets (tests and benches; ``announce`` stands in for the notifiers), its trainer
    on this machine unless ``site`` says otherwise."""
    layout = run_layout(config.home, run_id, command, cwd)
    trainer = trainer_adapter(config, store, layout, site or local_site(), clock)
    readers = attempt_readers(config, layout, trainer, clock)
    tick = run_incident_tick(config, store, layout, readers, clock)
    return _assemble(config, store, layout, trainer, readers, tick, clock, after_commit, announce)


@contextmanager
def guarded_run(
    config: GuardianConfig,
    store: Store,
    layout: RunLayout,
    site: TrainerSite,
    stop: threading.Event,
    *,
    after_commit: Callable[[str], None] = lambda state: None,
    serves_exporter: bool = True,
    views_read_store: bool = False,
    on_linger: Callable[[str, float], None] | None = None,
) -> Iterator[tuple[Supervisor, Outlets]]:
    """A run's supervisor with its outlets (notifiers, exporter), open while the block runs: the outlets read the
    incident tick, the supervisor tells them when it gives up. ``serves_exporter`` False: a fleet's run, whose
    snapshots the fleet's exporter serves."""
    clock = time.time
    trainer = trainer_adapter(config, store, layout, site, clock)
    readers = attempt_readers(config, layout, trainer, clock)
    tick = run_incident_tick(config, store, layout, readers, clock)
    outlets_config = config if serves_exporter else without_exporter(config)
    with outlets(
        outlets_config, store, tick, clock, stop, views_read_store=views_read_store, on_linger=on_linger
    ) as out:
        yield _assemble(config, store, layout, trainer, readers, tick, clock, after_commit, out.announce), out


def _assemble(
    config: GuardianConfig,
    store: Store,
    layout: RunLayout,
    trainer: Trainer,
    readers: AttemptReaders,
    tick: IncidentTick,
    clock: Clock,
    after_commit: Callable[[str], None],
    announce: Callable[[CannotContinue], None],
) -> Supervisor:
    return Supervisor(
        config=config,
        store=store,
        clock=clock,
        layout=layout,
        trainer=trainer,
        readers=readers,
        incident_tick=tick,
        executor=executor(config, store, layout, trainer, tick, clock, after_commit),
        pinner=pinner(config, store, layout, clock),
        pruner=DumpPruner.of(config, layout.run_id, layout.folder, users_dumps=layout.first.rollout_dir_is_users),
        announce=announce,
    )


def without_exporter(config: GuardianConfig) -> GuardianConfig:
    """A fleet's run serves no exporter of its own: the fleet's serves every run's snapshots."""
    return config.model_copy(update={"exporter": config.exporter.model_copy(update={"enabled": False})})


def watch_tick(
    config: GuardianConfig,
    store: Store,
    run_id: str,
    metrics: MetricsSource,
    *,
    rollouts: Path | None,
    checkpoints: Path | None,
    tracker: StatusTracker,
) -> IncidentTick:
    """``guardian watch``'s tick: observe mode over a run it did not start (attempts inferred from the file)."""
    return IncidentTick(
        config=config,
        store=store,
        run_id=run_id,
        metrics=metrics,
        clock=time.time,
        rollouts=RolloutDir(rollouts, max_line_bytes=config.sources.max_line_bytes) if rollouts else None,
        checkpoints_dir=checkpoints,
        tracker=tracker,
    )
