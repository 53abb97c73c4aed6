"""What the launch checklist judges, read from the store and the run's files (the IO half of
``guardian.review.checklist``)."""

from __future__ import annotations

from pathlib import Path

from guardian.actions.launcher import RunFolder
from guardian.checkpoints.scan import resumable
from guardian.config import GuardianConfig
from guardian.history.timeline import RunHistory
from guardian.review.checklist import RunFacts
from guardian.review.incidents import incident_rows
from guardian.review.samples import dump_files, top_samples
from guardian.store import CheckpointView, EvaluationView, RunView, Store


def rebuilt_history(store: Store, run: RunView, config: GuardianConfig) -> RunHistory:
    """The run's active timeline as the checks see it, rebuilt from the stored steps (rollout statistics
    included: the guardian stored them into their steps)."""
    history = RunHistory(
        length_cap=config.checks.length.max_response_length, train_batch_size=config.sources.train_batch_size
    )
    for record in store.active_records(run.id):
        history.add(record)
    return history


def rollout_folders(store: Store, run: RunView, config: GuardianConfig) -> list[Path]:
    """Where the run's dumps are: its attempts' folders that exist, newest first, then the folder the run names
    (``guardian run``: the command's ``trainer.rollout_data_dir``; ``guardian watch``: ``--rollouts``)."""
    folder = RunFolder(config.home.resolve() / "runs" / run.id)
    found = [folder.rollouts(a.number) for a in reversed(store.attempts(run.id))]
    found = [f for f in found if f.is_dir()]
    if run.rollouts_dir:
        found.append(Path(run.rollouts_dir))
    return list(dict.fromkeys(found))


def newest_evaluations(evaluations: list[EvaluationView]) -> tuple[EvaluationView, ...]:
    """The newest result of each name, by name."""
    newest = {e.name: e for e in evaluations}  # oldest first: a later one wins
    return tuple(newest[name] for name in sorted(newest))


def resumable_checkpoints(store: Store, run_id: str, checkpoints: tuple[CheckpointView, ...]) -> frozenset[str]:
    """The checkpoints a rollback could still land on: verl can resume from the folder (its ``actor/`` is
    there: retention deletes it and leaves the folder) or a live pin holds it."""
    pinned = {pin.step for pin in store.pins(run_id, live=True)}
    return frozenset(c.path for c in checkpoints if resumable(Path(c.path)) or c.step in pinned)


def run_facts(store: Store, run: RunView, config: GuardianConfig) -> RunFacts:
    history = rebuilt_history(store, run, config)
    checkpoints = tuple(store.checkpoints(run.id))
    folders = rollout_folders(store, run, config)
    cfg = config.checklist
    files = dump_files(folders, history.steps, cfg.review_steps)
    return RunFacts(
        run=run,
        history=history,
        incidents=incident_rows(store, run.id, None, config.cost),
        checkpoints=checkpoints,
        present=resumable_checkpoints(store, run.id, checkpoints),
        samples=top_samples(
            files, count=cfg.review_samples, chars=cfg.review_chars, max_line_bytes=config.sources.max_line_bytes
        ),
        rollout_folders=tuple(str(f) for f in folders),
        evaluations=newest_evaluations(store.evaluations(run.id)),
    )
