"""Grafana dashboards as code: Python functions that return classic (v1) dashboard JSON as plain dicts.

``guardian dashboards export`` writes them to ``dashboards/<uid>.json`` (committed; CI fails when stale).
``ANNOTATION_TAG`` tags every annotation the guardian posts; ``run_tag(run_id)`` ties one to its run.
Why plain dicts: docs/decisions/0013-dashboards-as-plain-dicts.md.
"""

from guardian.dashboards.dashboard import ANNOTATION_TAG, SCHEMA_VERSION, metric_names, panel_queries, run_tag
from guardian.dashboards.export import DEFAULT_DIR, check, dashboards, export_all, render
from guardian.dashboards.training import training_dashboard

__all__ = [
    "ANNOTATION_TAG",
    "DEFAULT_DIR",
    "SCHEMA_VERSION",
    "check",
    "dashboards",
    "export_all",
    "metric_names",
    "panel_queries",
    "render",
    "run_tag",
    "training_dashboard",
]
