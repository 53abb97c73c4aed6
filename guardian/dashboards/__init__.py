"""Grafana dashboards as code: Python functions that return classic (v1) dashboard JSON.

``guardian dashboards export`` writes them to ``dashboards/<uid>.json`` (committed; Grafana provisions
or imports those files), and CI fails when the committed files are stale. Plain dicts rather than a
dashboard SDK: they are exactly what Grafana stores, need no dependency at run time, and do not churn
with SDK releases; the tests parse them with the pinned grafana-foundation-sdk models instead
(docs/observability-notes.md §2).

``ANNOTATION_TAG`` is the tag of every annotation the guardian posts; ``run_tag(run_id)`` ties one to its
run, and the dashboards show the annotations of the runs selected in ``$run_id``.
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
