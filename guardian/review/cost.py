"""What incidents cost in compute: GPU-hours (and money) of the steps each rollback threw away, against a manual
rescue. Pure pricing (``price``) apart from the store reads (``run_cost``).

Lost = steps discarded × median step time × GPUs (verl's defaults 8 × 1 where the command sets neither).
Both figures are floors; unknown step time or GPUs give None with the reason, never a guess."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from guardian.config import CostConfig
from guardian.history.timeline import median
from guardian.keys import ALIASES, Signal
from guardian.review.steps import Timelines, discarded_by_intervention
from guardian.store import InterventionView, RunView, Store

GPUS_PER_NODE_KEY = "trainer.n_gpus_per_node"
NODES_KEY = "trainer.nnodes"
VERL_GPUS_PER_NODE = 8  # verl's ppo_trainer.yaml defaults
VERL_NODES = 1
SECONDS_PER_HOUR = 3600.0


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True, slots=True)
class Rate:
    """What one step of the run costs: its typical time, its GPUs and the price of a GPU-hour."""

    step_seconds: float | None
    gpus: int | None
    gpus_source: str  # "command" or "verl defaults" (the command sets neither key, or there is no command)
    gpu_hour_usd: float
    unknown: str | None  # why GPU-hours cannot be priced (None: they can)

    def gpu_hours(self, steps: int) -> float | None:
        if self.step_seconds is None or self.gpus is None:
            return None
        return steps * self.step_seconds * self.gpus / SECONDS_PER_HOUR

    def usd(self, gpu_hours: float | None) -> float | None:
        return None if gpu_hours is None else gpu_hours * self.gpu_hour_usd

    def to_json(self) -> dict[str, object]:
        return {
            "step_seconds": _round(self.step_seconds),
            "gpus": self.gpus,
            "gpus_source": self.gpus_source,
            "gpu_hour_usd": self.gpu_hour_usd,
            "unknown": self.unknown,
        }


@dataclass(frozen=True, slots=True)
class Discard:
    """The steps one intervention's rollback threw away."""

    intervention_id: int
    intervention_number: int
    target_step: int | None  # None: from scratch
    steps: int
    first_step: int | None
    last_step: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "intervention_id": self.intervention_id,
            "intervention_number": self.intervention_number,
            "target_step": self.target_step,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }


@dataclass(frozen=True, slots=True)
class IncidentCost:
    """One incident's loss: every rollback of its interventions (a relapse rolls back again)."""

    incident_id: int
    discards: tuple[Discard, ...]
    gpu_hours: float | None
    usd: float | None

    @property
    def steps_lost(self) -> int:
        return sum(d.steps for d in self.discards)

    @property
    def rolled_back(self) -> bool:
        return bool(self.discards)

    def to_json(self) -> dict[str, object]:
        return {
            "incident_id": self.incident_id,
            "steps_lost": self.steps_lost,
            "gpu_hours": _round(self.gpu_hours),
            "usd": _round(self.usd, 2),
            "discards": [d.to_json() for d in self.discards],
        }


@dataclass(frozen=True, slots=True)
class RunCost:
    """A run's losses to incidents under the guardian, beside the floor of the same incidents by hand."""

    run_id: str
    rate: Rate
    incidents: tuple[IncidentCost, ...]  # every incident with an intervention, by id
    manual_lag_steps: int

    @property
    def steps_lost(self) -> int:
        return sum(i.steps_lost for i in self.incidents)

    @property
    def gpu_hours_lost(self) -> float | None:
        return self.rate.gpu_hours(self.steps_lost)

    @property
    def rolled_back_incidents(self) -> int:
        return sum(1 for i in self.incidents if i.rolled_back)

    @property
    def manual_steps(self) -> int:
        return self.rolled_back_incidents * self.manual_lag_steps

    @property
    def manual_gpu_hours(self) -> float | None:
        return self.rate.gpu_hours(self.manual_steps)

    def incident(self, incident_id: int) -> IncidentCost | None:
        return next((i for i in self.incidents if i.incident_id == incident_id), None)

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "rate": self.rate.to_json(),
            "steps_lost": self.steps_lost,
            "gpu_hours_lost": _round(self.gpu_hours_lost),
            "usd_lost": _round(self.rate.usd(self.gpu_hours_lost), 2),
            "manual": {
                "lag_steps": self.manual_lag_steps,
                "incidents": self.rolled_back_incidents,
                "steps": self.manual_steps,
                "gpu_hours": _round(self.manual_gpu_hours),
                "usd": _round(self.rate.usd(self.manual_gpu_hours), 2),
            },
            "incidents": [i.to_json() for i in self.incidents],
        }


def median_step_seconds(values: Sequence[float | None]) -> float | None:
    """The median of the run's finite, positive step times, whole run (None: none logged); the stall check's
    ``typical_step_seconds`` is the recent pace instead."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return median(finite) if finite else None


def run_gpus(run: RunView) -> tuple[int | None, str, str | None]:
    """The run's GPUs from its stored command: (count, where it came from, why unknown)."""
    given = {key: run.override(key) for key in (GPUS_PER_NODE_KEY, NODES_KEY)}
    source = "command" if any(v is not None for v in given.values()) else "verl defaults"
    bad = [f"{key}={value}" for key, value in given.items() if value is not None and not value.isdigit()]
    if bad:
        return None, source, f"the command's {' '.join(bad)} is not a whole number of GPUs"
    count = int(given[GPUS_PER_NODE_KEY] or VERL_GPUS_PER_NODE) * int(given[NODES_KEY] or VERL_NODES)
    return (count, source, None) if count > 0 else (None, source, f"the command names {count} GPUs")


def run_rate(run: RunView, step_seconds: float | None, config: CostConfig) -> Rate:
    gpus, source, bad_gpus = run_gpus(run)
    no_time = f"the run logged no step time ({ALIASES[Signal.STEP_TIME][0]})" if step_seconds is None else None
    unknown = "; ".join(why for why in (no_time, bad_gpus) if why) or None
    return Rate(step_seconds, gpus, source, config.gpu_hour_usd, unknown)


def price(
    run_id: str,
    rate: Rate,
    interventions: Sequence[InterventionView],
    discarded: Mapping[int, Sequence[int]],
    config: CostConfig,
) -> RunCost:
    """The run's cost from its interventions and the steps each one discarded (``discarded_by_intervention``)."""
    by_incident: dict[int, list[Discard]] = {}
    for iv in sorted(interventions, key=lambda iv: iv.number):
        steps = discarded.get(iv.id, ())
        found = by_incident.setdefault(iv.incident_id, [])
        if steps:
            found.append(Discard(iv.id, iv.number, iv.target_step, len(steps), min(steps), max(steps)))
    incidents = []
    for incident_id, discards in sorted(by_incident.items()):
        hours = rate.gpu_hours(sum(d.steps for d in discards))
        incidents.append(IncidentCost(incident_id, tuple(discards), hours, rate.usd(hours)))
    return RunCost(run_id, rate, tuple(incidents), config.manual_detection_lag_steps)


def step_times(store: Store, run_id: str) -> list[float | None]:
    """The run's logged step times along its timeline (the first alias a step carries)."""
    keys = ALIASES[Signal.STEP_TIME]
    series = store.step_series(run_id, keys)
    by_step: dict[int, float | None] = {}
    for key in reversed(keys):  # the first alias wins: written last
        by_step.update(dict(series[key]))
    return list(by_step.values())


def priced(
    store: Store,
    run: RunView,
    interventions: Sequence[InterventionView],
    timelines: Timelines,
    config: CostConfig,
) -> RunCost:
    """The run's cost from its interventions and their timelines already read (the incident list reads them too)."""
    discarded = discarded_by_intervention(interventions, timelines, store.step_index(run.id), store.attempts(run.id))
    rate = run_rate(run, median_step_seconds(step_times(store, run.id)), config)
    return price(run.id, rate, interventions, discarded, config)


def run_cost(store: Store, run: RunView, config: CostConfig) -> RunCost:
    """Read the run's steps, attempts and interventions and price its incidents."""
    return priced(store, run, store.interventions(run.id), store.run_timelines(run.id), config)
