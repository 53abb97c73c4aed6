"""The dispatcher over a real SQLite store: each event once per sink (across restarts), routing,
horizon, per-check cooldown, retries with backoff, dropped deliveries, and a loop that never raises.
An outage (a receiver down, a 503) is retried; a bug (composing the alert raised, a 400) is not."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ManualClock, free_port
from sqlalchemy.exc import OperationalError
from webhook_receiver import Receiver, bodies, receiving

from guardian.config import NotifyConfig, WebhookConfig
from guardian.core import Finding, Severity
from guardian.notify import compose as compose_module
from guardian.notify.dispatcher import Decision, Dispatcher, DispatchPolicy, backoff_s, decide
from guardian.notify.events import EventKind, GuardianEvent, Level, load_events
from guardian.notify.notifiers import NotifyError, WebhookNotifier
from guardian.notify.setup import NotifierSink
from guardian.store import Store
from guardian.store.deliveries import DeliveryView

RUN = "run-notify"
T0 = 1_764_460_800.0  # 2025-11-30 00:00 UTC


@dataclass
class RecordingSink:
    """A sink that records what it is given, and fails while ``failures`` is positive."""

    name: str = "rec"
    cooldown_s: float = 0.0
    min_level: Level = Level.INFO
    failures: int = 0
    got: list[str] = field(default_factory=list)
    closed: bool = False

    def wants(self, event: GuardianEvent) -> bool:
        return event.level >= self.min_level

    def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("receiver at http://127.0.0.1:9/… refused the connection")
        self.got.append(event.key)
        return f"id-{len(self.got)}"

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as s:
        s.ensure_run(
            RUN, name="r", metrics_path="m.jsonl", rollouts_dir="", checkpoints_dir=None, mode="enforce", now=T0
        )
        yield s


def incident(store: Store, check: str, severity: Severity, now: float) -> int:
    finding = Finding(check, severity, 40, f"{check} fired", onset_step=35, evidence={"entropy": 0.01})
    return store.open_incident(RUN, finding, now).id


def dispatcher(store: Store, clock: ManualClock, *sinks: RecordingSink | NotifierSink, **policy: float) -> Dispatcher:
    return Dispatcher(store, RUN, sinks, DispatchPolicy(**policy), clock)  # type: ignore[arg-type]


def webhook(url: str) -> NotifierSink:
    """The real thing: a webhook notifier behind the dispatcher, as guardian.yaml builds it."""
    return NotifierSink(WebhookNotifier(url, name="hook", timeout_s=2), Level.INFO, 0.0)


def lines(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(f"event={name} ")]


def field(record: logging.LogRecord, name: str) -> str:
    """The value of ``name`` in an event line (the last one: ``event=`` names the line, then the event key)."""
    found = re.findall(rf"\b{name}=(\S+)", record.getMessage())
    assert found, record.getMessage()
    return str(found[-1])


def source_line(place: str) -> str:
    """The line of guardian code that ``place`` (``guardian/x.py:N``) names."""
    path, number = place.rsplit(":", 1)
    return (Path(compose_module.__file__).parents[2] / path).read_text().splitlines()[int(number) - 1]


def test_every_event_goes_once_per_sink_even_after_a_restart(store: Store) -> None:
    clock = ManualClock(T0 + 10)
    first = incident(store, "entropy_collapse", Severity.CRITICAL, T0)
    iv = store.create_intervention(RUN, first, kind="remediate", rung=0, from_attempt_id=None, now=T0 + 1)
    store.advance(iv.id, "STOPPING", now=T0 + 2)
    store.advance(iv.id, "STOPPED", now=T0 + 3, detail={"target": "/ckpt/global_step_30", "why": "healthy"})
    sink = RecordingSink()
    assert dispatcher(store, clock, sink).pass_once() == 2
    assert sink.got == [f"incident:{first}:critical", sink.got[1]] and sink.got[1].startswith("intervention:")
    assert dispatcher(store, clock, sink).pass_once() == 0  # a new dispatcher (a restarted guardian) sends nothing
    store.close_incident(first, status="resolved", now=T0 + 20, note="fixed")
    clock.now = T0 + 21
    dispatcher(store, clock, sink).pass_once()
    assert sink.got[-1] == f"incident:{first}:closed" and len(sink.got) == 3
    assert store.delivery_counts(RUN) == {("rec", "sent"): 3}


def test_warning_then_escalation_are_two_alerts_and_routing_follows_level(store: Store) -> None:
    clock = ManualClock(T0 + 5)
    number = incident(store, "kl_drift", Severity.WARN, T0)
    loud, quiet = RecordingSink("all"), RecordingSink("critical-only", min_level=Level.CRITICAL)
    d = dispatcher(store, clock, loud, quiet)
    d.pass_once()
    store.escalate_incident(number, Finding("kl_drift", Severity.CRITICAL, 45, "worse", onset_step=35), T0 + 6)
    clock.now = T0 + 7
    d.pass_once()
    assert loud.got == [f"incident:{number}:warn", f"incident:{number}:critical"]
    assert quiet.got == [f"incident:{number}:critical"]


def test_old_events_are_not_replayed_to_a_new_sink(store: Store) -> None:
    incident(store, "stall", Severity.CRITICAL, T0)
    sink = RecordingSink()
    dispatcher(store, ManualClock(T0 + 7200), sink, max_age_s=3600).pass_once()
    assert sink.got == []
    assert store.delivery_counts(RUN) == {("rec", "suppressed"): 1}


def test_cooldown_holds_back_a_repeat_incident_of_the_same_check_only(store: Store) -> None:
    clock = ManualClock(T0)
    sink = RecordingSink(cooldown_s=600)
    d = dispatcher(store, clock, sink)
    first = incident(store, "entropy_collapse", Severity.CRITICAL, T0)
    d.pass_once()
    store.close_incident(first, status="resolved", now=T0 + 60, note="")
    again = incident(store, "entropy_collapse", Severity.CRITICAL, T0 + 120)
    other = incident(store, "kl_drift", Severity.CRITICAL, T0 + 121)
    clock.now = T0 + 130
    d.pass_once()
    assert sink.got == [f"incident:{first}:critical", f"incident:{first}:closed", f"incident:{other}:critical"]
    held = store.deliveries(RUN, "rec")[f"incident:{again}:critical"]
    assert (held.status, held.last_error) == ("suppressed", "cooldown")
    later = incident(store, "entropy_collapse", Severity.CRITICAL, T0 + 900)
    clock.now = T0 + 901
    d.pass_once()
    assert sink.got[-1] == f"incident:{later}:critical"  # the cooldown is over


def test_failures_are_retried_with_backoff_then_dropped_and_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0 + 1)
    number = incident(store, "non_finite", Severity.CRITICAL, T0)
    key = f"incident:{number}:critical"
    flaky = RecordingSink("flaky", failures=2)
    d = dispatcher(store, clock, flaky, retries=5)
    d.pass_once()
    assert store.deliveries(RUN, "flaky")[key].status == "failing"
    d.pass_once()  # the retry is not due yet (1 s backoff): no attempt
    assert store.deliveries(RUN, "flaky")[key].attempts == 1
    clock.now += backoff_s(1)
    d.pass_once()
    clock.now += backoff_s(2)
    d.pass_once()
    assert flaky.got == [key] and store.deliveries(RUN, "flaky")[key].attempts == 3

    dead = RecordingSink("dead", failures=100)
    d = dispatcher(store, clock, dead, retries=2)
    with caplog.at_level(logging.WARNING, logger="guardian"):
        for _ in range(4):
            d.pass_once()
            clock.now += 60
    row = store.deliveries(RUN, "dead")[key]
    assert (row.status, row.attempts) == ("dropped", 3)
    assert "ConnectionError" in (row.last_error or "")
    assert any("event=alert_dropped" in r.getMessage() and "sink=dead" in r.getMessage() for r in caplog.records)
    assert store.delivery_counts(RUN)[("dead", "dropped")] == 1


def test_a_broken_store_or_sink_never_raises_out_of_a_pass(store: Store) -> None:
    class Exploding(RecordingSink):
        def wants(self, event: GuardianEvent) -> bool:
            raise RuntimeError("bug in a sink")

    incident(store, "stall", Severity.CRITICAL, T0)
    good = RecordingSink("good")
    d = dispatcher(store, ManualClock(T0 + 1), Exploding("bad"), good)
    d.pass_once()
    assert len(good.got) == 1
    store.close()
    assert d.pass_once() == 0  # the store is gone: logged, not raised


def test_the_thread_flushes_the_last_events_and_a_hung_sink_does_not_block_stop(store: Store) -> None:
    release = threading.Event()

    class Hung(RecordingSink):
        def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
            release.wait(10)
            return None

    sink = RecordingSink()
    d = dispatcher(store, ManualClock(T0 + 1), sink, interval_s=30)
    d.start()
    incident(store, "stall", Severity.CRITICAL, T0)  # committed after the first sweep
    d.stop(timeout_s=5)
    assert len(sink.got) == 1 and sink.closed

    incident(store, "kl_drift", Severity.CRITICAL, T0)
    hung = dispatcher(store, ManualClock(T0 + 1), Hung("hung"), interval_s=30)
    hung.start()
    hung.stop(timeout_s=0.5)  # returns although the sink hangs
    release.set()


def test_decide_is_pure_and_events_come_from_the_store(store: Store) -> None:
    number = incident(store, "egr_collapse", Severity.CRITICAL, T0)
    (ev,) = load_events(store, RUN)
    assert (ev.kind, ev.level, ev.check, ev.mode) == (EventKind.INCIDENT, Level.CRITICAL, "egr_collapse", "enforce")
    assert ev.key == f"incident:{number}:critical"
    assert decide(ev, RecordingSink(min_level=Level.CRITICAL), {}, T0 + 1, DispatchPolicy()) is Decision.SEND
    assert decide(ev, RecordingSink(), {}, T0 + 99_999, DispatchPolicy()) is Decision.STALE


def test_an_escalation_long_after_the_opening_is_still_news(store: Store) -> None:
    number = incident(store, "kl_drift", Severity.WARN, T0)
    store.escalate_incident(number, Finding("kl_drift", Severity.CRITICAL, 900, "worse"), T0 + 7200)
    sink = RecordingSink()
    dispatcher(store, ManualClock(T0 + 7201), sink, max_age_s=3600).pass_once()
    assert sink.got == [f"incident:{number}:critical"]


def test_a_closing_waits_for_its_failing_opening(store: Store) -> None:
    clock = ManualClock(T0 + 1)
    number = incident(store, "stall", Severity.CRITICAL, T0)
    sink = RecordingSink(failures=1)
    d = dispatcher(store, clock, sink)
    d.pass_once()  # the opening fails
    store.close_incident(number, status="resolved", now=T0 + 1.5, note="")
    clock.now = T0 + 1.6
    d.pass_once()  # its retry is not due; the closing must not overtake it
    assert sink.got == []
    clock.now = T0 + 3
    d.pass_once()
    assert sink.got == [f"incident:{number}:critical", f"incident:{number}:closed"]


def test_a_refusal_no_retry_can_change_is_dropped_at_once(store: Store) -> None:
    class Refused(RecordingSink):
        def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
            raise NotifyError("webhook answered HTTP 404", retryable=False)

    number = incident(store, "stall", Severity.CRITICAL, T0)
    dispatcher(store, ManualClock(T0 + 1), Refused("refused"), retries=60).pass_once()
    row = store.deliveries(RUN, "refused")[f"incident:{number}:critical"]
    assert (row.status, row.attempts) == ("dropped", 1)


def test_a_send_the_store_could_not_record_is_recorded_not_resent(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    number = incident(store, "stall", Severity.CRITICAL, T0)
    sink = RecordingSink()
    d = dispatcher(store, ManualClock(T0 + 1), sink)
    real = store.record_delivery
    calls = {"n": 0}

    def busy_once(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("UPDATE deliveries", {}, Exception("database is locked"))
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "record_delivery", busy_once)
    d.pass_once()  # sent, then the bookkeeping failed
    d.pass_once()
    assert sink.got == [f"incident:{number}:critical"]  # once
    assert store.deliveries(RUN, "rec")[f"incident:{number}:critical"].external_id == "id-1"


def test_webhook_names_cannot_take_a_built_in_sink_name() -> None:
    with pytest.raises(ValueError, match="taken by the built-in sinks"):
        NotifyConfig(webhooks=(WebhookConfig(name="grafana", url_env="X"),))


def test_a_bug_composing_an_alert_is_tried_once_logged_and_dropped_and_the_rest_goes_out(
    store: Store, receiver: Receiver, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = compose_module.format_evidence

    def format_evidence(evidence: Mapping[str, object]) -> str:  # a format code for the wrong type: a bug
        return f"ratio={evidence['ratio']:d}" if "ratio" in evidence else real(evidence)  # type: ignore[index]

    monkeypatch.setattr(compose_module, "format_evidence", format_evidence)
    finding = Finding("kl_drift", Severity.CRITICAL, 40, "kl drifting", evidence={"ratio": 0.2})
    broken = store.open_incident(RUN, finding, T0).id
    fine = incident(store, "stall", Severity.CRITICAL, T0 + 0.5)
    clock = ManualClock(T0 + 1)
    d = dispatcher(store, clock, webhook(receiver.url("/ok/hook")), retries=60)
    with caplog.at_level(logging.INFO, logger="guardian"):
        for _ in range(4):  # the retries an outage would get are due: none is made
            d.pass_once()
            clock.now += 120
    assert [b["guardian"]["key"] for b in bodies(receiver)] == [f"incident:{fine}:critical"]  # type: ignore[index]
    row = store.deliveries(RUN, "hook")[f"incident:{broken}:critical"]
    assert (row.status, row.attempts) == ("dropped", 1)
    (bug,) = lines(caplog, "delivery_bug")
    assert bug.levelno == logging.ERROR and bug.exc_info is not None and bug.exc_info[0] is ValueError
    assert (field(bug, "type"), field(bug, "event"), field(bug, "sink")) == (
        "ValueError",
        f"incident:{broken}:critical",
        "hook",
    )
    at = field(bug, "at")
    assert at.startswith("guardian/notify/compose.py:") and "format_evidence(" in source_line(at)
    assert row.last_error is not None and f"ValueError at {at}" in row.last_error and "not retried" in row.last_error
    assert not lines(caplog, "alert_failed") and not lines(caplog, "alert_dropped")
    assert store.delivery_counts(RUN) == {("hook", "sent"): 1, ("hook", "dropped"): 1}


def test_a_receiver_that_is_down_is_retried_until_it_is_back(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there: connection refused
    number = incident(store, "stall", Severity.CRITICAL, T0)
    key = f"incident:{number}:critical"
    clock = ManualClock(T0 + 1)
    d = dispatcher(store, clock, webhook(f"http://127.0.0.1:{port}/ok/hook"), retries=5)
    with caplog.at_level(logging.WARNING, logger="guardian"):
        d.pass_once()
        clock.now += backoff_s(1)
        d.pass_once()
    row = store.deliveries(RUN, "hook")[key]
    assert (row.status, row.attempts) == ("failing", 2) and "refused" in (row.last_error or "")
    assert len(lines(caplog, "alert_failed")) == 2 and not lines(caplog, "delivery_bug")
    with receiving(port) as receiver:
        clock.now += backoff_s(2)
        d.pass_once()
    assert [b["guardian"]["key"] for b in bodies(receiver)] == [key]  # type: ignore[index]
    assert store.deliveries(RUN, "hook")[key].status == "sent"


def test_a_receiver_answering_503_is_retried_with_backoff(store: Store, receiver: Receiver) -> None:
    receiver.answers.extend([503, 503])
    number = incident(store, "stall", Severity.CRITICAL, T0)
    key = f"incident:{number}:critical"
    clock = ManualClock(T0 + 1)
    d = dispatcher(store, clock, webhook(receiver.url("/ok/hook")), retries=5)
    d.pass_once()
    d.pass_once()  # not due yet
    assert len(receiver.requests) == 1 and store.deliveries(RUN, "hook")[key].status == "failing"
    for tries in (1, 2):
        clock.now += backoff_s(tries)
        d.pass_once()
    row = store.deliveries(RUN, "hook")[key]
    assert (row.status, row.attempts, len(receiver.requests)) == ("sent", 3, 3)


def test_a_receiver_refusing_the_payload_400_is_not_retried(
    store: Store, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.answers.append(400)  # the first request only
    refused = incident(store, "stall", Severity.CRITICAL, T0)
    later = incident(store, "kl_drift", Severity.CRITICAL, T0 + 0.5)
    clock = ManualClock(T0 + 1)
    d = dispatcher(store, clock, webhook(receiver.url("/ok/hook")), retries=60)
    with caplog.at_level(logging.INFO, logger="guardian"):
        for _ in range(3):
            d.pass_once()
            clock.now += 120
    assert [b["guardian"]["key"] for b in bodies(receiver)] == [  # type: ignore[index]
        f"incident:{refused}:critical",
        f"incident:{later}:critical",
    ]
    row = store.deliveries(RUN, "hook")[f"incident:{refused}:critical"]
    assert (row.status, row.attempts) == ("dropped", 1) and "HTTP 400" in (row.last_error or "")
    (bug,) = lines(caplog, "delivery_bug")
    assert field(bug, "type") == "NotifyError" and field(bug, "at").startswith("guardian/notify/notifiers.py:")
    assert "HTTP 400" in bug.getMessage() and bug.exc_info is not None


def test_a_bug_in_a_sweep_is_logged_once_with_its_place_not_every_sweep(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Exploding(RecordingSink):
        def wants(self, event: GuardianEvent) -> bool:
            raise RuntimeError("bug in a sink")

    incident(store, "stall", Severity.CRITICAL, T0)
    d = dispatcher(store, ManualClock(T0 + 1), Exploding("bad"))
    with caplog.at_level(logging.INFO, logger="guardian"):
        for _ in range(3):
            d.pass_once()
    (bug,) = lines(caplog, "notify_sweep_bug")
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert field(bug, "at").startswith("guardian/notify/dispatcher.py:") and "sink.wants(" in source_line(
        field(bug, "at")
    )
    assert not lines(caplog, "notify_sweep_failed")
