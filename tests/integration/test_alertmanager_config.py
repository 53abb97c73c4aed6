"""alerts/alertmanager.example.yml: amtool accepts it, routes every alert of guardian.rules.yml by severity, and
its Slack templates render the rules' annotations."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import required_tool

ALERTS = Path(__file__).resolve().parents[2] / "alerts"
CONFIG = ALERTS / "alertmanager.example.yml"

SLACK = "slack-critical"
WEBHOOK = "guardian-webhook"
# the receiver each severity in guardian.rules.yml must reach; a new severity there must be added here
RECEIVER_OF_SEVERITY = {"critical": SLACK, "warning": WEBHOOK, "info": WEBHOOK}


def amtool() -> str:
    return required_tool("amtool", "prometheus-alertmanager")


def run_amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([amtool(), *args], capture_output=True, text=True, timeout=60)


def routed_to(*labels: str) -> str:
    """The receiver(s) amtool's routing test picks for an alert with ``labels`` (``name=value``)."""
    done = run_amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((ALERTS / "guardian.rules.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def config() -> dict[str, Any]:
    loaded = yaml.safe_load(CONFIG.read_text())
    assert isinstance(loaded, dict)
    return loaded


def receiver(name: str) -> dict[str, Any]:
    (found,) = [r for r in config()["receivers"] if r["name"] == name]
    return dict(found)


def test_amtool_accepts_the_config() -> None:
    done = run_amtool("check-config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_critical_pages_slack_and_warning_goes_to_the_webhook() -> None:
    assert routed_to("severity=critical", "alertname=GuardianEntropyCollapse", "run_id=r1") == SLACK
    assert routed_to("severity=warning", "alertname=GuardianEffectiveGroupRatioLow", "run_id=r1") == WEBHOOK


def test_every_rule_is_routed_by_its_severity() -> None:
    severities = {str(rule["labels"]["severity"]) for rule in rules()}
    assert severities <= set(RECEIVER_OF_SEVERITY), severities - set(RECEIVER_OF_SEVERITY)
    for rule in rules():
        labels = rule["labels"]
        got = routed_to(f"alertname={rule['alert']}", "run_id=demo-1", *(f"{k}={v}" for k, v in labels.items()))
        assert got == RECEIVER_OF_SEVERITY[str(labels["severity"])], rule["alert"]


def test_receivers_keep_secrets_out_and_send_resolved() -> None:
    (slack,) = receiver(SLACK)["slack_configs"]
    assert "api_url" not in slack and str(slack["api_url_file"]).startswith("/")
    assert slack["send_resolved"] is True and str(slack["channel"]).startswith("#")
    (hook,) = receiver(WEBHOOK)["webhook_configs"]
    assert hook == {"url": "http://127.0.0.1:9500/alert", "send_resolved": True}
    route = config()["route"]
    assert route["group_by"] == ["alertname", "run_id"] and route["receiver"] == WEBHOOK


def test_inhibit_rules_name_existing_alerts_of_the_same_run() -> None:
    names = {str(rule["alert"]) for rule in rules()}
    inhibits = config()["inhibit_rules"]
    assert inhibits
    for inhibit in inhibits:
        assert inhibit["equal"] == ["run_id"]
        for matcher in (*inhibit["source_matchers"], *inhibit["target_matchers"]):
            label, _, value = str(matcher).partition("=")
            assert label == "alertname" and value.strip('"') in names, matcher


@pytest.mark.parametrize("status", ["firing", "resolved"])
def test_slack_templates_render_each_critical_alerts_annotations(tmp_path: Path, status: str) -> None:
    """check-config does not parse receiver templates (Alertmanager does that when it notifies), so render them
    with amtool on the payload Alertmanager would build for each critical rule (annotations unexpanded)."""
    (slack,) = receiver(SLACK)["slack_configs"]
    (tmp_path / "none.tmpl").write_text("")
    for rule in rules():
        labels = {**rule["labels"], "alertname": rule["alert"], "run_id": "demo-1"}
        if labels["severity"] != "critical":
            continue
        annotations = rule["annotations"]
        alert = {
            "status": status,
            "labels": labels,
            "annotations": annotations,
            "startsAt": "2026-11-30T00:00:00Z",
            "endsAt": "2026-11-30T00:05:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://127.0.0.1:9090/graph",
            "fingerprint": "0123456789abcdef",
        }
        data = {
            "receiver": SLACK,
            "status": status,
            "alerts": [alert],
            "groupLabels": {"alertname": rule["alert"], "run_id": "demo-1"},
            "commonLabels": labels,
            "commonAnnotations": annotations,
            "externalURL": "http://127.0.0.1:9093",
        }
        (tmp_path / "data.json").write_text(json.dumps(data))
        rendered = {}
        for field in ("title", "text"):
            done = run_amtool(
                "template",
                "render",
                f"--template.glob={tmp_path / 'none.tmpl'}",
                f"--template.data={tmp_path / 'data.json'}",
                f"--template.text={slack[field]}",
            )
            assert done.returncode == 0, (rule["alert"], field, done.stdout + done.stderr)
            rendered[field] = done.stdout
        marker = "[FIRING:1]" if status == "firing" else "[RESOLVED]"
        assert rendered["title"].startswith(marker) and str(annotations["summary"]) in rendered["title"]
        for key in ("description", "runbook_url"):
            assert str(annotations[key]) in rendered["text"], (rule["alert"], key)
        assert f"*{rule['alert']}*" in rendered["text"]
