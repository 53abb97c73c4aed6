"""Alerts from events (compose) and their delivery: log lines, a loopback webhook, W&B offline."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import free_port
from webhook_receiver import Receiver

from guardian.core import EvidenceValue, Severity
from guardian.notify.compose import TITLE_MAX, Alert, compose, format_evidence, format_value
from guardian.notify.events import EventKind, GuardianEvent, Level, run_events
from guardian.notify.notifiers import (
    LogNotifier,
    Notifier,
    NotifyError,
    WebhookNotifier,
    redact_url,
)
from guardian.notify.wandb_alert import WandbNotifier
from guardian.rescue.policy import State
from guardian.store.interventions import InterventionEventView, InterventionView
from guardian.store.views import IncidentView

T0 = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)
SECRET = "xoxb-SECRET-TOKEN-1234"
EVIDENCE: dict[str, EvidenceValue] = {
    "entropy": 0.0123456789,
    "baseline_entropy": 0.81234,
    "tokens": 1234567,
    "ratio": 123456.789,
    "signal": None,
}


def incident(
    *,
    id: int = 7,
    check: str = "entropy_collapse",
    severity: Severity = Severity.CRITICAL,
    status: str = "open",
    onset: int | None = 95,
    opened: int | None = 120,
    closed_step: int | None = None,
    note: str | None = None,
    run_id: str = "run-a",
    evidence: Mapping[str, EvidenceValue] | None = None,
) -> IncidentView:
    closed = status in ("resolved", "gave_up", "dismissed")
    return IncidentView(
        id=id,
        run_id=run_id,
        check=check,
        severity=severity,
        status=status,
        opened_at=T0,
        opened_step=opened,
        onset_step=onset,
        updated_at=T0,
        closed_at=T0 + timedelta(minutes=30) if closed else None,
        closed_step=closed_step,
        message="policy entropy fell to 0.0123 (1.5% of its baseline)",
        evidence=EVIDENCE if evidence is None else evidence,
        note=note,
    )


def intervention(*, state: str = "RESUMING", target_step: int | None = 80, kind: str = "remediate") -> InterventionView:
    return InterventionView(
        id=3,
        run_id="run-a",
        incident_id=7,
        number=2,
        kind=kind,
        rung=1,
        state=state,
        from_attempt_id=1,
        to_attempt_id=4,
        target_step=target_step,
        target_path=f"/ckpt/global_step_{target_step}",
        # what a real plan holds: never to be shown
        plan={"argv": ["python", "-m", "verl", f"+token={SECRET}"], "env": {"WANDB_API_KEY": SECRET}},
        created_at=T0,
        updated_at=T0,
        note=None,
    )


def timeline(*entries: tuple[str, Mapping[str, object]]) -> list[InterventionEventView]:
    return [
        InterventionEventView(id=10 + n, state=state, at=T0 + timedelta(minutes=n + 1), detail=detail)
        for n, (state, detail) in enumerate(entries)
    ]


FULL_TIMELINE = timeline(
    ("DETECTED", {}),
    ("STOPPING", {"plan": "rung 2 of 3", "exclude_steps": []}),
    ("STOPPED", {"target": "/ckpt/global_step_80", "why": "newest healthy checkpoint at or before step 90"}),
    ("ROLLED_BACK", {"moved": [100, 120], "tracker": 80}),
    ("PATCHED", {"diff": [["actor_rollout_ref.actor.entropy_coeff", 0.0, 0.001]], "notes": ["entropy bonus on"]}),
    ("RESUMING", {}),
    ("PROBATION", {"first_step": 81}),
    ("RESOLVED", {"why": "20 healthy steps after the resume"}),
)


def intervention_events(entries: list[InterventionEventView], inc: IncidentView | None = None) -> list[GuardianEvent]:
    return [e for e in run_events("run-a", "enforce", [inc or incident()], [(intervention(), entries)]) if e.state]


def by_state(events: list[GuardianEvent]) -> dict[State, Alert]:
    return {e.state: compose(e) for e in events if e.state is not None}


def event(inc: IncidentView, *, mode: str = "enforce", kind: EventKind = EventKind.INCIDENT) -> GuardianEvent:
    level = Level.CRITICAL if inc.severity is Severity.CRITICAL else Level.WARNING
    return GuardianEvent(f"incident:{inc.id}:x", kind, inc.run_id, T0, level, inc, mode)


# -------------------------------------------------------------------------------------------- compose


def test_critical_incident_in_enforce_mode_says_what_will_happen() -> None:
    alert = compose(event(incident()))
    assert alert.title == "[critical] entropy_collapse on run-a"
    assert (alert.key, alert.run_id, alert.check, alert.level) == (
        "incident:7:x",
        "run-a",
        "entropy_collapse",
        Level.CRITICAL,
    )
    lines = alert.text.splitlines()
    assert lines[0] == (
        "*Detected:* entropy_collapse (critical) at step 120, onset step 95: "
        "policy entropy fell to 0.0123 (1.5% of its baseline)"
    )
    assert (
        lines[1] == "*Evidence:* entropy=0.01235, baseline_entropy=0.8123, tokens=1234567, ratio=1.235e+05, signal=n/a"
    )
    assert lines[2] == (
        "*Guardian:* will stop the trainer, roll back to the newest healthy checkpoint at or before step 95, "
        "patch the config and resume"
    )
    assert "incident #7 ·" in lines[3] and "mode enforce" in lines[3] and "2026-11-18 12:00:00 UTC" in lines[3]
    assert lines[4] == "*See:* `guardian incidents show 7` · `guardian checkpoints run-a`"
    assert alert.fields["step"] == "120" and alert.fields["onset_step"] == "95" and alert.fields["incident"] == "7"
    assert alert.fields["severity"] == "critical" and "state" not in alert.fields


@pytest.mark.parametrize(
    ("mode", "severity", "expected"),
    [
        (
            "advise",
            Severity.CRITICAL,
            "advise mode: no action taken; see `guardian incidents show 7` for the recommended fix",
        ),
        ("observe", Severity.CRITICAL, "observe mode: no action taken"),
        ("observe", Severity.WARN, "observe mode: no action taken"),
        ("enforce", Severity.WARN, "watching; no action unless it turns critical"),
        ("advise", Severity.WARN, "watching; no action unless it turns critical; advise mode"),
    ],
)
def test_action_depends_on_mode_and_severity(mode: str, severity: Severity, expected: str) -> None:
    alert = compose(event(incident(severity=severity), mode=mode))
    assert f"*Guardian:* {expected}" in alert.text
    assert "will stop" not in alert.text
    if severity is Severity.WARN:
        assert alert.title.startswith("[warning] ") and alert.level is Level.WARNING


def test_a_setup_failure_promises_no_relaunch() -> None:
    alert = compose(event(incident(check="setup_failure", onset=None, opened=None, evidence={"exit_code": 1})))
    assert "failed before its first training step: not relaunched" in alert.text
    assert "will stop" not in alert.text and "roll back" not in alert.text


def test_crash_incident_promises_a_restart_not_a_patch() -> None:
    output = f"Traceback ... HF_TOKEN={SECRET}"  # a trainer's last words may hold a secret
    alert = compose(
        event(incident(check="crash", onset=None, opened=60, evidence={"exit_code": 1, "stdout_tail": output}))
    )
    assert "restart it from the newest healthy checkpoint at or before step 60" in alert.text
    assert "patch" not in alert.text and "*Evidence:* exit_code=1" in alert.text
    assert SECRET not in alert.text + str(alert.fields)  # the output stays in the store


def test_run_events_end_to_end_one_alert_per_notified_state() -> None:
    alerts = by_state(intervention_events(FULL_TIMELINE))
    assert set(alerts) == {State.STOPPED, State.ROLLED_BACK, State.PATCHED, State.RESUMING, State.RESOLVED}
    action = {state: a.fields["action"] for state, a in alerts.items()}
    assert action[State.STOPPED] == (
        "stopped the trainer; rolling back to /ckpt/global_step_80 (newest healthy checkpoint at or before step 90)"
    )
    assert action[State.ROLLED_BACK].startswith(
        "quarantined checkpoints after step 80 (moved: [100, 120]) — never deleted; "
        "undo: `guardian checkpoints restore run-a --incident 7`"
    )
    assert action[State.PATCHED] == "patched: actor_rollout_ref.actor.entropy_coeff: 0 → 0.001; entropy bonus on"
    assert action[State.RESUMING] == "resumed from step 80 (attempt id 4)"
    assert action[State.RESOLVED] == "resolved: 20 healthy steps after the resume"
    assert alerts[State.ROLLED_BACK].title == "[info] rolled back: entropy_collapse on run-a"
    for alert in alerts.values():
        assert alert.level is Level.INFO
        assert "*Detected:* entropy_collapse (critical) at step 120, onset step 95" in alert.text
        assert "intervention 2 of incident #7 (remediate, rung 2)" in alert.text
        assert alert.fields["intervention"] == "2"


def test_a_rollback_that_restored_its_target_from_a_pin_says_so() -> None:
    restored = {"moved": [100], "tracker": 80, "restored_from": "/ckpt/.guardian-pinned/global_step_80"}
    entries = timeline(("ROLLED_BACK", {**restored, "restore_mode": "link"}))
    (alert,) = by_state(intervention_events(entries)).values()
    assert alert.fields["action"].startswith(
        "restored step 80 from its pin /ckpt/.guardian-pinned/global_step_80 (verl's retention had deleted it); "
        "quarantined checkpoints after step 80 (moved: [100])"
    )


def test_relapse_gave_up_and_from_scratch() -> None:
    entries = timeline(
        ("ROLLED_BACK", {"target": None, "why": "no healthy checkpoint before the onset: from scratch", "moved": [5]}),
        ("PATCHED", {"diff": [{"key": "algorithm.kl_ctrl.kl_coef", "before": None, "after": 0.05}], "notes": []}),
        ("RELAPSED", {"why": "no new step 600s after the relaunch"}),
        ("GAVE_UP", {"why": "remediate budget spent (3 of 3)"}),
    )
    alerts = by_state(intervention_events(entries))
    assert (
        alerts[State.ROLLED_BACK]
        .fields["action"]
        .startswith(
            "no healthy checkpoint before the onset: from scratch; "
            "quarantined every checkpoint (moved: [5]) — never deleted"
        )
    )
    assert alerts[State.PATCHED].fields["action"] == "patched: algorithm.kl_ctrl.kl_coef: unset → 0.05"
    relapsed = alerts[State.RELAPSED]
    assert relapsed.level is Level.WARNING and relapsed.title == "[warning] relapsed: entropy_collapse on run-a"
    assert "relapsed: no new step 600s after the relaunch; escalating to the next remedy" in relapsed.text
    gave_up = alerts[State.GAVE_UP]
    assert gave_up.level is Level.CRITICAL and gave_up.title == "[critical] GAVE UP: entropy_collapse on run-a"
    assert (
        "*Guardian:* GAVE UP: remediate budget spent (3 of 3); the trainer is stopped; exit 93 — do not requeue; "
        "a human must look: `guardian incidents show 7`, `guardian checkpoints run-a`"
    ) in gave_up.text


def test_closed_incidents() -> None:
    gave_up = incident(status="gave_up", note="no healthy checkpoint left to roll back to")
    resolved = incident(status="resolved", closed_step=160, note="intervention 3: 20 healthy steps")
    dismissed = incident(status="dismissed", note="abandoned branch: rolled back to step 80")
    alerts = [
        compose(e)
        for inc in (gave_up, resolved, dismissed)
        for e in run_events("run-a", "enforce", [inc], [])
        if e.kind is EventKind.INCIDENT_CLOSED
    ]
    assert [a.title for a in alerts] == [
        "[critical] GAVE UP: entropy_collapse on run-a",
        "[info] resolved: entropy_collapse on run-a",
        "[info] dismissed: entropy_collapse on run-a",
    ]
    assert "GAVE UP: no healthy checkpoint left to roll back to; the trainer is stopped; exit 93" in alerts[0].text
    assert "*Guardian:* resolved at step 160: intervention 3: 20 healthy steps" in alerts[1].text
    assert "incident #7 (resolved)" in alerts[1].text and alerts[1].fields["status"] == "resolved"
    assert "*Guardian:* dismissed: abandoned branch: rolled back to step 80" in alerts[2].text


def test_restart_with_empty_patch_and_odd_shapes() -> None:
    entries = timeline(
        ("STOPPED", {}),
        ("PATCHED", {"diff": [], "notes": ["restart with the same config"]}),
        ("RESUMING", {}),
    )
    events = [
        e
        for e in run_events(
            "run-a", "enforce", [incident(check="stall")], [(intervention(kind="restart", target_step=None), entries)]
        )
        if e.state
    ]
    action = {s: a.fields["action"] for s, a in by_state(events).items()}
    assert action[State.STOPPED] == "stopped the trainer; rolling back to a healthy checkpoint (no reason recorded)"
    assert action[State.PATCHED] == "patched: no config change (same config); restart with the same config"
    assert action[State.RESUMING].startswith("restarted from scratch")


def test_titles_stay_under_64_chars() -> None:
    long_check = "reward_hacking_suspected_by_the_response_length_detector_" * 3
    long_run = "grpo-qwen2.5-7b-dapo-math-17k-8xh100-seed42-" * 4
    inc = incident(check=long_check, run_id=long_run)
    events = [event(inc), *run_events(long_run, "enforce", [inc], [(intervention(), FULL_TIMELINE)])]
    for e in events:
        alert = compose(e)
        assert len(alert.title) <= TITLE_MAX < 64
        assert alert.title.endswith("…") and "\n" not in alert.title
    assert compose(events[-1]).title.startswith("[info] resolved: reward_hacking")
    newline_check = compose(event(incident(check="a\nb\tc")))
    assert newline_check.title == "[critical] a b c on run-a"


def test_evidence_and_value_formatting() -> None:
    assert format_value(0.0123456) == "0.01235"
    assert format_value(123456.789) == "1.235e+05"
    assert format_value(2.0) == "2"
    assert format_value(12) == "12"
    assert format_value(None) == "n/a"
    assert format_value(True) == "true"
    assert format_value(float("nan")) == "nan" and format_value(float("-inf")) == "-inf"
    shown = format_value("Traceback (most recent call last):\n  File x\n" + "y" * 200)
    assert len(shown) == 80 and shown.endswith("…") and "\n" not in shown
    many = {f"k{i}": float(i) / 3 for i in range(15)}
    text = format_evidence(many)
    assert text.startswith("k0=0, k1=0.3333, k2=0.6667") and text.endswith("k11=3.667, (+3 more)")
    assert "*Evidence:* none recorded" in compose(event(incident(evidence={}))).text


def test_no_plan_argv_or_env_reaches_any_alert() -> None:
    inc = incident(status="gave_up", note="patch refused")
    events = run_events("run-a", "enforce", [inc], [(intervention(), FULL_TIMELINE)])
    assert len(events) >= 6
    for e in events:
        alert = compose(e)
        blob = json.dumps([alert.title, alert.text, dict(alert.fields)])
        assert SECRET not in blob and "argv" not in blob and "WANDB_API_KEY" not in blob
        assert all("\n" not in v for v in alert.fields.values())


# ---------------------------------------------------------------------------------------------- log


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_log_notifier_one_line_per_alert_at_matching_level() -> None:
    logger = logging.getLogger("test_notifiers.log")
    handler = _Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        notifier: Notifier = LogNotifier(logger=logger)
        for e in (event(incident(severity=Severity.WARN)), event(incident())):
            notifier.send(compose(e))
        gave_up = next(e for e in intervention_events(timeline(("GAVE_UP", {"why": "budget spent"}))))
        notifier.send(compose(gave_up))
        notifier.close()
    finally:
        logger.removeHandler(handler)
    assert [r.levelno for r in handler.records] == [logging.WARNING, logging.ERROR, logging.ERROR]
    lines = [r.getMessage() for r in handler.records]
    assert all("\n" not in line for line in lines)
    assert lines[1].startswith(
        "event=alert key=incident:7:x run=run-a check=entropy_collapse level=critical"
        ' title="[critical] entropy_collapse on run-a"'
    )
    assert " incident=7 " in lines[1] and " step=120 " in lines[1] and " onset_step=95 " in lines[1]
    assert " state=GAVE_UP " in lines[2] and "exit 93" in lines[2]


# ------------------------------------------------------------------------------------------ webhook

TOKEN_PATH = f"/services/T0ABCDEF/B0GHIJKL/{SECRET}"


def test_webhook_posts_slack_compatible_json(receiver: Receiver) -> None:
    notifier: Notifier = WebhookNotifier(receiver.url("/ok" + TOKEN_PATH), timeout_s=5)
    alert = compose(event(incident(evidence={"entropy": 0.01, "note": "a<b & c>d"})))
    notifier.send(alert)
    notifier.close()
    (request,) = receiver.requests
    assert request["method"] == "POST" and request["path"] == "/ok" + TOKEN_PATH
    assert request["content_type"] == "application/json"
    body = request["body"]
    assert isinstance(body, bytes)
    payload = json.loads(body)
    assert set(payload) == {"text", "blocks", "guardian"}
    assert payload["text"].startswith("[critical] entropy_collapse on run-a\n*Detected:* entropy_collapse")
    assert "note=a&lt;b &amp; c&gt;d" in payload["text"]  # Slack's three escapes
    assert payload["blocks"][0] == {"type": "header", "text": {"type": "plain_text", "text": alert.title}}
    assert payload["blocks"][1]["text"]["type"] == "mrkdwn"
    assert payload["guardian"] == {
        "key": "incident:7:x",
        "run_id": "run-a",
        "check": "entropy_collapse",
        "level": "critical",
        "title": alert.title,
        "text": alert.text,  # raw, unescaped
        "fields": dict(alert.fields),
    }


def _assert_no_secret(text: str) -> None:
    assert SECRET not in text and "services" not in text and "T0ABCDEF" not in text, text


def test_webhook_error_status_names_status_and_host_only(receiver: Receiver) -> None:
    notifier = WebhookNotifier(receiver.url("/fail" + TOKEN_PATH), name="slack")
    with pytest.raises(NotifyError) as info:
        notifier.send(compose(event(incident())))
    message = str(info.value)
    assert "HTTP 500" in message and f"http://127.0.0.1:{receiver.port}/…" in message and "slack" in message
    assert "no such hook" in message  # the body, with the echoed path scrubbed
    assert info.value.retryable  # a 5xx may pass
    _assert_no_secret(message)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    _assert_no_secret(repr(notifier))
    assert notifier.url == f"http://127.0.0.1:{receiver.port}/…"


def test_webhook_redirect_is_a_failure(receiver: Receiver) -> None:
    notifier = WebhookNotifier(receiver.url("/moved" + TOKEN_PATH))
    with pytest.raises(NotifyError, match="HTTP 302") as info:
        notifier.send(compose(event(incident())))
    assert not info.value.retryable  # the receiver's answer will not change: dropped at once
    _assert_no_secret(str(info.value))
    assert [r["path"] for r in receiver.requests] == ["/moved" + TOKEN_PATH]


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(503, True), (502, True), (429, True), (408, True), (400, False), (401, False), (404, False)],
)
def test_webhook_answers_that_may_change_are_retryable_the_rest_not(
    receiver: Receiver, status: int, retryable: bool
) -> None:
    receiver.answers.append(status)
    with pytest.raises(NotifyError, match=f"HTTP {status}") as info:
        WebhookNotifier(receiver.url("/ok" + TOKEN_PATH)).send(compose(event(incident())))
    assert info.value.retryable is retryable


def test_webhook_tls_to_a_plain_http_receiver_is_not_retryable(receiver: Receiver) -> None:
    https = receiver.url("/ok" + TOKEN_PATH).replace("http://", "https://")
    with pytest.raises(NotifyError, match="cannot deliver") as info:
        WebhookNotifier(https).send(compose(event(incident())))
    assert not info.value.retryable  # the same handshake fails every time
    _assert_no_secret(str(info.value))


def test_webhook_closed_port() -> None:
    port = free_port()  # nothing listens there
    notifier = WebhookNotifier(f"https://127.0.0.1:{port}{TOKEN_PATH}?token={SECRET}")
    with pytest.raises(NotifyError, match="cannot deliver") as info:
        notifier.send(compose(event(incident())))
    message = str(info.value)
    assert f"https://127.0.0.1:{port}/…" in message
    _assert_no_secret(message)
    assert info.value.retryable


def test_webhook_timeout_is_honoured(receiver: Receiver) -> None:
    notifier = WebhookNotifier(receiver.url("/slow" + TOKEN_PATH), timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(NotifyError, match=r"no answer within 0\.3s") as info:
        notifier.send(compose(event(incident())))
    assert time.monotonic() - started < 3
    _assert_no_secret(str(info.value))


def test_webhook_rejects_bad_urls_without_echoing_them() -> None:
    for url in ("ftp://host/secret-path-123", f"file:///{SECRET}", "not a url", f"https://u:{SECRET}@h.invalid/x"):
        with pytest.raises(ValueError) as info:
            WebhookNotifier(url)
        assert "secret-path" not in str(info.value) and SECRET not in str(info.value)
    assert redact_url(f"https://u:p@hooks.slack.com:8443{TOKEN_PATH}") == "https://hooks.slack.com:8443/…"


# -------------------------------------------------------------------------------------------- wandb


def _in_thread(target: Callable[[], None]) -> None:
    """Run ``target`` in a non-main thread (as the dispatcher does) and re-raise what it raised."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body, name="notify-test")
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "wandb notifier hung"
    if errors:
        raise errors[0]


@pytest.fixture
def wandb_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "XDG_CACHE_HOME"):  # wandb-core logs there
        monkeypatch.setenv(name, str(tmp_path / "home" / name.lower()))
    return tmp_path


def test_wandb_offline_alert_lands_in_the_run_file(wandb_env: Path) -> None:
    gave_up = intervention_events(timeline(("GAVE_UP", {"why": "budget spent"})))
    alerts = [compose(event(incident())), *(compose(e) for e in gave_up)]
    notifier = WandbNotifier("guardian-tests", entity=None, run_name="run-a guardian", directory=wandb_env / "wb")

    def deliver() -> None:
        for alert in alerts:
            notifier.send(alert)
        notifier.close()
        notifier.close()  # idempotent

    _in_thread(deliver)
    assert sys.modules["wandb"].run is None  # the notifier's run never became the process's wandb.run
    files = list((wandb_env / "wb").rglob("*.wandb"))
    assert len(files) == 1, files
    wanted = [part.encode() for alert in alerts for part in (alert.title, alert.text)]
    # wandb-core (its own process) may still be writing the file when finish() returns: wait for it, bounded
    deadline = time.monotonic() + 30
    while not all(part in (data := files[0].read_bytes()) for part in wanted) and time.monotonic() < deadline:
        time.sleep(0.2)
    for part in wanted:
        assert part in data, (part, len(data))


def test_wandb_run_of_its_own_leaves_the_process_run_alone(wandb_env: Path) -> None:
    import wandb

    user_run = wandb.init(project="user", name="trainer", dir=wandb_env / "user")
    try:
        notifier = WandbNotifier("guardian-tests", entity=None, run_name="guardian", directory=wandb_env / "wb")

        def deliver() -> None:
            notifier.send(compose(event(incident())))
            assert wandb.run is user_run
            notifier.close()

        _in_thread(deliver)
        assert wandb.run is user_run
        user_run.log({"x": 1.0})  # still usable: the notifier neither finished nor replaced it
    finally:
        user_run.finish()
    assert len(list((wandb_env / "wb").rglob("*.wandb"))) == 1
    assert len(list((wandb_env / "user").rglob("*.wandb"))) == 1


def test_wandb_disabled_mode_is_a_no_op(wandb_env: Path) -> None:
    notifier = WandbNotifier("guardian-tests", entity=None, run_name="r", mode="disabled", directory=wandb_env / "wb")

    def deliver() -> None:
        notifier.send(compose(event(incident())))
        notifier.close()

    _in_thread(deliver)
    assert not list(wandb_env.rglob("*.wandb"))


def test_wandb_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    notifier = WandbNotifier("p", entity=None, run_name="r")
    with pytest.raises(NotifyError, match=r"pip install 'verl-guardian\[wandb\]'") as info:
        notifier.send(compose(event(incident())))
    assert not info.value.retryable  # it stays uninstalled
    notifier.close()
    with pytest.raises(ValueError, match="mode must be one of"):
        WandbNotifier("p", entity=None, run_name="r", mode="online-ish")


@pytest.mark.parametrize(
    ("error", "retryable"),
    [("CommError", True), ("AuthenticationError", False), ("UsageError", False), ("Error", False)],
)
def test_wandb_failures_are_retryable_when_wandb_could_not_reach_its_server(
    wandb_env: Path, monkeypatch: pytest.MonkeyPatch, error: str, retryable: bool
) -> None:
    import wandb

    def init(**kwargs: object) -> None:
        raise getattr(wandb.errors, error)("from wandb")

    monkeypatch.setattr(wandb, "init", init)
    notifier = WandbNotifier("p", entity=None, run_name="r", directory=wandb_env / "wb")
    with pytest.raises(NotifyError, match=f"wandb.init failed: {error}: from wandb") as info:
        notifier.send(compose(event(incident())))
    assert info.value.retryable is retryable
