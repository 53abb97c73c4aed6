"""Grafana dashboards: the committed JSON is what the code builds, Grafana's own schema models read
every field of it, the layout and wiring follow the conventions (units, descriptions, data source and
run variables), every query is valid PromQL, and the panels read exactly the exported metrics."""

from __future__ import annotations

import json
import re
import subprocess
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from conftest import required_tool

from guardian import keys
from guardian.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from guardian.core import Severity
from guardian.dashboards import (
    ANNOTATION_TAG,
    SCHEMA_VERSION,
    check,
    dashboards,
    export_all,
    metric_names,
    panel_queries,
    render,
)
from guardian.dashboards import export as export_module  # the module (the function is export_all)
from guardian.dashboards.dashboard import RUN_TAG

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dashboards"
PROMETHEUS = {"type": "prometheus", "uid": "${datasource}"}
RUN_MATCHER = 'run_id=~"$run_id"'
# Grafana's macros, replaced by plausible values so that promtool can parse the queries
MACROS = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}

# Exported metrics that no panel shows, and why.
NOT_ON_PANELS = {
    keys.PROM_UP: "the guardian's own liveness: the GuardianDown alert watches it",
    keys.PROM_LAST_POLL_SUCCESS: "the guardian's own liveness (GuardianDown alert), not the run's health",
    keys.PROM_LAST_POLL_TIMESTAMP: "the guardian's own liveness (GuardianDown alert), not the run's health",
    keys.PROM_RUN_INFO: "metadata (attempt, mode, version) to join on, not a series to plot",
}

BUILT = dashboards()


@pytest.fixture(params=BUILT, ids=[str(d["uid"]) for d in BUILT])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    built: dict[str, Any] = request.param
    return built


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level panels and those nested in collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


# ------------------------------------------------------------------------------------ committed files


def test_committed_json_is_what_the_code_builds() -> None:
    stale = check(COMMITTED)
    assert not stale, f"stale dashboards {[str(p) for p in stale]}: run `guardian dashboards export` and commit"
    committed = {p.name for p in COMMITTED.glob("*.json")}
    assert committed == {f"{d['uid']}.json" for d in BUILT}, "a dashboards/*.json no code builds (renamed uid?)"


def test_cli_export_and_check_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["dashboards", "export", "-o", str(out), "--check"]) == EXIT_ERROR
    names = sorted(f"{d['uid']}.json" for d in BUILT)
    assert capsys.readouterr().out.split() == [str(out / name) for name in names]
    assert not out.exists(), "--check wrote something"

    assert main(["dashboards", "export", "-o", str(out)]) == EXIT_OK
    for d in BUILT:
        path = out / f"{d['uid']}.json"
        assert path.read_bytes() == (COMMITTED / path.name).read_bytes() == render(d)
        assert path.read_text().endswith("}\n") and json.loads(path.read_text()) == d
    assert main(["dashboards", "export", "-o", str(out), "--check"]) == EXIT_OK
    assert capsys.readouterr().out == ""

    edited = out / "guardian-training.json"
    edited.write_text(edited.read_text().replace('"schemaVersion": 41', '"schemaVersion": 40'))
    assert main(["dashboards", "export", "-o", str(out), "--check"]) == EXIT_ERROR
    assert capsys.readouterr().out.split() == [str(edited)]
    assert export_all(out) == [edited]  # rewrites only what changed
    assert export_all(out) == [] and check(out) == []
    assert sorted(p.name for p in out.iterdir()) == names, "temporary file left behind"


def test_dashboards_reject_bad_or_repeated_uids(monkeypatch: pytest.MonkeyPatch) -> None:
    for uids in (["x" * 41], ["Has Spaces"], ["guardian-a", "guardian-a"]):
        built = [{"uid": uid} for uid in uids]
        monkeypatch.setattr(export_module, "BUILDERS", tuple(lambda d=d: d for d in built))
        with pytest.raises(ValueError, match="uid"):
            dashboards()


def test_provisioning_files_point_at_the_dashboards() -> None:
    source = yaml.safe_load((COMMITTED / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [prometheus] = source["datasources"]
    assert prometheus["type"] == "prometheus" and prometheus["uid"] and prometheus["url"] == "http://localhost:9090"
    provider = yaml.safe_load((COMMITTED / "provisioning" / "dashboards" / "guardian.yml").read_text())
    [files] = provider["providers"]
    assert files["type"] == "file" and files["options"]["path"].startswith("/")


# ----------------------------------------------------------------------- Grafana's schema (foundation-sdk)


def sdk() -> tuple[ModuleType, ModuleType, ModuleType]:
    """grafana-foundation-sdk 0.0.21 (its dashboard model warns "prefer v2" at import: not our concern)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from grafana_foundation_sdk.cog import encoder
        from grafana_foundation_sdk.cog.plugins import register_default_plugins
        from grafana_foundation_sdk.models import dashboard, prometheus

    register_default_plugins()  # panel options and Prometheus targets parse into typed models
    return dashboard, prometheus, encoder


def differences(sent: Any, back: Any, path: str = "") -> list[str]:
    """Where ``back`` lost or changed something of ``sent`` (fields it adds, defaults, are fine)."""
    if isinstance(sent, dict) and isinstance(back, dict):
        lost = [f"{path}/{k}: dropped" for k in sent if k not in back]
        return lost + [d for k in sent if k in back for d in differences(sent[k], back[k], f"{path}/{k}")]
    if isinstance(sent, list) and isinstance(back, list) and len(sent) == len(back):
        return [d for i, (a, b) in enumerate(zip(sent, back, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if sent == back else [f"{path}: {sent!r} became {back!r}"]


def test_grafana_schema_models_read_every_field(dashboard: dict[str, Any]) -> None:
    models, prometheus, encoder = sdk()
    data = json.loads(render(dashboard))
    parsed = models.Dashboard.from_json(data)
    assert (parsed.uid, parsed.title, parsed.schema_version) == (data["uid"], data["title"], SCHEMA_VERSION)
    assert ANNOTATION_TAG in parsed.tags
    assert len(parsed.panels) == len(data["panels"])
    for panel, sent in zip(parsed.panels, data["panels"], strict=True):
        if sent["type"] == "row":
            assert isinstance(panel, models.RowPanel) and panel.title == sent["title"]
            continue
        assert isinstance(panel, models.Panel)
        assert (panel.type_val, panel.title, panel.id_val) == (sent["type"], sent["title"], sent["id"])
        assert panel.field_config.defaults.unit == sent["fieldConfig"]["defaults"]["unit"]
        assert panel.datasource.uid == "${datasource}"
        assert panel.grid_pos is not None and panel.grid_pos.w == sent["gridPos"]["w"]
        assert [type(t) for t in panel.targets] == [prometheus.Dataquery] * len(sent["targets"])
        assert [(t.expr, t.legend_format, t.ref_id) for t in panel.targets] == [
            (t["expr"], t["legendFormat"], t["refId"]) for t in sent["targets"]
        ]
    tag_query = parsed.annotations.list_val[1].target.to_json()
    assert tag_query == {"type": "tags", "tags": [RUN_TAG], "matchAny": True, "limit": 100}
    assert [(v.name, v.type_val) for v in parsed.templating.list_val] == [
        ("datasource", "datasource"),
        ("run_id", "query"),
    ]
    # a misspelt key would be unknown to the schema and dropped on the way back
    back = json.loads(json.dumps(parsed, cls=encoder.JSONEncoder))
    assert differences(data, back) == []


# -------------------------------------------------------------------------------------------- structure


def test_uids_are_short_and_unique() -> None:
    uids = [str(d["uid"]) for d in BUILT]
    assert len(set(uids)) == len(uids) and all(0 < len(uid) <= 40 for uid in uids)


def test_layout_ids_and_grid(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] == SCHEMA_VERSION == 41
    assert ANNOTATION_TAG in dashboard["tags"]
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids), "panel ids repeat"
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert set(pos) == {"h", "w", "x", "y"} and pos["w"] > 0 and pos["h"] > 0, panel["title"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for cell in (
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        ):
            assert cell not in taken, f"{panel['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = panel["title"]


def test_every_panel_has_unit_description_datasource_and_run_filter(dashboard: dict[str, Any]) -> None:
    for panel in data_panels(dashboard):
        title = panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], title
        assert len(panel["description"]) > 20, title
        assert panel["datasource"] == PROMETHEUS, title
        assert panel["targets"], title
        for t in panel["targets"]:
            assert t["datasource"] == PROMETHEUS, title
            assert "{{run_id}}" in t["legendFormat"], title
            # every metric selector, not just one of them, keeps to the picked runs
            selectors = re.findall(r"\bguardian_[a-z_]+(\{[^}]*\})?", t["expr"])
            assert selectors and all(s.startswith("{" + RUN_MATCHER) for s in selectors), (title, t["expr"])


def test_variables_and_annotations(dashboard: dict[str, Any]) -> None:
    datasource, runs = dashboard["templating"]["list"]
    assert (datasource["name"], datasource["type"], datasource["query"]) == ("datasource", "datasource", "prometheus")
    assert (runs["name"], runs["type"], runs["datasource"]) == ("run_id", "query", PROMETHEUS)
    assert runs["query"] == f"label_values({keys.PROM_STEP}, run_id)" and runs["multi"] and runs["includeAll"]
    built_in, tags = dashboard["annotations"]["list"]
    assert built_in["builtIn"] == 1 and built_in["name"] == "Annotations & Alerts"
    assert tags["datasource"] == {"type": "grafana", "uid": "-- Grafana --"} and tags["enable"]
    assert tags["target"] == {"type": "tags", "tags": [RUN_TAG], "matchAny": True, "limit": 100}


def test_status_timelines_speak_in_severities() -> None:
    timelines = {p["title"]: p for d in BUILT for p in data_panels(d) if p["type"] == "state-timeline"}
    assert set(timelines) == {"Health checks", "Open incidents"}

    def words(title: str) -> dict[str, str]:
        [mapping] = timelines[title]["fieldConfig"]["defaults"]["mappings"]
        return {k: v["text"] for k, v in mapping["options"].items()}

    assert words("Health checks") == {str(s.value): s.label for s in Severity}
    assert words("Open incidents") == {"0": "none", "1": "warn", "2": "critical"}


def test_panel_queries_walks_collapsed_rows() -> None:
    nested = {"panels": [{"type": "row", "title": "r", "panels": [{"title": "p", "targets": [{"expr": "up"}]}]}]}
    assert panel_queries(nested) == [("p", "up")]
    built = BUILT[0]
    assert len(panel_queries(built)) == sum(len(p["targets"]) for p in data_panels(built))


# ----------------------------------------------------------------------------------------------- PromQL


def promtool() -> str:
    return required_tool("promtool", "prometheus")


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    rules = []
    for d in BUILT:
        for index, (title, expr) in enumerate(panel_queries(d)):
            for macro, value in MACROS.items():
                expr = expr.replace(macro, value)
            assert "$__" not in expr, f"{title}: a Grafana macro promtool cannot parse: {expr}"
            record = f"dashboard:{str(d['uid']).replace('-', '_')}:{index}"
            rules.append({"record": record, "expr": expr, "labels": {"panel": title}})
    path = tmp_path / "panels.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-panels", "rules": rules}]}, sort_keys=False))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout


def test_panels_read_exported_metrics_and_show_every_one() -> None:
    used = {name for d in BUILT for _, expr in panel_queries(d) for name in metric_names(expr)}
    assert used <= keys.PROM_METRIC_NAMES, f"not exported: {sorted(used - keys.PROM_METRIC_NAMES)}"
    assert set(NOT_ON_PANELS) <= keys.PROM_METRIC_NAMES
    missing = keys.PROM_METRIC_NAMES - used - set(NOT_ON_PANELS)
    assert not missing, f"exported but on no panel (add a panel or list it in NOT_ON_PANELS): {sorted(missing)}"
    assert not used & set(NOT_ON_PANELS), "listed as not on a panel, but it is"


def test_export_to_a_file_is_a_usage_error_and_leaves_it_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "not-a-folder.json"
    target.write_text("{}")
    assert main(["dashboards", "export", "-o", str(target)]) == EXIT_USAGE
    assert f"-o {target} is not a directory" in capsys.readouterr().err
    assert target.read_text() == "{}"
