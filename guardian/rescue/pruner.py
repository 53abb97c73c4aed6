"""``guardian run``'s dump pass: every ``rollouts.prune_every_steps`` steps, keep the run's own rollout dumps
under ``rollouts.keep_gib`` (``actions.dump_retention`` decides, one ``event=rollouts_pruned`` line).

Never runs while an intervention is under way, nor for a run whose command names its own
``trainer.rollout_data_dir``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from guardian.actions.dump_pruning import remove_dumps, scan_dumps
from guardian.actions.dump_retention import Abandoned, Retention, StepRange, plan_pruning
from guardian.actions.launcher import RunFolder
from guardian.checks.base import baseline_end
from guardian.config import GuardianConfig
from guardian.core import Finding, Severity
from guardian.incidents.health import StepHealth
from guardian.logs import event, get_logger
from guardian.rescue.snapshot import RescueSnapshot
from guardian.store import AttemptView, IncidentView, InterventionView

log = get_logger("rollouts")


@dataclass
class DumpPruner:
    policy: Retention
    every_steps: int
    run_id: str
    folder: RunFolder
    _pruned_at: int | None = None  # the newest step at the last pass
    _said_over_cap: bool = False

    @classmethod
    def of(cls, config: GuardianConfig, run_id: str, folder: RunFolder, *, users_dumps: bool) -> DumpPruner | None:
        """The run's pass; None when nothing is to be removed: no cap, or the dumps go to the command's own folder."""
        cfg = config.rollouts
        if users_dumps:
            why = "the command sets trainer.rollout_data_dir: the user's folder is never pruned"
            log.info(event("rollouts_not_pruned", {"run": run_id, "why": why}))
        if users_dumps or cfg.keep_bytes is None:
            return None
        policy = Retention(
            keep_bytes=cfg.keep_bytes,
            keep_recent_steps=max(cfg.keep_recent_steps, config.checklist.review_steps),
            keep_around_incident_steps=max(cfg.keep_around_incident_steps, config.report.context_steps),
            keep_first_steps=baseline_end(config.checks.baseline),
        )
        return cls(policy, cfg.prune_every_steps, run_id, folder)

    def due(self, last_step: int | None) -> bool:
        """Whether the timeline moved ``every_steps`` since the last pass (forward, or back: a resume)."""
        if last_step is None:
            return False
        return self._pruned_at is None or abs(last_step - self._pruned_at) >= self.every_steps

    def run(
        self, snapshot: RescueSnapshot, attempts: Sequence[AttemptView], health: StepHealth, findings: Iterable[Finding]
    ) -> None:
        """One pass (see the module docstring): ``health`` and ``findings`` are the guard loop's
        (``IncidentTick.health``, its tracker's latest findings)."""
        if snapshot.active is not None:
            return
        self._pruned_at = snapshot.last_step
        numbers = {a.id: a.number for a in attempts}
        folders = {a.number: self.folder.rollouts(a.number) for a in attempts}
        plan = plan_pruning(
            scan_dumps(folders),
            newest_step=snapshot.last_step,
            incidents=[
                *incident_ranges(snapshot.incidents, snapshot.interventions),
                *trouble_ranges(health, findings, self.policy.keep_around_incident_steps),
            ],
            abandoned=abandoned_branches(snapshot.interventions, numbers),
            policy=self.policy,
        )
        if plan.remove:
            done = remove_dumps(plan.remove, folders.values())
            fields: dict[str, object] = {
                "run": self.run_id,
                "files": done.files,
                "bytes": done.bytes,
                "kept_files": plan.kept_files + len(plan.remove) - done.files,
                "kept_bytes": plan.kept_bytes + plan.removed_bytes - done.bytes,
                "cap_bytes": self.policy.keep_bytes,
            }
            if done.failed:
                fields |= {"not_removed": len(done.failed), "first": done.failed[0]}
            log.info(event("rollouts_pruned", fields))
        if plan.over_cap and not self._said_over_cap:
            self._said_over_cap = True
            over = {
                "run": self.run_id,
                "kept_bytes": plan.kept_bytes,
                "cap_bytes": self.policy.keep_bytes,
                "why": "the dumps kept as evidence alone exceed the cap",
                "fix": "raise rollouts.keep_gib, or lower rollouts.keep_recent_steps / keep_around_incident_steps",
            }
            log.warning(event("rollouts_over_cap", over))


def incident_ranges(incidents: Sequence[IncidentView], interventions: Sequence[InterventionView]) -> list[StepRange]:
    """Each incident's marked steps, first to last: onset, detection, closing and its interventions' rollback points."""
    ranges = []
    for incident in incidents:
        marked = [incident.onset_step, incident.opened_step, incident.closed_step]
        marked += [iv.target_step for iv in interventions if iv.incident_id == incident.id]
        steps = [s for s in marked if s is not None]
        if steps:
            ranges.append((min(steps), max(steps)))
    return ranges


def trouble_ranges(health: StepHealth, findings: Iterable[Finding], gap: int) -> list[StepRange]:
    """The stretches of steps where a warning or worse stood (a gap of up to ``gap`` steps joins two), and each
    standing finding's run-up, from its onset; warnings that only advise are healthy here as everywhere."""
    ranges: list[StepRange] = []
    for step in sorted(s for s, worst in health.worst.items() if worst >= Severity.WARN):
        if ranges and step - ranges[-1][1] <= gap + 1:
            ranges[-1] = (ranges[-1][0], step)
        else:
            ranges.append((step, step))
    for f in findings:
        if f.severity >= Severity.WARN and not f.advice and f.step is not None:
            ranges.append((min(f.step, f.onset_step if f.onset_step is not None else f.step), f.step))
    return ranges


def abandoned_branches(interventions: Sequence[InterventionView], numbers: dict[int, int]) -> list[Abandoned]:
    """The branches relaunches replaced: the old attempt's steps after the rollback point (all of them when it
    started again from scratch)."""
    found = []
    for iv in interventions:
        if iv.from_attempt_id in numbers and iv.to_attempt_id is not None:
            after = iv.target_step if iv.target_step is not None else -1
            found.append(Abandoned(numbers[iv.from_attempt_id], after))
    return found
