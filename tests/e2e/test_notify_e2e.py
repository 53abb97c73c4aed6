"""``guardian demo`` with a webhook and Grafana configured: the collapse reaches the webhook receiver
and the Grafana stand-in as it happens (a real guardian process; loopback receivers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_grafana import TOKEN, FakeGrafana
from webhook_receiver import Receiver, bodies

from guardian.cli import main
from guardian.dashboards import ANNOTATION_TAG
from guardian.store import Store

pytestmark = pytest.mark.slow


def test_demo_alerts_the_webhook_and_annotates_grafana(
    tmp_path: Path, receiver: Receiver, fake_grafana: FakeGrafana, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "grafana-token"
    token.write_text(TOKEN)
    config = tmp_path / "guardian.yaml"
    config.write_text(
        f"home: {tmp_path / 'home'}\n"
        "notify:\n"
        "  webhooks:\n"
        "    - {name: oncall, url_env: GUARDIAN_E2E_HOOK, min_level: warning}\n"
        f"grafana: {{url: '{fake_grafana.url}', token_file: '{token}'}}\n"
    )
    env = {**os.environ, "GUARDIAN_E2E_HOOK": receiver.url("/ok/hooks/T000/B000/secret")}
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "demo", "--config", str(config), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = json.loads(done.stdout)["run"]
    assert "secret" not in done.stderr and TOKEN not in done.stderr

    alerts = [b["guardian"] for b in bodies(receiver)]  # type: ignore[index]
    critical = [a for a in alerts if a["level"] == "critical"]  # type: ignore[index]
    assert critical, alerts
    assert all(a["run_id"] == run_id for a in alerts)  # type: ignore[index]
    assert any("will stop the trainer, roll back" in str(a["text"]) for a in critical)  # type: ignore[index]
    assert not any("GAVE UP" in str(a["title"]) for a in alerts)  # type: ignore[index]

    annotations = list(fake_grafana.annotations.values())
    assert annotations and all(ANNOTATION_TAG in a["tags"] and f"run:{run_id}" in a["tags"] for a in annotations)
    regions = [a for a in annotations if "incident" in a["tags"]]
    assert regions and all(a["timeEnd"] > a["time"] for a in regions)  # every incident closed: a region
    steps = {t for a in annotations for t in a["tags"]}
    assert {"stop", "rollback", "patch", "resume", "resolved"} <= steps

    with Store.open(f"sqlite:///{tmp_path / 'home' / 'guardian.db'}") as store:
        counts = store.delivery_counts(run_id)
    assert counts.get(("oncall", "sent"), 0) == len(bodies(receiver))
    assert counts.get(("grafana", "sent"), 0) >= len(annotations)
    assert not any(result in ("failing", "dropped") for _, result in counts)

    # the incident's record says who was told what
    incident = next(i for i in json.loads(done.stdout)["incidents"] if i["check"] == "entropy_collapse")
    assert main(["incidents", "show", str(incident["id"]), "--json", "--config", str(config)]) == 0
    shown = json.loads(capsys.readouterr().out)
    told = {(n["sink"], n["status"]) for n in shown["notifications"]}
    assert {("oncall", "sent"), ("grafana", "sent"), ("log", "sent")} <= told
    assert [iv["state"] for iv in shown["interventions"]][-1] == "RESOLVED" and shown["interventions"][-1]["events"]
