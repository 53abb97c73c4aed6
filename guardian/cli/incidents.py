"""``guardian incidents list|show``: the incident history.

Human-facing text follows one numbering: an incident is ``#<incident id>``; an intervention is named by
its stored number and its incident (``intervention 3 of incident #2``), never by a bare ``#``; rungs are 1-based
(``rung 1`` is the ladder's first rung, stored as 0). ``--json`` keeps the stored values and names.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from guardian.checks.findings import EvidenceValue
from guardian.cli.common import SEVERITY_STYLE, AddCommand, log, open_store, print_json, resolved_config, store_int
from guardian.exits import EXIT_ERROR, EXIT_OK
from guardian.logs import event
from guardian.notify.compose import at_step, format_setting, format_value
from guardian.notify.events import incident_key, intervention_key
from guardian.rescue.outcome import outcome_line
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE
from guardian.store import IncidentDetail, InterventionEventView, InterventionView, config_changes
from guardian.store.deliveries import DeliveryView

Timeline = Sequence[InterventionEventView]
PAGE_SIZE = 50  # incidents list shows the newest this many unless --limit says otherwise


def register(add: AddCommand) -> None:
    p = add("incidents", "Incident history.")
    isub = p.add_subparsers(dest="action", required=True)
    pl = isub.add_parser("list", help="newest first")
    pl.add_argument("--run", help="only this run id")
    pl.add_argument("--limit", type=store_int, default=PAGE_SIZE, help=f"newest this many (default {PAGE_SIZE})")
    pl.add_argument("--json", action="store_true")
    ps = isub.add_parser("show", help="one incident with its findings")
    ps.add_argument("id", type=store_int)
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
            console = Console(soft_wrap=True)
            if not incidents:
                console.print("no incidents")
            for i in incidents:
                style = SEVERITY_STYLE[i.severity.label]
                onset = f" (onset step {i.onset_step})" if i.onset_step is not None else ""
                console.print(
                    f"#{i.id:<4} {escape(i.run_id):28} {at_step(i.opened_step)}{onset} "
                    f"[{style}]{i.severity.label:8}[/] {i.status:10} {i.check:18} {escape(i.message)}"
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
        console = Console(soft_wrap=True)
        for line in show_lines(detail, interventions, told):
            console.print(line)
        return EXIT_OK


# ------------------------------------------------------------------------------------------ the text view (pure)


@dataclass(frozen=True, slots=True)
class Stage:
    """One state of an intervention's timeline: when it was first entered, the details of all its events."""

    state: str
    at: str
    detail: Mapping[str, object]


def stages(timeline: Timeline) -> list[Stage]:
    """Each state once, in the order first entered; a state committed twice (STOPPED, then STOPPED with its
    rollback target) has the details of both, the later winning."""
    merged: dict[str, tuple[str, dict[str, object]]] = {}
    for e in timeline:
        merged.setdefault(e.state, (f"{e.at:%Y-%m-%d %H:%M:%S}", {}))[1].update(e.detail)
    return [Stage(state, at, detail) for state, (at, detail) in merged.items()]


def _steps(value: object) -> str:
    steps = [str(s) for s in value] if isinstance(value, list) else []
    return ", ".join(steps) if steps else "none"


def intervention_lines(iv: InterventionView, timeline: Timeline) -> list[str]:
    by_state = {s.state: s for s in stages(timeline)}
    lines = [f"  [bold]{iv.name}[/] ({iv.kind}, rung {iv.rung + 1}): {iv.state}"]
    rolled_back = by_state.get("ROLLED_BACK")
    why = next((str(s.detail["why"]) for s in (by_state.get("STOPPED"), rolled_back) if s and s.detail.get("why")), "")
    if iv.target_step is not None:
        where = f" ({escape(iv.target_path)})" if iv.target_path else ""
        lines.append(
            f"    rollback target: checkpoint of step {iv.target_step}{where}" + (f" - {escape(why)}" if why else "")
        )
    elif rolled_back is not None:
        lines.append("    rollback target: none, from scratch" + (f" - {escape(why)}" if why else ""))
    if rolled_back is not None:
        moved = f"    quarantined checkpoints: {_steps(rolled_back.detail.get('moved'))}"
        if rolled_back.detail.get("tracker") is not None:
            moved += f"; tracker rewritten to step {rolled_back.detail['tracker']}"
        lines.append(moved)
        dumps = rolled_back.detail.get("dumps_quarantined")
        if isinstance(dumps, list) and dumps:
            lines.append(f"    quarantined rollout dumps: {len(dumps)} (steps {dumps[0]}-{dumps[-1]})")
    patched = by_state.get("PATCHED")
    diff = (iv.plan.diff if iv.plan else ()) or config_changes(patched.detail.get("diff") if patched else None)
    if diff:
        lines.append("    patch:")
        lines.extend(
            f"      {escape(k)}: {escape(format_setting(b))} -> {escape(format_setting(a))}" for k, b, a in diff
        )
    notes = (iv.plan.notes if iv.plan else ()) or (patched.detail.get("notes") if patched else None)
    lines.extend(f"      note: {escape(str(n))}" for n in (notes if isinstance(notes, list) else []))
    lines.append("    timeline:")
    for s in by_state.values():
        said = s.detail.get("why")
        if s.state == "STOPPING" and s.detail.get("plan"):
            said = s.detail["plan"]
        elif s.state == "PROBATION" and s.detail.get("first_step") is not None:
            said = f"resumed at step {s.detail['first_step']}"
        lines.append(f"      {s.at} {s.state}" + (f" - {escape(str(said))}" if said else ""))
        if isinstance(outcome := s.detail.get("outcome"), Mapping):
            lines.append(f"        figures: {escape(outcome_line(outcome))}")
    return lines


def _evidence_lines(evidence: Mapping[str, EvidenceValue]) -> list[str]:
    lines = []
    for key, value in evidence.items():
        if value is None:
            continue
        if key == CRASH_OUTPUT_EVIDENCE:
            lines.append(f"    {escape(key)}:")
            lines.extend(f"      | {escape(line)}" for line in str(value).splitlines())
            continue
        lines.append(f"    {escape(key)} = {escape(format_value(value))}")
    return lines


def delivery_label(incident_id: int, d: DeliveryView, names: Mapping[str, str]) -> str:
    """What a delivery told, in the text view's numbering (the stored key is in ``--json``)."""
    if d.event_key in names:
        return names[d.event_key]
    suffix = d.event_key.removeprefix(incident_key(incident_id, ""))
    return f"incident #{incident_id} {'closed' if suffix == 'closed' else f'{suffix} alert'}"


def show_lines(
    detail: IncidentDetail,
    interventions: Sequence[tuple[InterventionView, Timeline]],
    told: Sequence[DeliveryView],
) -> list[str]:
    """``guardian incidents show ID`` as lines of rich markup."""
    i = detail.incident
    style = SEVERITY_STYLE[i.severity.label]
    onset = f" (estimated onset step {i.onset_step})" if i.onset_step is not None else ""
    lines = [
        f"[bold]incident #{i.id}[/] run {escape(i.run_id)}: {i.check} [{style}]{i.severity.label}[/], "
        f"status {i.status}",
        f"  opened {at_step(i.opened_step)}{onset} - {escape(i.message)}",
    ]
    if i.closed_at is not None:
        lines.append(f"  closed {at_step(i.closed_step)}" + (f" - {escape(i.note)}" if i.note else ""))
    evidence = _evidence_lines(i.evidence)
    if evidence:
        lines += ["  evidence:", *evidence]
    if detail.findings:
        lines.append("  findings:")
        lines.extend(
            f"    {at_step(f.step)} {f.severity.label:8} {f.check:18} {escape(f.message)}" for f in detail.findings
        )
    for iv, timeline in interventions:
        lines += intervention_lines(iv, timeline)
    names = {intervention_key(e.id): f"{iv.name} {e.state}" for iv, timeline in interventions for e in timeline}
    for d in told:
        error = f" - {escape(d.last_error)}" if d.last_error else ""
        lines.append(f"  told {d.sink}: {delivery_label(i.id, d, names)} {d.status} ({d.attempts} attempt(s)){error}")
    return lines


def incident_deliveries(
    incident_id: int,
    interventions: Sequence[tuple[InterventionView, Sequence[InterventionEventView]]],
    deliveries: Iterable[DeliveryView],
) -> list[DeliveryView]:
    """What each notifier and Grafana were told about one incident (its own events and its interventions')."""
    keys = {intervention_key(e.id) for _, timeline in interventions for e in timeline}
    prefix = incident_key(incident_id, "")
    return [d for d in deliveries if d.event_key in keys or d.event_key.startswith(prefix)]
