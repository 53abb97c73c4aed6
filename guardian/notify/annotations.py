"""Incidents and intervention steps as Grafana annotations (a dispatcher sink).

An incident is a *region* (posted at opening, its end set at closing); stop, rollback, patch, resume and the
outcome are *points*. Each carries the tags ``guardian``, ``run:<id>``, ``check:<name>``, ``incident:<n>``.
Retries are the dispatcher's; nothing here runs on the guard loop's thread."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final

from guardian.dashboards import ANNOTATION_TAG, run_tag
from guardian.notify.compose import compose
from guardian.notify.events import EventKind, GuardianEvent, opening_keys
from guardian.states import State
from guardian.store.deliveries import SENT, DeliveryView

if TYPE_CHECKING:
    from grafana_client.api import GrafanaApi

# what each annotated intervention state is called in tags and on the dashboard
ACTION_TAGS: Final[Mapping[State, str]] = {
    State.STOPPED: "stop",
    State.ROLLED_BACK: "rollback",
    State.PATCHED: "patch",
    State.RESUMING: "resume",
    State.RESOLVED: "resolved",
    State.UNRESOLVED: "unresolved",
    State.RELAPSED: "relapsed",
    State.GAVE_UP: "gave_up",
}


def epoch_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class GrafanaAnnotations:
    """The ``grafana`` sink: ``connect`` is called once, on the first delivery (from the dispatcher's
    thread), so a Grafana that is down at start costs retries, not the guard loop."""

    name = "grafana"
    cooldown_s = 0.0  # annotations are a record, never held back

    def __init__(self, connect: Callable[[], GrafanaApi], *, dashboard_uid: str | None = None) -> None:
        self._connect = connect
        self._api: GrafanaApi | None = None
        self.dashboard_uid = dashboard_uid

    def wants(self, event: GuardianEvent) -> bool:
        return event.kind is not EventKind.INTERVENTION or event.state in ACTION_TAGS

    def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
        from guardian.dashboards import grafana  # its HTTP client loads only when Grafana is configured

        api = self._api = self._api or self._connect()
        incident = event.incident
        opened = _opening_annotation(incident.id, earlier)
        if event.kind is EventKind.INCIDENT and opened is not None:
            return opened  # an escalation of an incident already on the dashboard
        if event.kind is EventKind.INCIDENT_CLOSED and opened is not None:
            grafana.close_region(api, int(opened), epoch_ms(event.at))
            return opened
        start = incident.opened_at if event.kind is not EventKind.INTERVENTION else event.at
        end = epoch_ms(event.at) if event.kind is EventKind.INCIDENT_CLOSED else None
        what = ACTION_TAGS[event.state] if event.state is not None else "incident"
        alert = compose(event)
        annotation_id = grafana.add_annotation(
            api,
            time_ms=epoch_ms(start),
            time_end_ms=end,
            tags=[ANNOTATION_TAG, run_tag(event.run_id), f"check:{event.check}", f"incident:{incident.id}", what],
            text=f"{alert.title}\n{alert.text}",
            dashboard_uid=self.dashboard_uid,
        )
        return str(annotation_id)

    def close(self) -> None:
        if self._api is not None:
            from guardian.dashboards import grafana

            grafana.close(self._api)


def _opening_annotation(incident_id: int, earlier: Mapping[str, DeliveryView]) -> str | None:
    """The annotation id posted when the incident opened (None: not posted, or it failed for good)."""
    for key in opening_keys(incident_id, earlier):
        row = earlier[key]
        if row.status == SENT and row.external_id:
            return row.external_id
    return None
