"""The alerting rules: promtool checks and unit-tests them, and they use only exported metrics."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from conftest import required_tool

from guardian.keys import PROM_METRIC_NAMES

ALERTS = Path(__file__).resolve().parents[2] / "alerts"
RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"


def promtool() -> str:
    return required_tool("promtool", "prometheus")


def rules() -> list[dict[str, object]]:
    document = yaml.safe_load((ALERTS / "guardian.rules.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", "guardian.rules.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_has_a_passing_unit_test() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", "guardian.rules.test.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (ALERTS / "guardian.rules.test.yml").read_text()))
    assert tested == {str(rule["alert"]) for rule in rules()}


def test_rules_use_only_exported_metrics_and_link_existing_runbooks() -> None:
    anchors = {
        "#" + re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        names = set(re.findall(r"\b(guardian_[a-z_]+)", str(rule["expr"])))
        assert names and names <= PROM_METRIC_NAMES, (rule["alert"], names - PROM_METRIC_NAMES)
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert {"summary", "description", "runbook_url"} <= set(annotations)
        assert str(annotations["runbook_url"]).split("runbooks.md")[1] in anchors
        assert isinstance(rule["labels"], dict) and rule["labels"]["severity"] in ("critical", "warning", "info")
