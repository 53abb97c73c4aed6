"""``guardian incidents list|show|close``: the incident history, and a person's close of an incident left open.

A close sets status ``closed``, note ``closed by USER: REASON``, the time now and the run's newest step.
Numbering: an incident is ``#<id>``, an intervention ``intervention N of incident #M``, rungs are 1-based in text
(stored 0-based); ``--json`` keeps stored values. Stored text from the trainer always goes out through
``terminal_text``, so an escape sequence in it is shown, never acted on (issue 24, H13).
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from guardian.cli.common import (
    SEVERITY_STYLE,
    AddCommand,
    iso_datetime,
    log,
    open_store,
    print_json,
    resolved_config,
    store_int,
)
from guardian.core import EvidenceValue
from guardian.exits import EXIT_ERROR, EXIT_OK
from guardian.logs import event
from guardian.notify.compose import at_step, format_setting, format_value
from guardian.notify.events import incident_key, intervention_key
from guardian.rescue.outcome import outcome_line
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE
from guardian.review.cost import IncidentCost, RunCost, run_cost
from guardian.review.incidents import IncidentRow, incident_rows
from guardian.review.lineage import AttemptLink, lineage
from guardian.states import IncidentStatus, RunStatus
from guardian.store import IncidentDetail, InterventionEventView, InterventionView, Store, config_changes
from guardian.store.deliveries import DeliveryView

Timeline = Sequence[InterventionEventView]
PAGE_SIZE = 50  # incidents list shows the newest this many unless --limit says otherwise
# what a terminal acts on or that reorders or breaks a line: C0 controls but the tab, DEL, C1 controls (0x9b is
# CSI on its own), the Unicode line separators and the bidirectional overrides and isolates
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def terminal_text(text: str) -> str:
    """``text`` with every control character a terminal would act on written out (``\\x1b``, ``\\u202e``); an
    escape never ends in a backslash, so rich markup after it keeps its meaning."""
    return _TERMINAL_CONTROL.sub(_visible, text)


def register(add: AddCommand) -> None:
    p = add("incidents", "Incident history.")
    isub = p.add_subparsers(dest="action", required=True)
    pl = isub.add_parser(
        "list", help="newest first: detection, action, outcome and what each cost (steps and GPU-hours lost)"
    )
    pl.add_argument("--run", help="only this run id")
    pl.add_argument(
        "--since",
        type=iso_datetime,
        metavar="DATE",
        help="only incidents opened at or after this ISO date or date-time (UTC unless it names a zone)",
    )
    pl.add_argument("--limit", type=store_int, default=PAGE_SIZE, help=f"newest this many (default {PAGE_SIZE})")
    pl.add_argument("--json", action="store_true")
    ps = isub.add_parser("show", help="one incident: findings, rescue timeline, patch, checkpoints, attempts, cost")
    ps.add_argument("id", type=store_int)
    ps.add_argument("--json", action="store_true")
    pc = isub.add_parser(
        "close",
        help="close an open incident by hand (a watch or replay leaves its critical ones open): who and why are "
        "kept in its history and shown by list, show and guardian report",
    )
    pc.add_argument("id", type=store_int)
    pc.add_argument("--reason", required=True, help="why it is closed (kept with the incident)")
    for q in (pl, ps, pc):
        q.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_incidents)


def closer() -> str:
    """Who closes: the login name, else the user id."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def close_note(who: str, reason: str) -> str:
    return f"closed by {who}: {reason}"


def cmd_incidents(args: argparse.Namespace) -> int:
    config = resolved_config(args, reads_history=True)
    with open_store(config) as store:
        if args.action == "close":
            return close_incident(store, args.id, args.reason)
        if args.action == "list":
            rows = incident_rows(store, args.run, args.since, config.cost, limit=args.limit)
            if args.json:
                print_json([r.to_json() for r in rows])
                return EXIT_OK
            console = Console(soft_wrap=True)
            if not rows:
                console.print("no incidents")
            for row in rows:
                for line in list_lines(row):
                    console.print(terminal_text(line))
            for line in run_total_lines(rows):
                console.print(terminal_text(line))
            return EXIT_OK
        detail = store.get_incident(args.id)
        if detail is None:
            log.error(event("error", {"message": f"no incident #{args.id} in {store.url}"}))
            return EXIT_ERROR
        run_id = detail.incident.run_id
        interventions = [(iv, store.intervention_events(iv.id)) for iv in store.interventions(incident_id=args.id)]
        told = incident_deliveries(args.id, interventions, store.deliveries(run_id).values())
        run = store.get_run(run_id)
        cost = run_cost(store, run, config.cost) if run is not None else None
        attempts = lineage(store, run_id)
        if args.json:
            document = detail.to_json()
            document["interventions"] = [
                {**iv.to_json(), "events": [e.to_json() for e in timeline]} for iv, timeline in interventions
            ]
            document["notifications"] = [d.to_json() for d in told]
            document["lineage"] = [a.to_json() for a in attempts]
            document["cost"] = incident_cost_json(cost, args.id)
            print_json(document)
            return EXIT_OK
        console = Console(soft_wrap=True)
        for line in show_lines(detail, interventions, told, attempts, cost):
            console.print(terminal_text(line))
        return EXIT_OK


def close_incident(store: Store, incident_id: int, reason: str) -> int:
    """Close an open incident by hand; an unknown or already closed one is refused and left as it was, and so is one
    whose intervention is still under way in a run that goes on."""
    reason = reason.strip()
    if not reason:
        log.error(event("error", {"message": "--reason is empty: say why the incident is closed"}))
        return EXIT_ERROR
    detail = store.get_incident(incident_id)
    if detail is None:
        log.error(event("error", {"message": f"no incident #{incident_id} in {store.url}"}))
        return EXIT_ERROR
    i = detail.incident
    if not i.is_open:
        when = f" {i.closed_at:%Y-%m-%d %H:%M:%S}" if i.closed_at is not None else ""
        said = f" ({i.note})" if i.note else ""
        message = f"incident #{incident_id} is already closed: {i.status}{when}{said}"
        log.error(event("error", {"message": message}))
        return EXIT_ERROR
    run = store.get_run(i.run_id)
    going = run is not None and run.status == RunStatus.ACTIVE
    rescue = next((iv for iv in store.interventions(incident_id=incident_id) if not iv.finished), None)
    if going and rescue is not None:  # the rescue closes the incident as it ends, over any close of a person's
        message = (
            f"{rescue.name} is at {rescue.state}: the rescue closes incident #{incident_id} when it ends; to end the "
            f"run instead, guardian stop {i.run_id} first"
        )
        log.error(event("error", {"message": message}))
        return EXIT_ERROR
    latest = store.latest_step(i.run_id)
    note = close_note(closer(), reason)
    store.close_incident(
        incident_id, status=IncidentStatus.CLOSED, now=time.time(), step=latest[0] if latest else None, note=note
    )
    log.info(event("incident_closed", {"incident": incident_id, "run": i.run_id, "note": note}))
    Console(soft_wrap=True).print(terminal_text(escape(f"incident #{incident_id} {note}")))
    return EXIT_OK


def incident_cost_json(cost: RunCost | None, incident_id: int) -> dict[str, object] | None:
    """The incident's loss with the rate it was priced at (None: the run is not in the store)."""
    if cost is None:
        return None
    spent = cost.incident(incident_id) or IncidentCost(incident_id, (), 0.0, 0.0)  # no intervention: nothing lost
    return {"rate": cost.rate.to_json(), **spent.to_json()}


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


def _hours(value: float | None) -> str:
    return "? GPU-h" if value is None else f"{value:.3g} GPU-h"


def list_lines(row: IncidentRow) -> list[str]:
    """One incident of ``guardian incidents list``: run, incident, check, severity, detection (step, time, onset),
    the action (kind, rung name, rung), where it ended, what it cost; then the outcome's figures."""
    i, iv = row.incident, row.action
    style = SEVERITY_STYLE[i.severity.label]
    onset = f" (onset step {i.onset_step})" if i.onset_step is not None else ""
    action = "no action"
    if iv is not None:
        rung = f" {iv.plan.rung}" if iv.plan and iv.plan.rung else ""
        action = f"{iv.kind}{rung} (rung {iv.rung + 1})"
    lost = f"{row.steps_lost} steps, {_hours(row.gpu_hours_lost)} lost"
    lines = [
        f"#{i.id:<4} {escape(i.run_id):28} {i.check:18} [{style}]{i.severity.label:8}[/] "
        f"detected {at_step(i.opened_step)}{onset} {i.opened_at:%Y-%m-%d %H:%M:%S}  {action:26} "
        f"{row.final_state:10} {lost}"
    ]
    if row.outcome_line is not None:
        lines.append(f"      outcome: {escape(row.outcome_line)}")
    if i.status == IncidentStatus.CLOSED and i.note:
        lines.append(f"      {escape(i.note)}")
    return lines


def _usd(value: float | None) -> str:
    return "" if value is None else f" (${value:.2f})"


def run_total_lines(rows: Sequence[IncidentRow]) -> list[str]:
    """Per run with a rollback among the rows: all its incidents' loss, and the floor of the same by hand."""
    costs = {r.run_cost.run_id: r.run_cost for r in rows}
    lines = []
    for run_id, c in costs.items():
        if not c.rolled_back_incidents:
            continue
        lost = f"{c.steps_lost} steps, {_hours(c.gpu_hours_lost)}{_usd(c.rate.usd(c.gpu_hours_lost))}"
        by_hand = f"{c.manual_steps} steps, {_hours(c.manual_gpu_hours)}{_usd(c.rate.usd(c.manual_gpu_hours))}"
        lines.append(
            f"run {escape(run_id)}: {lost} lost to {c.rolled_back_incidents} rolled-back incident(s); "
            f"by hand ({c.manual_lag_steps} steps late each) at least {by_hand}"
        )
    return lines


def lineage_lines(attempts: Sequence[AttemptLink]) -> list[str]:
    """The run's attempts: which one launched which, resumed from where, with what patch."""
    lines = ["  attempts:"] if attempts else []
    for a in attempts:
        origin = ""
        if a.launched_by is not None:
            by = a.launched_by
            rung = f", {by.rung_name}" if by.rung_name else ""
            after = f" after attempt {by.from_attempt}" if by.from_attempt is not None else ""
            origin = f" <- {by.name} ({by.kind}{rung}){after}"
        logged = f"steps {a.first_step}-{a.last_step}" if a.first_step is not None else "no step logged"
        ended = "running or not recorded" if a.ended_at is None else f"ended {a.ended_at:%Y-%m-%d %H:%M:%S}"
        code = f", exit {a.exit_code}" if a.exit_code is not None else ""
        lines.append(f"    attempt {a.number}{origin}: {escape(a.summary)}")
        lines.append(f"      {logged}; started {a.started_at:%Y-%m-%d %H:%M:%S}, {ended}{code}")
    return lines


def cost_lines(cost: RunCost | None, incident_id: int) -> list[str]:
    """What the incident's rollbacks threw away, priced at the run's rate."""
    spent = cost.incident(incident_id) if cost is not None else None
    if cost is None or spent is None or not spent.rolled_back:
        return ["  lost: nothing (no rollback)"]
    rate = cost.rate
    thrown = ", ".join(
        f"steps {d.first_step}-{d.last_step} by intervention {d.intervention_number}" for d in spent.discards
    )
    if spent.gpu_hours is None:
        return [f"  lost: {spent.steps_lost} steps ({thrown}); GPU-hours unknown: {escape(rate.unknown or '')}"]
    price = f" (${spent.usd:.2f} at ${rate.gpu_hour_usd:g}/GPU-hour)" if spent.usd is not None else ""
    return [
        f"  lost: {spent.steps_lost} steps ({thrown}), {spent.gpu_hours:.3g} GPU-hours{price}; "
        f"{rate.step_seconds:.3g} s/step × {rate.gpus} GPUs ({rate.gpus_source})"
    ]


def show_lines(
    detail: IncidentDetail,
    interventions: Sequence[tuple[InterventionView, Timeline]],
    told: Sequence[DeliveryView],
    attempts: Sequence[AttemptLink] = (),
    cost: RunCost | None = None,
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
    if interventions:
        lines += cost_lines(cost, i.id)
        lines += lineage_lines(attempts)
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
