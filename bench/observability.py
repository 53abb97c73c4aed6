"""Observability benchmark: what a Prometheus scrape and a notification sweep cost on a long run.

    python bench/observability.py [--steps 10000] [--incidents 60] [--scrapes 50] [--json]

Builds a SQLite store (temp dir) holding one run of ``--steps`` steps (the verl keys a real GRPO step
logs), ``--incidents`` incidents (every third with an intervention of 8 states), and a ``IncidentTick``
whose history holds every step; three sinks have already had every event. Then:

1. scrape: ``GuardianSource.publish`` then ``generate_latest`` over the exporter's registry, timed
   ``--scrapes`` times. ``publish`` builds the run's snapshot (``snapshot_from``: the guard loop's memory
   and the store's run, attempt, interventions, incidents, latest step and deliveries); the exporter
   does that once after each tick and its scrapes serve the latest snapshot, so without a ``publish``
   per iteration the figure would be the rendering alone. ``publish`` is also timed on its own. The
   baseline is one ``store.latest_step`` query in the same run (the cheapest read a snapshot does).
2. sweep: ``Dispatcher.pass_once`` in the steady state (every event already delivered: the
   once-a-second cost of the background thread), against ``load_events`` alone as the baseline.

Targets: a scrape well under Prometheus's default 10 s scrape timeout (< 100 ms), a sweep small next
to its 1 s interval (< 100 ms). No assertion: figures are printed next to the targets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from common import json_safe
from prometheus_client import generate_latest

from guardian.config import GuardianConfig
from guardian.core import Finding, Severity, StepRecord
from guardian.incidents.tick import IncidentTick
from guardian.notify.dispatcher import Dispatcher, DispatchPolicy
from guardian.notify.events import GuardianEvent, Level, load_events
from guardian.sinks.prometheus import build_registry
from guardian.sinks.snapshot import GuardianSource
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store
from guardian.store.deliveries import DeliveryView

RUN = "bench-run"
STATES = ("STOPPING", "STOPPED", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION", "RESOLVED")


def step_values(step: int) -> dict[str, float]:
    return {
        "actor/entropy": 1.2 - step * 1e-5,
        "actor/kl_loss": 0.001 * (1 + step * 1e-4),
        "actor/grad_norm": 0.4,
        "actor/pg_loss": 0.01,
        "actor/lr": 1e-6,
        "critic/score/mean": 0.3 + step * 2e-5,
        "response_length/mean": 400.0,
        "rollout_corr/training_log_ppl": 0.35,
        "timing_s/step": 95.0,
        "num_turns/mean": 4.0,
    }


class DoneSink:
    """A sink that has had every event (the steady state) and is never asked again."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cooldown_s = 0.0

    def wants(self, event: GuardianEvent) -> bool:
        return event.level >= Level.INFO

    def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
        raise AssertionError("steady state: nothing left to deliver")

    def close(self) -> None:
        return None


def build(folder: Path, steps: int, incidents: int) -> tuple[Store, IncidentTick]:
    store = Store.open(f"sqlite:///{folder / 'bench.db'}")
    metrics = folder / "metrics.jsonl"
    metrics.write_text("")
    store.ensure_run(
        RUN, name=RUN, metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="enforce", now=0
    )
    attempt = store.start_attempt(RUN, metrics_path=str(metrics), now=0.0)
    records = [StepRecord(s, step_values(s)) for s in range(1, steps + 1)]
    store.write_steps(RUN, attempt.id, 0, records, now=1.0)
    guardian = IncidentTick(
        config=GuardianConfig(), store=store, run_id=RUN, metrics=MetricsFile(metrics), clock=time.time
    )
    for record in records:
        guardian.history.add(record, arrived_at=float(record.step))
    for i in range(incidents):
        finding = Finding("entropy_collapse", Severity.CRITICAL, 100 + i * 50, "collapsed", onset_step=90 + i * 50)
        incident = store.open_incident(RUN, finding, now=10.0 + i)
        if i % 3 == 0:
            iv = store.create_intervention(
                RUN, incident.id, kind="remediate", rung=0, from_attempt_id=attempt.id, now=11.0 + i
            )
            for state in STATES:
                store.advance(iv.id, state, now=12.0 + i, detail={"why": "bench"})
        store.close_incident(incident.id, status="resolved", now=20.0 + i, note="bench")
    for sink in ("log", "oncall", "grafana"):
        for ev in load_events(store, RUN):
            store.record_delivery(RUN, sink, ev.key, check=ev.check, level=int(ev.level), status="sent", now=30.0)
    return store, guardian


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm caches and imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"median_ms": 1e3 * statistics.median(ordered), "p95_ms": 1e3 * ordered[int(0.95 * (len(ordered) - 1))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--incidents", type=int, default=60)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store, guardian = build(Path(tmp), args.steps, args.incidents)
        source = GuardianSource(guardian, store, time.time, sinks=("log", "oncall", "grafana"))
        registry = build_registry(source)
        exposition = generate_latest(registry)

        def scrape_once() -> bytes:
            source.publish()  # the store reads: once per tick in the exporter, here once per scrape
            return generate_latest(registry)

        scrape = summary(timed(scrape_once, args.scrapes))
        publish = summary(timed(source.publish, args.scrapes))
        latest = summary(timed(lambda: store.latest_step(RUN), args.scrapes))
        dispatcher = Dispatcher(
            store, RUN, [DoneSink(n) for n in ("log", "oncall", "grafana")], DispatchPolicy(), time.time
        )
        sweep = summary(timed(dispatcher.pass_once, args.scrapes))
        events = summary(timed(lambda: load_events(store, RUN), args.scrapes))
        n_events = len(load_events(store, RUN))
        store.close()
    figures = {
        "steps": args.steps,
        "incidents": args.incidents,
        "events": n_events,
        "exposition_bytes": len(exposition),
        "exposition_series": sum(1 for line in exposition.decode().splitlines() if line and not line.startswith("#")),
        "scrape": scrape,
        "publish": publish,
        "scrape_vs_latest_step_query": scrape["median_ms"] / latest["median_ms"],
        "sweep": sweep,
        "sweep_vs_load_events": sweep["median_ms"] / events["median_ms"],
        "targets": {"scrape_p95_ms": 100, "sweep_p95_ms": 100},
    }
    if args.json:
        sys.stdout.write(json.dumps(json_safe(figures), indent=2) + "\n")
        return 0
    out = sys.stdout.write
    out(f"run: {args.steps} steps, {args.incidents} incidents, {n_events} events, 3 sinks\n")
    out(f"exposition: {figures['exposition_series']} series, {len(exposition)} bytes\n")
    out(f"scrape: median {scrape['median_ms']:.1f} ms, p95 {scrape['p95_ms']:.1f} ms (target p95 < 100 ms); ")
    out(f"{figures['scrape_vs_latest_step_query']:.1f}x one latest-step query ({latest['median_ms']:.2f} ms)\n")
    out(f"  of which publish (building the snapshot: store reads, memory copy): median {publish['median_ms']:.1f} ms, ")
    out(f"p95 {publish['p95_ms']:.1f} ms\n")
    out(f"sweep: median {sweep['median_ms']:.1f} ms, p95 {sweep['p95_ms']:.1f} ms (target p95 < 100 ms); ")
    out(f"{figures['sweep_vs_load_events']:.1f}x reading the events alone ({events['median_ms']:.1f} ms)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
