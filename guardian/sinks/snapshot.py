"""What is shown about a run, by the exporter and the terminal views: ``RunSnapshot`` and its sources.

``snapshot_from`` copies the guard loop's memory and reads the store for one run; ``GuardianSource`` builds one
immutable snapshot per tick on the loop's thread. Invariant: a scrape or a view reads that snapshot only, never
the store or the guardian's memory, so both show one moment of the run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError

from guardian import keys
from guardian.config import STORE_REFRESH_S
from guardian.core import Finding, Severity
from guardian.faults import unavailable
from guardian.keys import Signal
from guardian.store.deliveries import DROPPED, SENT, SUPPRESSED

if TYPE_CHECKING:
    from guardian.history.timeline import RunHistory
    from guardian.store import InterventionView, RunView, Store

FINAL_RESULTS: Final = (SENT, SUPPRESSED, DROPPED)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """Everything the exporter and the terminal views show about one run at one moment.

    ``signals`` holds the latest value of each signal (NaN allowed: it is left out of the scrape), logged
    at ``signal_steps``. ``checks`` is each configured check's latest verdict; ``findings`` the latest
    finding of each check that has judged (the views' table). ``incidents_opened`` counts incidents by
    check; ``interventions_finished`` counts finished interventions by final state, as label values
    (``resolved``, ``relapsed``, ``gave_up``); ``intervention`` names the one under way and its state.
    ``last_poll_success_at`` is the Unix time of the last successful poll; None (with
    ``last_poll_success``) when not known, and then the series are left out. ``pinned_checkpoints`` and
    ``pinned_bytes`` are the live pins (guardian/checkpoints/pinning.py) and the bytes they added.
    ``store_read`` is False when what the store holds (attempt, incidents, interventions, deliveries) was not read
    for this snapshot - the store could not be read, or nothing shown needs it - and is the last read's, or empty.
    """

    run_id: str
    experiment: str
    attempt: int | None = None
    mode: str = ""
    step: int | None = None
    last_step_age_seconds: float | None = None
    steps_per_minute: float | None = None
    signals: Mapping[Signal, float] = field(default_factory=dict)
    signal_steps: Mapping[Signal, int] = field(default_factory=dict)
    checks: Mapping[str, Severity] = field(default_factory=dict)
    findings: Mapping[str, Finding] = field(default_factory=dict)
    reward_components: Mapping[str, float] = field(default_factory=dict)
    incidents_opened: Mapping[str, int] = field(default_factory=dict)
    open_incidents: Mapping[str, Severity] = field(default_factory=dict)
    interventions_finished: Mapping[str, int] = field(default_factory=dict)
    intervention_in_progress: bool = False
    intervention: str = ""  # "intervention 2 of incident #5: STOPPING", or empty
    notifications: Mapping[tuple[str, str], int] = field(default_factory=dict)
    up: bool = True
    last_poll_success: bool | None = None
    last_poll_success_at: float | None = None
    tick_seconds: float | None = None  # how long the guard loop's last tick took (None before the first)
    store_degraded: bool = False
    store_pending_writes: int = 0
    store_dropped_writes: int = 0
    pinned_checkpoints: int = 0  # healthy checkpoints kept under .guardian-pinned/ now
    pinned_bytes: int = 0  # what those pins added on disk when made (0 for hard links, the size for a copy)
    store_read: bool = True

    @property
    def step_time_seconds(self) -> float | None:
        """The trainer's time per step, when logged."""
        return self.signals.get(Signal.STEP_TIME)

    @property
    def incidents_total(self) -> int:
        """Incidents opened on the run, all checks."""
        return sum(self.incidents_opened.values())

    @property
    def interventions_total(self) -> int:
        """Interventions started on the run: the finished ones and the one under way, if any."""
        return sum(self.interventions_finished.values()) + int(self.intervention_in_progress)


class Named(Protocol):
    @property
    def name(self) -> str: ...


class LatestFindings(Protocol):
    @property
    def latest(self) -> Mapping[str, Finding]: ...


class GuardedRun(Protocol):
    """What a snapshot reads of a guard loop's memory (``IncidentTick`` has it): the run's timeline, each check's
    latest finding, the configured checks and the store's health as the write-behind sees it."""

    @property
    def run_id(self) -> str: ...
    @property
    def history(self) -> RunHistory: ...
    @property
    def tracker(self) -> LatestFindings: ...
    @property
    def checks(self) -> Iterable[Named]: ...
    @property
    def store_degraded(self) -> bool: ...
    @property
    def store_pending_writes(self) -> int: ...
    @property
    def store_dropped_writes(self) -> int: ...


class ExportSource(Protocol):
    """What the exporter reads at each scrape: one snapshot per run (called from the HTTP thread)."""

    def snapshot(self) -> Sequence[RunSnapshot]: ...


def snapshot_from(
    guardian: GuardedRun,
    store: Store,
    now: float,
    *,
    experiment: str | None = None,
    up: bool = True,
    last_poll_success: bool | None = None,
    last_poll_success_at: float | None = None,
    sinks: Sequence[str] = (),
) -> RunSnapshot:
    """The snapshot of ``guardian``'s run at ``now``: step, step age, latest signals and per-check
    verdicts from the guardian's memory; attempt, mode, incidents and interventions from ``store``.

    ``IncidentTick`` does not record whether its polls succeed, so the caller passes that in (see
    ``GuardianSource.record_poll``). ``experiment`` defaults to the run's ``trainer.experiment_name=``
    override when its stored command has one, else the run's name for runs without a stored command
    (``guardian watch``), else the run id. Safe to call from another thread while the guard loop
    ticks: it copies what it reads from memory, and the store opens its own session per call.
    """
    run_id = guardian.run_id
    run = store.get_run(run_id)
    attempt = store.latest_attempt(run_id)
    interventions = store.interventions(run_id)
    incidents = store.list_incidents(run_id)
    open_worst: dict[str, Severity] = {}
    for incident in incidents:
        if incident.is_open:
            open_worst[incident.check] = max(incident.severity, open_worst.get(incident.check, Severity.OK))
    latest = store.latest_step(run_id)
    pins = store.pins(run_id, live=True)
    components = {
        key.removeprefix(keys.REWARD_COMPONENT_PREFIX): value
        for key, value in (latest[1].items() if latest is not None else ())
        if key.startswith(keys.REWARD_COMPONENT_PREFIX) and value is not None
    }
    recorded = RunSnapshot(
        run_id=run_id,
        experiment=experiment or _experiment_of(run, run_id),
        attempt=attempt.number if attempt is not None else None,
        mode=run.mode if run is not None else "",
        reward_components=components,
        incidents_opened=dict(Counter(i.check for i in incidents)),
        open_incidents=open_worst,
        interventions_finished=dict(Counter(i.state.lower() for i in interventions if i.finished)),
        intervention_in_progress=any(not i.finished for i in interventions),
        intervention=_under_way(interventions),
        notifications=_final_deliveries(store.delivery_counts(run_id), sinks),
        pinned_checkpoints=len(pins),
        pinned_bytes=sum(p.bytes_added for p in pins),
    )
    return from_memory(recorded, guardian, now, up, last_poll_success, last_poll_success_at)


def from_memory(
    recorded: RunSnapshot,
    guardian: GuardedRun,
    now: float,
    up: bool = True,
    last_poll_success: bool | None = None,
    last_poll_success_at: float | None = None,
) -> RunSnapshot:
    """``recorded`` (what the store said) with what the guardian's memory says now: step, step age and rate,
    latest signals, per-check verdicts and findings, and the store's own health. Needs no store: while the
    store cannot be read, the exporter keeps the run's live state fresh over the last record it read."""
    history = guardian.history
    step = history.last_step
    arrived = history.arrivals.get(step) if step is not None else None
    signals: dict[Signal, float] = {}
    signal_steps: dict[Signal, int] = {}
    for signal, series in history.series.items():
        value, at = _last(series.values), _last(series.steps)
        if value is not None and at is not None:
            signals[signal], signal_steps[signal] = value, at
    findings = dict(guardian.tracker.latest)
    checks = {check.name: Severity.UNKNOWN for check in guardian.checks}
    checks.update({name: finding.severity for name, finding in findings.items()})
    return replace(
        recorded,
        step=step,
        last_step_age_seconds=max(0.0, now - arrived) if arrived is not None else None,
        steps_per_minute=steps_per_minute(history),
        signals=signals,
        signal_steps=signal_steps,
        checks=checks,
        findings=findings,
        up=up,
        last_poll_success=last_poll_success,
        last_poll_success_at=last_poll_success_at,
        store_degraded=guardian.store_degraded,
        store_pending_writes=guardian.store_pending_writes,
        store_dropped_writes=guardian.store_dropped_writes,
    )


def steps_per_minute(history: RunHistory, window: int = 20) -> float | None:
    """The step rate over the last ``window`` steps' arrivals; None until two arrived apart."""
    arrived = [at for s in history.steps[-window:] if (at := history.arrivals.get(s)) is not None]
    if len(arrived) < 2 or arrived[-1] <= arrived[0]:
        return None
    return 60.0 * (len(arrived) - 1) / (arrived[-1] - arrived[0])


def _under_way(interventions: Sequence[InterventionView]) -> str:
    """The unfinished intervention (at most one runs at a time; the newest, should the store hold more) and its
    state, as people read it; empty when none."""
    active = max((i for i in interventions if not i.finished), key=lambda i: i.number, default=None)
    return f"{active.name}: {active.state}" if active is not None else ""


def _final_deliveries(counts: Mapping[tuple[str, str], int], sinks: Sequence[str]) -> dict[tuple[str, str], int]:
    """Events per (sink, final result), every configured or seen sink from 0: a counter must only grow,
    so the transient ``failing`` is left out (a row leaves it for sent or dropped), and a series that
    starts at 0 lets ``increase()`` see the first drop."""
    names = set(sinks) | {sink for sink, _ in counts}
    return {(sink, result): counts.get((sink, result), 0) for sink in names for result in FINAL_RESULTS}


def _last(values: list[T]) -> T | None:
    """The last element, or None; tolerant of the guard loop truncating the list meanwhile."""
    try:
        return values[-1]
    except IndexError:
        return None


def _experiment_of(run: RunView | None, run_id: str) -> str:
    if run is None:
        return run_id
    if run.command is None:
        return run.name or run_id
    return run.override("trainer.experiment_name") or run_id


@dataclass
class GuardianSource:
    """An ``ExportSource`` over one guard loop's memory (``GuardedRun``): the run's published snapshots, the glue a
    guard loop needs.

    Call it after each tick, on the guard loop's thread: it builds the snapshot there, while nothing changes the
    memory or the store. ``latest`` (the views) and ``snapshot`` (the HTTP threads) hand out that one until the
    next publish, a single reference assignment, so a scrape sees a whole snapshot. The step age is as of the last
    tick. Call ``stopped`` when guarding ends while the exporter lingers. With ``reads_store`` False a snapshot is
    the guardian's memory only.
    """

    guardian: GuardedRun
    store: Store
    clock: Callable[[], float]
    experiment: str | None = None
    up: bool = True
    sinks: Sequence[str] = ()  # the configured notifier / Grafana sinks (their counters start at 0)
    reads_store: bool = True
    store_refresh_s: float = STORE_REFRESH_S  # exporter.store_refresh_s
    _read_at: float | None = field(default=None, init=False)  # when what the store holds was last read
    _poll_ok: bool | None = field(default=None, init=False)
    _poll_ok_at: float | None = field(default=None, init=False)
    _tick_seconds: float | None = field(default=None, init=False)
    _latest: tuple[RunSnapshot, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.publish()

    def __call__(self, ok: bool, seconds: float | None = None, moved: bool = True) -> None:
        """After a tick of the guard loop: note whether it succeeded, how long it took and whether it saw something
        move, and publish the run's snapshot as of now (what the store holds is read again when the tick moved, else
        every ``store_refresh_s``)."""
        self._tick_seconds = seconds
        self.record_poll(ok, moved=moved)

    def record_poll(self, ok: bool, at: float | None = None, *, moved: bool = True) -> None:
        """Note the outcome of one poll (a guard-loop tick) at ``at`` (default: now) and publish the
        run's snapshot as of now."""
        when = self.clock() if at is None else at
        self._poll_ok = ok
        if ok:
            self._poll_ok_at = when
        self.publish(moved=moved)

    def publish(self, *, moved: bool = True) -> None:
        """Build the snapshot that scrapes serve and views draw until the next ``publish``: the guardian's memory,
        over what the store holds - read again unless nothing moved since a read less than ``store_refresh_s`` ago.
        While the store cannot be read (locked, damaged, gone), the run's live state is refreshed over the last
        record read from it."""
        now = self.clock()
        poll = (self.up, self._poll_ok, self._poll_ok_at)
        run_id = self.guardian.run_id
        last = self._latest[0] if self._latest else RunSnapshot(run_id, self.experiment or run_id, store_read=False)
        recent = self._read_at is not None and now - self._read_at < self.store_refresh_s
        if not self.reads_store or (recent and not moved):
            self._latest = (replace(from_memory(last, self.guardian, now, *poll), tick_seconds=self._tick_seconds),)
            return
        try:
            latest = snapshot_from(
                self.guardian,
                self.store,
                now,
                experiment=self.experiment,
                up=self.up,
                last_poll_success=self._poll_ok,
                last_poll_success_at=self._poll_ok_at,
                sinks=self.sinks,
            )
        except DBAPIError as exc:
            if not unavailable(exc):
                raise
            latest = from_memory(replace(last, store_read=False), self.guardian, now, *poll)
        else:
            self._read_at = now
        self._latest = (replace(latest, tick_seconds=self._tick_seconds),)

    def stopped(self) -> None:
        """The guardian stopped guarding the run: from now on scrapes read ``guardian_up 0`` over the last state
        (no store read: it may be what stopped the guardian)."""
        self.up = False
        self._latest = (replace(self._latest[0], up=False),)

    @property
    def latest(self) -> RunSnapshot:
        """The run as of the last publish."""
        return self._latest[0]

    def snapshot(self) -> tuple[RunSnapshot, ...]:
        """The run as of the last publish (read-only: the HTTP threads never replace it)."""
        return self._latest
