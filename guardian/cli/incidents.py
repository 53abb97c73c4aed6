"""``guardian incidents list|show``: the incident history."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence

from rich.console import Console

from guardian.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    SEVERITY_STYLE,
    AddCommand,
    log,
    open_store,
    print_json,
    resolved_config,
)
from guardian.logs import event
from guardian.notify.events import incident_key, intervention_key
from guardian.outcome import outcome_line
from guardian.store import InterventionEventView, InterventionView
from guardian.store.deliveries import DeliveryView


def register(add: AddCommand) -> None:
    p = add("incidents", "Incident history.")
    isub = p.add_subparsers(dest="action", required=True)
    pl = isub.add_parser("list", help="newest first")
    pl.add_argument("--run", help="only this run id")
    pl.add_argument("--limit", type=int, default=50)
    pl.add_argument("--json", action="store_true")
    ps = isub.add_parser("show", help="one incident with its findings")
    ps.add_argument("id", type=int)
    ps.add_argument("--json", action="store_true")
    for q in (pl, ps):
        q.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_incidents)


def cmd_incidents(args: argparse.Namespace) -> int:
    config = resolved_config(args)
    with open_store(config) as store:
        if args.action == "list":
            incidents = store.list_incidents(args.run, limit=args.limit)
            if args.json:
                print_json([i.to_json() for i in incidents])
                return EXIT_OK
            console = Console()
            if not incidents:
                console.print("no incidents")
            for i in incidents:
                style = SEVERITY_STYLE[i.severity.label]
                console.print(
                    f"#{i.id:<4} {i.run_id:28} step {i.opened_step!s:>6} (onset {i.onset_step!s:>5}) "
                    f"[{style}]{i.severity.label:8}[/] {i.status:10} {i.check:18} {i.message}"
                )
            return EXIT_OK
        detail = store.get_incident(args.id)
        if detail is None:
            log.error(event("error", {"message": f"no incident #{args.id} in {store.url}"}))
            return EXIT_ERROR
        interventions = [(iv, store.intervention_events(iv.id)) for iv in store.interventions(incident_id=args.id)]
        told = incident_deliveries(args.id, interventions, store.deliveries(detail.incident.run_id).values())
        if args.json:
            document = detail.to_json()
            document["interventions"] = [
                {**iv.to_json(), "events": [e.to_json() for e in timeline]} for iv, timeline in interventions
            ]
            document["notifications"] = [d.to_json() for d in told]
            print_json(document)
            return EXIT_OK
        console = Console()
        i = detail.incident
        console.print(
            f"[bold]incident #{i.id}[/] run {i.run_id}: {i.check} [{SEVERITY_STYLE[i.severity.label]}]"
            f"{i.severity.label}[/] status {i.status}"
        )
        console.print(f"  opened at step {i.opened_step} (estimated onset {i.onset_step}) - {i.message}")
        for key, value in i.evidence.items():
            console.print(f"    {key} = {value:.4g}" if isinstance(value, float) else f"    {key} = {value}")
        for f in detail.findings:
            console.print(f"  step {f.step!s:>6} {f.severity.label:8} {f.check:18} {f.message}")
        for iv, timeline in interventions:
            console.print(f"  intervention {iv.number} ({iv.kind}, rung {iv.rung}): {iv.state}")
            for e in timeline:
                why = e.detail.get("why")
                console.print(f"    {e.at:%Y-%m-%d %H:%M:%S} {e.state}" + (f" - {why}" if why else ""))
                if isinstance(outcome := e.detail.get("outcome"), Mapping):
                    console.print(f"      figures: {outcome_line(outcome)}")
        for d in told:
            error = f" - {d.last_error}" if d.last_error else ""
            console.print(f"  told {d.sink}: {d.event_key} {d.status} ({d.attempts} attempt(s)){error}")
        return EXIT_OK


def incident_deliveries(
    incident_id: int,
    interventions: Sequence[tuple[InterventionView, Sequence[InterventionEventView]]],
    deliveries: Iterable[DeliveryView],
) -> list[DeliveryView]:
    """What each notifier and Grafana were told about one incident (its own events and its interventions')."""
    keys = {intervention_key(e.id) for _, timeline in interventions for e in timeline}
    prefix = incident_key(incident_id, "")
    return [d for d in deliveries if d.event_key in keys or d.event_key.startswith(prefix)]
