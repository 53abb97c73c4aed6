"""A report's data from the store and the run's rollout dumps: the only part of ``guardian report`` that reads.

An incident's report spans the steps around it, a run's every step; both read every line of steps, so abandoned
branches are drawn beside the kept one."""

from __future__ import annotations

from collections.abc import Sequence

from guardian.config import GuardianConfig
from guardian.report import series, story
from guardian.report.model import Report
from guardian.report.trajectories import dump_folders, highest_reward
from guardian.review.cost import run_cost
from guardian.review.lineage import lineage
from guardian.store import IncidentDetail, RunView, Store
from guardian.store.views import StepLine, at_utc


def incident_report(store: Store, incident_id: int, config: GuardianConfig, now: float) -> Report | None:
    """The report of one incident; None when the store holds no such incident."""
    detail = store.get_incident(incident_id)
    run = store.get_run(detail.incident.run_id) if detail is not None else None
    if detail is None or run is None:
        return None
    intervened = [(iv, store.intervention_events(iv.id)) for iv in store.interventions(incident_id=incident_id)]
    lines = store.step_lines(run.id, series.READ_KEYS, series.READ_PREFIXES)
    marked = story.markers([detail], intervened)
    steps = story.incident_steps(detail, marked, config.report.context_steps, series.step_range(lines))
    return _report(store, config, run, detail, [detail], intervened, lines, steps, now)


def run_report(store: Store, run_id: str, config: GuardianConfig, now: float) -> Report | None:
    """The report of a whole run; None when the store holds no such run."""
    run = store.get_run(run_id)
    if run is None:
        return None
    details = [d for i in reversed(store.list_incidents(run_id)) if (d := store.get_incident(i.id)) is not None]
    timelines = store.run_timelines(run_id)
    intervened = [(iv, timelines.get(iv.id, [])) for iv in store.interventions(run_id)]
    lines = store.step_lines(run_id, series.READ_KEYS, series.READ_PREFIXES)
    return _report(store, config, run, None, details, intervened, lines, series.step_range(lines), now)


def _report(
    store: Store,
    config: GuardianConfig,
    run: RunView,
    incident: IncidentDetail | None,
    details: Sequence[IncidentDetail],
    intervened: story.Intervened,
    lines: Sequence[StepLine],
    steps: series.StepRange | None,
    now: float,
) -> Report:
    wanted = config.report.trajectories
    sample = None
    if wanted:
        folders = dump_folders(run, store.attempts(run.id))
        kept = series.kept_attempts(lines)
        sample = highest_reward(folders, steps, kept, wanted, max_line_bytes=config.sources.max_line_bytes)
    return Report(
        run=run,
        incident=incident,
        steps=steps,
        plots=series.plots(lines, steps),
        markers=story.markers(details, intervened),
        timeline=story.timeline(details, intervened),
        patches=story.patches(intervened),
        lineage=lineage(store, run.id),
        cost=run_cost(store, run, config.cost),
        trajectories=sample,
        generated_at=at_utc(now),
    )
