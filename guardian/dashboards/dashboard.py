"""Dashboard-level JSON shared by every guardian dashboard: the envelope, the variables, the annotation queries,
and reading the queries back out of a dashboard.

``ANNOTATION_TAG`` lives here because the dashboards' tag query and the Grafana annotator must agree on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from guardian import keys
from guardian.dashboards.panels import DATASOURCE_VARIABLE, PROMETHEUS, RUN_VARIABLE, Json

# Tag on every annotation the guardian posts (incident regions; stop, rollback, patch, resume points).
# Every guardian dashboard shows the annotations carrying it, on every panel.
ANNOTATION_TAG: Final = "guardian"


def run_tag(run_id: str) -> str:
    """The tag that ties an annotation to its run (the annotator posts it; the dashboard filters on it)."""
    return f"run:{run_id}"


RUN_TAG: Final = run_tag("$run_id")
# Grafana's own annotation store (the built-in "-- Grafana --" data source)
GRAFANA: Final[Json] = {"type": "grafana", "uid": "-- Grafana --"}
# schemaVersion 41 is what Grafana 11.6 writes. Grafana migrates older schema versions upward when it
# loads a dashboard, but loading one newer than the server knows is untested, so we emit the version of
# the oldest Grafana we support (11.6), not 42 (Grafana 12+/13 and the foundation-sdk 0.0.21 default).
SCHEMA_VERSION: Final = 41


def dashboard(uid: str, title: str, description: str, tags: Sequence[str], panels: list[Json]) -> Json:
    """A whole dashboard around ``panels`` (placed by ``panels.layout``): tagged ``ANNOTATION_TAG``,
    with the data-source and run variables (runs from ``guardian_step``) and the annotation queries."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": [ANNOTATION_TAG, *(t for t in tags if t != ANNOTATION_TAG)],
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,  # shared crosshair: line up a verdict with the curves below it
        "links": [],
        "liveNow": False,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "weekStart": "",
        "annotations": annotation_list(),
        "templating": templating(keys.PROM_STEP),
        "panels": panels,
    }


def templating(run_metric: str) -> Json:
    """The dashboard's variables: the Prometheus data source, then the runs (``run_id`` values of
    ``run_metric``; several or All at once)."""
    datasource = {
        "type": "datasource",
        "name": DATASOURCE_VARIABLE,
        "label": "Prometheus",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }
    query = f"label_values({run_metric}, {keys.PROM_LABEL_RUN_ID})"
    runs = {
        "type": "query",
        "name": RUN_VARIABLE,
        "label": "Run",
        "datasource": PROMETHEUS,
        "query": query,
        "definition": query,
        "current": {},
        "hide": 0,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "options": [],
        "refresh": 2,  # on time-range change: runs that start later show up without a reload
        "regex": "",
        "sort": 1,
    }
    return {"list": [datasource, runs]}


def annotation_list() -> Json:
    """Grafana's built-in annotations of this dashboard, plus every annotation tagged ``ANNOTATION_TAG``
    (the guardian posts those org-wide, so they show on every panel of every guardian dashboard)."""
    built_in = {
        "builtIn": 1,
        "datasource": GRAFANA,
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    guardian_events = {
        "datasource": GRAFANA,
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "name": "Guardian events",
        # the selected runs only: Grafana expands a multi-value $run_id into one tag per run, matched by any
        "target": {"type": "tags", "tags": [RUN_TAG], "matchAny": True, "limit": 100},
    }
    return {"list": [built_in, guardian_events]}


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel, rows' nested panels included,
    in dashboard order. For tests that run the queries against a real Prometheus."""
    found: list[tuple[str, str]] = []

    def visit(panels: Sequence[Mapping[str, Any]]) -> None:
        for panel in panels:
            found.extend((str(panel["title"]), str(t["expr"])) for t in panel.get("targets", ()) if "expr" in t)
            visit(panel.get("panels", ()))

    visit(dashboard.get("panels", ()))
    return found


METRIC_NAME: Final = re.compile(r"\bguardian_[a-z_]+\b")


def metric_names(expr: str) -> set[str]:
    """The guardian metric names an expression reads."""
    return set(METRIC_NAME.findall(expr))
