"""One tick of the guard loop: poll sources, judge in memory, store findings and incidents, alert. Clock injected.

Invariant: a tick's steps, findings and incidents commit in one transaction (``store.writebehind``), so a guardian
killed in between neither loses nor doubles them; during an outage they wait in memory in order. Only the keys the
checks read are stored (``keys.is_checked_key``); ``event=incident_*`` lines follow the commit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

from guardian.checkpoints.scan import CheckpointDir
from guardian.checkpoints.verdicts import judge
from guardian.checkpoints.view import CheckpointsView, read_checkpoints
from guardian.checks import CheckContext, build_checks, evaluate
from guardian.checks.signs import LifeSigns, note_footprint, startup_allowance
from guardian.config import GuardianConfig
from guardian.core import Clock, Finding, Severity, StepRecord, StepSchedule
from guardian.history.timeline import Arrival, RunHistory
from guardian.incidents.health import StepHealth
from guardian.incidents.replay import feed_step
from guardian.incidents.signal_report import SignalReport
from guardian.incidents.tracker import Change, StatusTracker, Transition
from guardian.keys import Signal, checked_values
from guardian.logs import event, get_logger
from guardian.sources.footprint import look
from guardian.sources.jsonl import MetricsBatch, NewSegment
from guardian.sources.rollouts import RolloutDir, read_finished
from guardian.store import Store
from guardian.store.changes import StoreMemo
from guardian.store.writebehind import WriteBehind

log = get_logger("incidents")
Said = tuple[int, str]
"""A log line (level, message) that a write says about the rows it wrote: logged once they are committed."""
Part = Callable[[Store], Iterable[Said]]
"""One write of a tick (its steps, a transition's finding and incident)."""


class MetricsSource(Protocol):
    """What the incident tick needs of a metrics reader (``MetricsFile`` or ``ConsoleFile``)."""

    @property
    def path(self) -> Path: ...

    def poll(self, *, final: bool = False) -> MetricsBatch: ...


@dataclass
class TickResult:
    new_steps: int = 0
    transitions: list[Transition] = field(default_factory=list)
    bad_lines: int = 0


@dataclass
class TickWrites:
    """A tick's writes, one unit of the write-behind (all of it commits or none): its parts, the checks whose
    transitions they record, and what the last run of them said (logged by ``say`` once it committed)."""

    parts: list[Part] = field(default_factory=list)
    checks: set[str] = field(default_factory=set)
    said: list[Said] = field(default_factory=list)

    def __call__(self, store: Store) -> None:
        said: list[Said] = []
        for part in self.parts:
            said.extend(part(store))
        self.said = said  # a replay's run replaces a rolled-back one's

    def say(self) -> None:
        for level, line in self.said:
            log.log(level, line)


@dataclass
class IncidentTick:
    """One pass of the guard loop over a run: read the new lines, judge them, store findings and incidents."""

    config: GuardianConfig
    store: Store
    run_id: str
    metrics: MetricsSource
    clock: Clock
    rollouts: RolloutDir | None = None
    checkpoints_dir: Path | None = None
    on_transition: list[Callable[[str, Transition], None]] = field(default_factory=list)
    # observe mode closes an incident when its check clears; under `guardian run --mode enforce` the
    # intervention owns the incident's end (a rollback clears checks without anything being fixed)
    close_on_clear: bool = True
    # what the checks' findings update; `watch` passes one that also remembers the first critical finding
    tracker: StatusTracker = field(default_factory=StatusTracker)
    # the steps verl saves and validates at (the run's trainer.save_freq/test_freq), for the stall check
    schedule: StepSchedule | None = None
    # trainer.validation_data_dir: a growing N.jsonl there is a sign of life of step N
    validation_dir: Path | None = None

    def __post_init__(self) -> None:
        self.history = RunHistory(
            length_cap=self.config.checks.length.max_response_length,
            train_batch_size=self.config.sources.train_batch_size,
        )
        self.checks = build_checks(self.config.checks)
        # the worst finding at each step of the active timeline: a checkpoint is pinned only when healthy around it
        self.health = StepHealth()
        self.started_at = self.clock()
        # what the disk showed of the step in progress (its checkpoint folder, its validation dump)
        self.life_signs = LifeSigns()
        # how long the run's first launch took to its first step: later launches are allowed a multiple of it
        self.first_startup_s: float | None = None
        self._learns_startup = False  # the current launch is the run's first: its first step is timed
        # the attempt the steps read now belong to; `guardian run` names each one itself (switch_attempt: one
        # metrics file per launch), `watch` infers them from file segments (verl truncates its log on every start)
        self.attempt_id: int | None = None
        self._follows_launches = False
        # steps judged before a restart of the guardian: their findings are already stored
        self._judged_through: int | None = None

        self._known_checkpoints: dict[Path, str] = {}
        # steps the current attempt's metrics file has logged (a resume starts at its checkpoint's step)
        self.attempt_steps: list[int] = []
        self.signal_report = SignalReport(self.run_id)  # the event=signals line
        self.bad_lines_total = 0
        self.steps_judged = 0  # steps read and judged since this guardian started (a failed tick's too)
        self._carried: MetricsBatch | None = None  # read, not yet judged: a tick failed before it got there
        # whether the trainer process runs, as the caller sampled it for this tick (None: unknown, or no process)
        self._trainer_alive: bool | None = None
        self.writes = WriteBehind(self.store, self.clock, limit=self.config.store.max_pending_writes)
        # the open incidents' onsets the checkpoint verdicts read, kept while nothing was written
        self._reads = StoreMemo(self.store.writes, self.config.store.reread_s, self.clock)

    # -- the store's health, for the exporter ---------------------------------------------------
    @property
    def store_degraded(self) -> bool:
        """Whether the store refuses writes now (the guardian guards from memory meanwhile)."""
        return self.writes.degraded

    @property
    def store_pending_writes(self) -> int:
        """Units of work waiting for the store to take writes again."""
        return self.writes.pending

    @property
    def store_dropped_writes(self) -> int:
        """Units of work dropped because the queue was full (their steps stay in the metrics files)."""
        return self.writes.dropped

    # -- one pass -----------------------------------------------------------------------------
    def tick(self, on_disk: CheckpointsView | None = None, *, trainer_alive: bool | None = None) -> TickResult:
        """One pass. ``on_disk``: the checkpoint dir as the caller read it this tick (None: read here);
        ``trainer_alive``: whether the trainer process runs, sampled before the read (None: not known)."""
        now = self.clock()
        self._trainer_alive = trainer_alive
        self.writes.retry()
        result = TickResult()
        batch, self._carried = self._carried or self.metrics.poll(), None
        result.bad_lines = len(batch.bad_lines)
        self.bad_lines_total += result.bad_lines
        for bad in batch.bad_lines:
            log.warning(event("bad_line", {"run": self.run_id, "detail": str(bad)}))
        work = TickWrites()  # this tick's writes, committed together
        pending: list[StepRecord] = []
        for index, item in enumerate(batch.items):
            if isinstance(item, NewSegment):
                self._flush(pending, work, now)
                if not self._follows_launches:
                    work = self._commit_work(work)
                    self._begin_attempt(item.segment, now, batch, index)
                elif item.segment > 0:
                    log.warning(event("metrics_file_restarted", {"run": self.run_id, "path": self.metrics.path}))
                continue
            if self.attempt_id is None:
                self._begin_attempt(0, now, batch, index)
            before = self.history.branch
            arrival = self.history.add(item, arrived_at=now)
            if self.history.branch != before:
                self._flush(pending, work, now, branch=before)
            pending.append(item)
            self.attempt_steps.append(item.step)
            result.new_steps += arrival is not Arrival.MERGED
            if self._learns_startup:
                self._learn_startup(now)
            self.steps_judged += arrival is not Arrival.MERGED
            result.transitions.extend(self._judge(now, work))
        self._flush(pending, work, now)
        if self.rollouts is not None:
            stats = self.rollouts.poll()
            for step, group_stats in stats.stats:
                values = group_stats.as_metrics()
                self.history.merge(step, values)
                if self.attempt_id is not None:
                    work.parts.append(
                        partial(_merge_values, self.run_id, self.attempt_id, self.history.branch, step, values, now)
                    )
            for problem in stats.bad:
                log.warning(event("bad_rollout_line", {"run": self.run_id, "detail": problem}))
        self._look_for_life(now)
        result.transitions.extend(self._judge(now, work))
        self._commit_work(work)
        if self.checkpoints_dir is not None:
            folders = (on_disk or read_checkpoints(self.checkpoints_dir)).folders
            record = partial(self._record_verdicts, folders=folders, now=now)
            self.writes.submit("checkpoints", record, atomic=False, coalesce=True)
        if self.history.steps and (said := self.signal_report.update(*self._signals_seen())) is not None:
            log.info(event("signals", said))
        return result

    # -- stages -------------------------------------------------------------------------------
    def _begin_attempt(self, segment: int, now: float, batch: MetricsBatch, index: int) -> None:
        """Begin the attempt the file's segment belongs to (``watch``); when the store refuses, the batch from
        ``index`` on is kept and judged by the next tick - read lines are never lost."""
        try:
            self._begin_attempt_in_store(segment, now)
        except Exception:
            self._carried = MetricsBatch(batch.items[index:], [], batch.more)
            raise

    def _begin_attempt_in_store(self, segment: int, now: float) -> None:
        latest = self.store.latest_attempt(self.run_id)
        if segment == 0 and latest is not None and latest.ended_at is None:
            # a restarted guardian re-reads the file from the start: same attempt, steps already stored
            self.attempt_id = latest.id
            stored = self.store.latest_step(self.run_id)
            self._judged_through = stored[0] if stored else None
        else:
            if latest is not None and latest.ended_at is None:
                self.store.end_attempt(latest.id, exit_code=None, now=now)
            attempt = self.store.start_attempt(self.run_id, metrics_path=str(self.metrics.path), now=now)
            self.attempt_id = attempt.id
            self._judged_through = None
        log.info(event("attempt", {"run": self.run_id, "attempt_id": self.attempt_id, "segment": segment}))

    def switch_attempt(
        self,
        attempt_id: int,
        metrics: MetricsSource,
        rollouts: RolloutDir | None = None,
        *,
        judged_through: int | None = None,
        first_launch: bool = False,
    ) -> None:
        """Follow a new trainer launch: its own metrics file and rollout dumps (a dump dir the attempts share
        keeps its reader, which knows the dumps already merged), the same run timeline. ``first_launch``: the
        run's first attempt, just launched: the time to its first step sets later launches' start-up allowance."""
        self.attempt_id, self._follows_launches = attempt_id, True
        self.metrics = metrics
        if rollouts is not None and (self.rollouts is None or self.rollouts.path != rollouts.path):
            self.rollouts = rollouts
        self._judged_through = judged_through
        self.attempt_steps = []
        self.started_at = self.clock()  # the stall check gives a fresh launch its start-up allowance
        self._learns_startup = first_launch

    def _learn_startup(self, now: float) -> None:
        """The first launch logged its first step: time it, and say what later launches are allowed."""
        self._learns_startup = False
        self.first_startup_s = took = now - self.started_at
        stall = self.config.checks.stall
        fields = {
            "run": self.run_id,
            "seconds": round(took, 1),
            "stall_allowance_s": round(startup_allowance(stall.startup_seconds, took, stall.startup_learned_factor)),
            "resume_allowance_s": round(
                startup_allowance(self.config.intervention.startup_seconds, took, stall.startup_learned_factor)
            ),
        }
        log.info(event("startup_learned", fields))

    def _look_for_life(self, now: float) -> None:
        """Look at the step in progress's checkpoint folder and validation dump (a few stats) for the stall check;
        the first change seen of each is logged."""
        if self.history.last_step is None or (self.checkpoints_dir is None and self.validation_dir is None):
            return
        step = self.history.last_step + 1
        before = self.life_signs
        seen = look(self.checkpoints_dir, self.validation_dir, step)
        after = self.life_signs = note_footprint(before, step, seen, now)
        for what, was, now_at in (
            ("checkpoint", before.saved_at if before.step == step else None, after.saved_at),
            ("validation_dump", before.dumped_at if before.step == step else None, after.dumped_at),
        ):
            if was is None and now_at is not None:
                log.info(event("sign_of_life", {"run": self.run_id, "step": step, "what": what}))

    def rebuild(self, metrics: MetricsSource, rollouts: RolloutDir | None = None) -> int:
        """Re-read an earlier attempt's finished metrics file and rollout dumps into the timeline without
        storing or alerting anything (a restarted guardian rebuilding its view of the run), in the order
        the live loop judged them. Returns the steps read."""
        pending: dict[int, Mapping[str, float]] = (
            dict(read_finished(rollouts.path, max_line_bytes=rollouts.max_line_bytes)[0]) if rollouts else {}
        )
        steps = 0
        while True:
            batch = metrics.poll(final=True)
            for item in batch.items:
                if isinstance(item, StepRecord):
                    feed_step(self.history, self.tracker, lambda: self._evaluate(None), item, pending)
                    steps += 1
            if not batch.more:
                return steps

    def _context(self, now: float | None) -> CheckContext:
        return CheckContext(
            self.history,
            self.config.checks.baseline,
            now=now,
            started_at=self.started_at,
            trainer_alive=self._trainer_alive,
            schedule=self.schedule,
            life_signs=self.life_signs,
            first_startup_s=self.first_startup_s,
        )

    def _flush(self, pending: list[StepRecord], work: TickWrites, now: float, branch: int | None = None) -> None:
        if pending and self.attempt_id is not None:
            line = self.history.branch if branch is None else branch
            stored = [StepRecord(r.step, checked_values(r.data)) for r in pending]  # see keys.is_checked_key
            work.parts.append(partial(_write_steps, self.run_id, self.attempt_id, line, stored, now))
        pending.clear()

    def _commit_work(self, work: TickWrites) -> TickWrites:
        """Hand ``work`` to the write-behind (which keeps it: it must not change after); returns the next one."""
        if work.parts:
            self.writes.submit(
                "tick",
                work,
                committed=work.say,
                refused=partial(self._judge_again, work.checks),
                steps_only=not work.checks,  # no transition recorded: steps and rollout statistics alone
            )
        return TickWrites()

    def _judge_again(self, checks: set[str], error: BaseException) -> None:
        """A tick's writes were lost to a bug: the transitions of ``checks`` were never stored. Forget their
        state, so the next tick raises whatever trouble they still see (opening its incident then); the
        checkpoint verdicts cached in that unit are forgotten too (the next scan records them again)."""
        for check in checks:
            self.tracker.forget(check)
        self._known_checkpoints.clear()
        if checks:
            log.warning(
                event(
                    "checks_judged_again",
                    {
                        "run": self.run_id,
                        "checks": ",".join(sorted(checks)),
                        "why": "their transitions were not stored",
                    },
                )
            )

    def _evaluate(self, now: float | None) -> list[Finding]:
        """The checks' findings at the timeline's newest step, noted in ``health``."""
        findings = evaluate(self._context(now), self.checks)
        if self.history.last_step is not None:
            self.health.note(self.history.last_step, findings)
        return findings

    def _judge(self, now: float, work: TickWrites) -> list[Transition]:
        transitions = self.tracker.update(self._evaluate(now))
        fresh = [t for t in transitions if not self._already_stored(t)]
        for transition in fresh:
            _log_finding(self.run_id, transition)
            work.parts.append(partial(self._record, transition=transition, now=now, attempt_id=self.attempt_id))
            work.checks.add(transition.finding.check)
            for sink in self.on_transition:
                sink(self.run_id, transition)
        return fresh

    def _already_stored(self, t: Transition) -> bool:
        return (
            self._judged_through is not None and t.finding.step is not None and (t.finding.step <= self._judged_through)
        )

    def _record(self, store: Store, *, transition: Transition, now: float, attempt_id: int | None) -> list[Said]:
        said: list[Said] = []
        finding = transition.finding
        incident = store.open_incident_for(self.run_id, finding.check)
        if finding.severity == Severity.CRITICAL and transition.change in (Change.RAISED, Change.ESCALATED):
            if incident is None:
                incident = store.open_incident(self.run_id, finding, now)
                said.append(
                    _line(
                        logging.ERROR,
                        "incident_opened",
                        {
                            "run": self.run_id,
                            "incident": incident.id,
                            "check": finding.check,
                            "step": finding.step,
                            "onset": finding.onset_step,
                            "message": finding.message,
                        },
                    )
                )
            else:
                incident = store.escalate_incident(incident.id, finding, now)
            if finding.onset_step is not None:
                self._mark_checkpoints_after(store, finding.onset_step, f"after onset of incident {incident.id}", now)
        store.add_finding(self.run_id, attempt_id, finding, now, incident_id=incident.id if incident else None)
        if transition.change is Change.CLEARED and incident is not None and self.close_on_clear:
            store.close_incident(
                incident.id, status="resolved", now=now, step=finding.step, note="recovered without intervention"
            )
            said.append(
                _line(
                    logging.INFO,
                    "incident_recovered",
                    {"run": self.run_id, "incident": incident.id, "step": finding.step},
                )
            )
        return said

    def _record_verdicts(self, store: Store, *, folders: Sequence[CheckpointDir], now: float) -> None:
        """Record new checkpoints and changed verdicts (``checkpoints.verdicts``); each record commits on its own,
        so the cache of what is stored is right even when a later one fails (a repeat records the rest)."""
        onsets: list[int] | None = None  # read once per pass, only when a verdict needs them

        def open_onsets() -> list[int]:
            nonlocal onsets
            onsets = self._open_onsets(store) if onsets is None else onsets
            return onsets

        for ckpt in folders:
            history = self.history
            judged = judge(ckpt.step, last_step=history.last_step, non_finite=history.non_finite, onsets=open_onsets)
            if self._known_checkpoints.get(ckpt.path) == judged.verdict:
                continue
            store.record_checkpoint(
                self.run_id, step=ckpt.step, path=str(ckpt.path), verdict=judged.verdict, now=now, note=judged.note
            )
            self._known_checkpoints[ckpt.path] = judged.verdict

    def _open_onsets(self, store: Store) -> list[int]:
        """The onsets of the run's open critical incidents: a checkpoint saved at or after one is unhealthy.
        The incident's onset, not the latest estimate (which moves as steps arrive): the rollback target
        is chosen against the same step."""
        return self._reads.read(
            "open_onsets",
            lambda: [
                i.onset_step if i.onset_step is not None else i.opened_step or 0
                for i in store.list_incidents(self.run_id)
                if i.is_open and i.severity == Severity.CRITICAL
            ],
        )

    def _mark_checkpoints_after(self, store: Store, onset: int, note: str, now: float) -> None:
        # inside the tick's transaction: the cache may run ahead of a commit that fails, but an outage's unit
        # is replayed until it commits and marks the same checkpoints again, and a unit lost to a bug clears
        # the cache (_judge_again)
        for ckpt in store.checkpoints(self.run_id):
            if ckpt.step >= onset and ckpt.verdict != "unhealthy":
                store.record_checkpoint(
                    self.run_id, step=ckpt.step, path=ckpt.path, verdict="unhealthy", now=now, note=note
                )
                self._known_checkpoints[Path(ckpt.path)] = "unhealthy"

    def _signals_seen(self) -> tuple[set[str], Iterable[Signal], int | None]:
        return self.history.keys_seen, self.history.series, self.history.last_step


def _log_finding(run_id: str, t: Transition) -> None:
    finding = t.finding
    level = {Severity.CRITICAL: log.error, Severity.WARN: log.warning}.get(finding.severity, log.info)
    level(
        event(
            "finding",
            {
                "run": run_id,
                "check": finding.check,
                "change": t.change.value,
                "severity": finding.severity.label,
                "step": finding.step,
                "onset": finding.onset_step,
                "message": finding.message,
            },
        )
    )


def _line(level: int, name: str, fields: Mapping[str, object]) -> Said:
    return level, event(name, fields)


def _write_steps(
    run_id: str, attempt_id: int, branch: int, records: list[StepRecord], now: float, store: Store
) -> list[Said]:
    store.write_steps(run_id, attempt_id, branch, records, now)
    return []


def _merge_values(
    run_id: str, attempt_id: int, branch: int, step: int, values: Mapping[str, float], now: float, store: Store
) -> list[Said]:
    store.merge_step_values(run_id, attempt_id, branch, step, values, now)
    return []
