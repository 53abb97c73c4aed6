"""What must reach a person when the store itself is the trouble goes straight to the notifiers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from webhook_receiver import Receiver

from guardian.commands.compose import supervisor
from guardian.config import GuardianConfig
from guardian.loop.outage import CannotContinue
from guardian.notify.compose import Alert, cannot_continue_alert
from guardian.notify.dispatcher import Dispatcher, DispatchPolicy
from guardian.notify.events import Level
from guardian.notify.notifiers import WebhookNotifier
from guardian.notify.setup import NotifierSink
from guardian.store import Store

ALERT = Alert(
    key="run:r1:cannot_continue",
    run_id="r1",
    check="guardian",
    level=Level.CRITICAL,
    title="[critical] guardian cannot continue on r1",
    text="*Cause:* the store refused writes for 600 s",
    fields={"run": "r1"},
)


def test_an_announcement_reaches_every_notifier_routed_for_it_without_the_store(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    sinks = [
        NotifierSink(WebhookNotifier(receiver.url("/ok/pager"), name="pager"), Level.CRITICAL, 0.0),
        NotifierSink(WebhookNotifier(receiver.url("/fail/chat"), name="chat"), Level.INFO, 0.0),
        NotifierSink(WebhookNotifier(receiver.url("/ok/quiet"), name="quiet"), Level.CRITICAL, 0.0),
    ]
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        dispatcher = Dispatcher(store, "r1", sinks, DispatchPolicy(), clock=lambda: 0.0)
        dispatcher.announce(ALERT)  # the failing chat webhook does not stop the others, nor raise
    paths = [r["path"] for r in receiver.requests]
    assert paths == ["/ok/pager", "/fail/chat", "/ok/quiet"]
    body = json.loads(bytes(receiver.requests[0]["body"]))  # type: ignore[arg-type]
    assert body["guardian"]["title"] == ALERT.title and body["guardian"]["level"] == "critical"
    assert "event=announce_failed" in caplog.text and "sink=chat" in caplog.text


def test_a_warning_is_not_announced_to_a_notifier_routed_for_criticals(receiver: Receiver) -> None:
    sink = NotifierSink(WebhookNotifier(receiver.url("/ok/pager"), name="pager"), Level.CRITICAL, 0.0)
    sink.announce(Alert(ALERT.key, "r1", "guardian", Level.WARNING, "a warning", "text", {}))
    assert receiver.requests == []


def test_the_supervisor_announces_that_it_cannot_continue(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    config = GuardianConfig(home=tmp_path / "home")
    sent: list[CannotContinue] = []
    with Store.open(config.database_url()) as store:
        guarding = supervisor(config, store, run_id="r1", command=command, cwd=tmp_path, announce=sent.append)
        code = guarding.cannot_continue(cause="the store refused writes for 600 s", fix="free space on /data")
    (ending,) = sent
    alert = cannot_continue_alert(ending)
    assert code == 1 and alert.level is Level.CRITICAL and alert.run_id == "r1"
    assert "the store refused writes for 600 s" in alert.text and "free space on /data" in alert.text
    assert "not running" in alert.text
