"""Incident annotations and ``guardian dashboards push`` against the loopback Grafana stand-in, and
the notify set-up's refusals (a missing secret fails before anything starts)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ManualClock
from fake_grafana import TOKEN, FakeGrafana

from guardian.cli import main
from guardian.config import ConfigError, GrafanaConfig, GuardianConfig, NotifyConfig, WebhookConfig
from guardian.core import Finding, Severity
from guardian.dashboards import ANNOTATION_TAG, dashboards, grafana
from guardian.notify.annotations import GrafanaAnnotations
from guardian.notify.dispatcher import Dispatcher, DispatchPolicy
from guardian.notify.setup import build_sinks
from guardian.store import Store

RUN = "run-annotated"
T0 = 1_764_460_800.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as s:
        s.ensure_run(
            RUN, name="r", metrics_path="m.jsonl", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=T0
        )
        yield s


def annotator(fake: FakeGrafana) -> GrafanaAnnotations:
    return GrafanaAnnotations(lambda: grafana.connect(fake.url, grafana.Secret(TOKEN), timeout_s=2))


def test_an_incident_is_a_region_and_each_intervention_step_a_point(store: Store, fake_grafana: FakeGrafana) -> None:
    clock = ManualClock(T0 + 1)
    sink = annotator(fake_grafana)
    dispatcher = Dispatcher(store, RUN, [sink], DispatchPolicy(), clock)
    warn = Finding("entropy_collapse", Severity.WARN, 40, "entropy falling", onset_step=35, evidence={"ratio": 0.2})
    number = store.open_incident(RUN, warn, T0).id
    dispatcher.pass_once()
    critical = Finding("entropy_collapse", Severity.CRITICAL, 42, "entropy collapsed", onset_step=35)
    store.escalate_incident(number, critical, T0 + 2)  # an escalation adds no second region
    iv = store.create_intervention(RUN, number, kind="remediate", rung=0, from_attempt_id=None, now=T0 + 3)
    for offset, state in enumerate(("STOPPING", "STOPPED", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION")):
        store.advance(iv.id, state, now=T0 + 4 + offset, detail={"why": "test"})
    store.advance(iv.id, "RESOLVED", now=T0 + 20, detail={"why": "held for 20 steps"})
    store.close_incident(number, status="resolved", now=T0 + 20, note="fixed")
    clock.now = T0 + 21
    dispatcher.pass_once()
    dispatcher.stop()

    regions = [a for a in fake_grafana.annotations.values() if "incident" in a["tags"]]
    points = {
        t: a
        for a in fake_grafana.annotations.values()
        for t in a["tags"]
        if t in ("stop", "rollback", "patch", "resume", "resolved")
    }
    assert len(regions) == 1
    (region,) = regions
    assert (region["time"], region["timeEnd"]) == (int(T0 * 1000), int((T0 + 20) * 1000))
    assert {ANNOTATION_TAG, "run:run-annotated", "check:entropy_collapse", f"incident:{number}"} <= set(region["tags"])
    assert "entropy_collapse" in region["text"]
    assert set(points) == {"stop", "rollback", "patch", "resume", "resolved"}
    assert points["stop"]["time"] == points["stop"]["timeEnd"] == int((T0 + 5) * 1000)
    assert all(ANNOTATION_TAG in a["tags"] for a in fake_grafana.annotations.values())
    patches = fake_grafana.calls("PATCH", "/api/annotations/")
    assert len(patches) == 1 and patches[0].body == {"timeEnd": int((T0 + 20) * 1000)}


def test_grafana_down_is_retried_and_never_raises(store: Store, fake_grafana: FakeGrafana) -> None:
    clock = ManualClock(T0 + 1)
    dispatcher = Dispatcher(store, RUN, [annotator(fake_grafana)], DispatchPolicy(), clock)
    store.open_incident(RUN, Finding("stall", Severity.CRITICAL, 9, "no step for 30 min"), T0)
    fake_grafana.fail_next(1, status=503)
    dispatcher.pass_once()
    (row,) = store.deliveries(RUN, "grafana").values()
    assert row.status == "failing" and "503" in (row.last_error or "")
    clock.now += 1.0
    dispatcher.pass_once()
    (row,) = store.deliveries(RUN, "grafana").values()
    assert row.status == "sent" and row.external_id is not None
    assert len(fake_grafana.annotations) == 1


def test_grafana_refusing_an_annotation_is_not_retried(
    store: Store, fake_grafana: FakeGrafana, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0 + 1)
    dispatcher = Dispatcher(store, RUN, [annotator(fake_grafana)], DispatchPolicy(), clock)
    store.open_incident(RUN, Finding("stall", Severity.CRITICAL, 9, "no step for 30 min"), T0)
    fake_grafana.fail_next(1, status=400)
    with caplog.at_level(logging.ERROR, logger="guardian"):
        for _ in range(3):
            dispatcher.pass_once()
            clock.now += 120
    (row,) = store.deliveries(RUN, "grafana").values()
    assert (row.status, row.attempts) == ("dropped", 1) and "400" in (row.last_error or "")
    assert len(fake_grafana.calls("POST", "/api/annotations")) == 1 and not fake_grafana.annotations
    assert "event=delivery_bug" in caplog.text and "type=GrafanaError" in caplog.text


def test_dashboards_push_is_idempotent_and_keeps_the_token_out_of_output(
    tmp_path: Path, fake_grafana: FakeGrafana, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["dashboards", "push", "--url", fake_grafana.url, "--token-file", str(token_file), "--folder", "RL runs"]
    with caplog.at_level(logging.DEBUG):
        assert main(argv) == 0
        assert main(argv) == 0
    out = capsys.readouterr()
    uids = {d["uid"] for d in dashboards()}
    assert set(fake_grafana.dashboards) == uids and len(fake_grafana.folders) == 1
    assert all(fake_grafana.dashboards[u]["version"] == 2 for u in uids)
    (folder,) = fake_grafana.folders.values()
    assert folder["title"] == "RL runs" and all(
        d["folderUid"] == folder["uid"] for d in fake_grafana.dashboards.values()
    )
    assert all(f"{u} v2" in out.out for u in uids)
    assert TOKEN not in out.out + out.err + caplog.text

    token_file.write_text("glsa_wrong\n")
    assert main(argv) == 1
    err = capsys.readouterr().err  # the CLI logs to stderr
    assert "event=dashboards_push_failed" in err and "token rejected" in err and "glsa_wrong" not in err


def test_missing_secrets_fail_at_start_naming_where_to_put_them(tmp_path: Path, store: Store) -> None:
    hook = WebhookConfig(name="slack", url_env="GUARDIAN_TEST_SLACK_URL")
    config = GuardianConfig(home=tmp_path, notify=NotifyConfig(webhooks=(hook,)))
    with pytest.raises(ConfigError, match="GUARDIAN_TEST_SLACK_URL"):
        build_sinks(config, store, RUN, env={})
    with pytest.raises(ConfigError, match="credentials in the URL") as info:
        build_sinks(config, store, RUN, env={"GUARDIAN_TEST_SLACK_URL": "https://u:pw-s3cret@hooks.example.invalid/T"})
    assert "s3cret" not in str(info.value)
    sinks = build_sinks(config, store, RUN, env={"GUARDIAN_TEST_SLACK_URL": "https://hooks.example.invalid/T/B/x"})
    assert [s.name for s in sinks] == ["log", "slack"]
    with pytest.raises(ConfigError, match="GRAFANA_TOKEN"):
        build_sinks(GuardianConfig(home=tmp_path, grafana=GrafanaConfig(url="http://127.0.0.1:3000")), store, RUN, {})
    with pytest.raises(ValueError, match="exactly one of url_env and url_file"):
        WebhookConfig(name="x")


def test_guardian_run_refuses_to_launch_without_the_webhook_url(tmp_path: Path) -> None:
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {tmp_path / 'home'}\nnotify:\n  webhooks:\n    - url_env: GUARDIAN_TEST_NO_SUCH_ENV\n")
    marker = tmp_path / "trainer-ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["run", "--config", str(config), "--", sys.executable, str(script)]) == 2
    assert not marker.exists()
    # refused before touching the disk: no store, no run folder, no checkpoint-dir lock in the working directory
    assert not (tmp_path / "home").exists() and not Path("checkpoints").exists()


def test_a_command_the_guardian_cannot_patch_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {tmp_path / 'home'}\n")
    assert main(["run", "--config", str(config), "--", "touch", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "event=bad_command" in err and "python -m verl.trainer.main_ppo" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_doctor_checks_webhook_urls_and_the_grafana_token(
    tmp_path: Path, fake_grafana: FakeGrafana, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = tmp_path / "guardian.yaml"
    config.write_text(
        f"home: {tmp_path / 'home'}\n"
        "notify: {webhooks: [{name: oncall, url_env: GUARDIAN_TEST_DOCTOR_HOOK}]}\n"
        f"grafana: {{url: '{fake_grafana.url}', token_file: '{token}'}}\n"
    )
    monkeypatch.setenv("GUARDIAN_TEST_DOCTOR_HOOK", "https://hooks.example.invalid/T/B/secret")
    assert main(["doctor", "--json", "--config", str(config)]) == 0
    report = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert report["grafana"] == {"name": "grafana", "status": "ok", "detail": "Grafana 11.6.0"}
    assert report["webhook oncall"]["status"] == "ok" and "secret" not in report["webhook oncall"]["detail"]
    assert not fake_grafana.calls("POST")  # the doctor reads, never writes

    monkeypatch.delenv("GUARDIAN_TEST_DOCTOR_HOOK")
    token.write_text("glsa_wrong")
    assert main(["doctor", "--json", "--config", str(config)]) == 1
    report = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert report["grafana"]["status"] == "error" and "token" in report["grafana"]["detail"]
    assert "GUARDIAN_TEST_DOCTOR_HOOK" in report["webhook oncall"]["detail"]
