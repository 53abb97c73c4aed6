"""The Prometheus exporter: names, labels, values and HELP/TYPE of the exposition, scraped over HTTP
from a private registry; ``snapshot_from`` over a real ``IncidentTick`` and store; loopback-only serving;
and ``promtool check metrics`` on the scrape when promtool is installed."""

from __future__ import annotations

import gzip
import json
import math
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import corrupt_table, free_port, required_tool
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from guardian import __version__, keys
from guardian.config import ExporterConfig, GuardianConfig
from guardian.core import Finding, Severity
from guardian.incidents.tick import IncidentTick
from guardian.keys import Signal
from guardian.sinks.export import exporting
from guardian.sinks.exposition import ExpositionApp
from guardian.sinks.prometheus import INTERVENTION_OUTCOMES, build_registry, is_public_host, serve, shutdown
from guardian.sinks.snapshot import GuardianSource, RunSnapshot, snapshot_from
from guardian.sources.jsonl import MetricsFile
from guardian.states import PinMode
from guardian.store import Store

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class FixedSource:
    """The exporter's seam: hands out whatever snapshots the test sets (read at every scrape)."""

    def __init__(self, snapshots: Sequence[RunSnapshot]) -> None:
        self.snapshots = list(snapshots)
        self.calls = 0

    def snapshot(self) -> list[RunSnapshot]:
        self.calls += 1
        return list(self.snapshots)


RUN_A = RunSnapshot(
    run_id="run-a",
    experiment="qwen-grpo",
    attempt=2,
    mode="enforce",
    step=120,
    last_step_age_seconds=7.5,
    signals={
        Signal.ENTROPY: 0.42,
        Signal.KL: 0.013,
        Signal.EGR: 0.55,
        Signal.LOG_PPL: 0.31,
        Signal.REWARD: 0.62,
        Signal.LENGTH_MEAN: 812.0,
        Signal.GRAD_NORM: math.nan,  # verl logged null: left out
        Signal.LR: 1e-6,
        Signal.STEP_TIME: 95.0,
        Signal.LOSS: 0.2,  # not an exported signal
    },
    checks={"entropy_collapse": Severity.CRITICAL, "kl_drift": Severity.WARN, "stall": Severity.OK},
    incidents_opened={"entropy_collapse": 2, "non_finite": 1},
    open_incidents={"entropy_collapse": Severity.CRITICAL, "non_finite": Severity.WARN},
    interventions_finished={"resolved": 1, "gave_up": 1},
    intervention_in_progress=True,
    notifications={("webhook", "sent"): 3, ("webhook", "dropped"): 1, ("grafana", "sent"): 4},
    last_poll_success=True,
    last_poll_success_at=1_764_000_000.0,
    tick_seconds=0.031,
    pinned_checkpoints=3,
    pinned_bytes=5 << 30,  # one copied pin of 5 GiB (hard links add none)
)
RUN_B = RunSnapshot(run_id="run-b", experiment="exp b", checks={"stall": Severity.UNKNOWN})


def series_of(text: str) -> Series:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(run: RunSnapshot, **extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({"run_id": run.run_id, "experiment": run.experiment, **extra}.items())


def exposition(source: FixedSource) -> str:
    return generate_latest(build_registry(source)).decode()


@pytest.fixture
def served() -> Iterator[tuple[FixedSource, str]]:
    source = FixedSource([RUN_A, RUN_B])
    server, thread = serve(source, "127.0.0.1", 0)
    try:
        yield source, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        shutdown(server, thread)


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode(), response.headers["Content-Type"]


# ---------------------------------------------------------------------------------------- collector


def test_values_and_labels_of_one_run() -> None:
    got = series_of(exposition(FixedSource([RUN_A])))
    run = labels(RUN_A)
    expected = {
        ("guardian_up", run): 1.0,
        ("guardian_last_poll_success", run): 1.0,
        ("guardian_last_poll_timestamp_seconds", run): 1_764_000_000.0,
        ("guardian_tick_duration_seconds", run): 0.031,
        ("guardian_step", run): 120.0,
        ("guardian_last_step_age_seconds", run): 7.5,
        ("guardian_step_time_seconds", run): 95.0,
        ("guardian_policy_entropy_nats", run): 0.42,
        ("guardian_kl_to_reference", run): 0.013,
        ("guardian_effective_group_ratio", run): 0.55,
        ("guardian_mean_log_prob_nats", run): -0.31,  # the negated log-perplexity
        ("guardian_reward_mean", run): 0.62,
        ("guardian_response_length_tokens", run): 812.0,
        ("guardian_learning_rate", run): 1e-6,
        ("guardian_intervention_in_progress", run): 1.0,
        ("guardian_run_info", labels(RUN_A, attempt="2", mode="enforce", version=__version__)): 1.0,
        ("guardian_check_status", labels(RUN_A, check="entropy_collapse")): 2.0,
        ("guardian_check_status", labels(RUN_A, check="kl_drift")): 1.0,
        ("guardian_check_status", labels(RUN_A, check="stall")): 0.0,
        # the worst open incident per check (0: none open), every check plus checks with an open one
        ("guardian_open_incident_severity", labels(RUN_A, check="entropy_collapse")): 2.0,
        ("guardian_open_incident_severity", labels(RUN_A, check="kl_drift")): 0.0,
        ("guardian_open_incident_severity", labels(RUN_A, check="non_finite")): 1.0,
        ("guardian_open_incident_severity", labels(RUN_A, check="stall")): 0.0,
        # every check has an incident series (0 until one opens), plus checks that opened one
        ("guardian_incidents_total", labels(RUN_A, check="entropy_collapse")): 2.0,
        ("guardian_incidents_total", labels(RUN_A, check="kl_drift")): 0.0,
        ("guardian_incidents_total", labels(RUN_A, check="non_finite")): 1.0,
        ("guardian_incidents_total", labels(RUN_A, check="stall")): 0.0,
        # every final state has a series from the start
        ("guardian_interventions_total", labels(RUN_A, state="gave_up")): 1.0,
        ("guardian_interventions_total", labels(RUN_A, state="relapsed")): 0.0,
        ("guardian_interventions_total", labels(RUN_A, state="resolved")): 1.0,
        ("guardian_interventions_total", labels(RUN_A, state="unresolved")): 0.0,
        ("guardian_notifications_total", labels(RUN_A, sink="grafana", result="sent")): 4.0,
        ("guardian_notifications_total", labels(RUN_A, sink="webhook", result="dropped")): 1.0,
        ("guardian_notifications_total", labels(RUN_A, sink="webhook", result="sent")): 3.0,
        ("guardian_store_degraded", run): 0.0,
        ("guardian_store_pending_writes", run): 0.0,
        ("guardian_store_dropped_writes_total", run): 0.0,
        ("guardian_pinned_checkpoints", run): 3.0,
        ("guardian_pinned_bytes", run): float(5 << 30),
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    assert not any(name == "guardian_grad_norm" for name, _ in got)  # NaN: no sample at all
    assert not any(name.endswith("_created") for name, _ in got)
    assert RUN_A.incidents_total == 3 and RUN_A.interventions_total == 3 and RUN_A.step_time_seconds == 95.0


def test_help_and_type_lines_and_no_timestamps() -> None:
    text = exposition(FixedSource([RUN_A, RUN_B]))
    kinds = {name: "gauge" for name in keys.PROM_METRIC_NAMES}
    counters = (keys.PROM_INCIDENTS, keys.PROM_INTERVENTIONS, keys.PROM_NOTIFICATIONS, keys.PROM_STORE_DROPPED_WRITES)
    kinds.update(dict.fromkeys(counters, "counter"))
    for name, kind in kinds.items():
        assert f"# TYPE {name} {kind}\n" in text
        help_line = next(line for line in text.splitlines() if line.startswith(f"# HELP {name} "))
        assert len(help_line) > len(f"# HELP {name} ") + 10
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples and all(s.timestamp is None for s in samples)  # no explicit timestamps
    assert "# HELP guardian_check_status" in text and "-1 unknown, 0 ok, 1 warn, 2 critical" in text


def test_every_exported_name_comes_from_keys_and_labels_are_bounded() -> None:
    full = replace(
        RUN_A,
        signals={**RUN_A.signals, Signal.GRAD_NORM: 3.0, Signal.TOOL_CALLS: 1.5},
        reward_components={"correctness": 0.4, "format": 0.9},
    )
    families = list(text_string_to_metric_families(exposition(FixedSource([full]))))
    names = {s.name for f in families for s in f.samples}
    assert names == keys.PROM_METRIC_NAMES
    assert all(name.startswith("guardian_") for name in names)
    allowed = {keys.PROM_LABEL_RUN_ID, keys.PROM_LABEL_EXPERIMENT}
    extra_by_name = {
        keys.PROM_CHECK_STATUS: {keys.PROM_LABEL_CHECK},
        keys.PROM_OPEN_INCIDENT_SEVERITY: {keys.PROM_LABEL_CHECK},
        keys.PROM_INCIDENTS: {keys.PROM_LABEL_CHECK},
        keys.PROM_INTERVENTIONS: {keys.PROM_LABEL_STATE},
        keys.PROM_REWARD_COMPONENT: {keys.PROM_LABEL_COMPONENT},
        keys.PROM_NOTIFICATIONS: {keys.PROM_LABEL_SINK, keys.PROM_LABEL_RESULT},
        keys.PROM_RUN_INFO: {"attempt", "mode", "version"},
    }
    for family in families:
        for sample in family.samples:
            assert set(sample.labels) == allowed | extra_by_name.get(sample.name, set()), sample
    assert set(INTERVENTION_OUTCOMES) == {"resolved", "unresolved", "relapsed", "gave_up"}


def test_unknown_values_are_left_out_and_two_runs_do_not_mix() -> None:
    got = series_of(exposition(FixedSource([RUN_A, RUN_B])))
    b = labels(RUN_B)
    of_b = {name: value for (name, lab), value in got.items() if ("run_id", "run-b") in lab}
    # run-b knows nothing yet: no step, no signals, no poll outcome; always up, info and counters
    assert of_b == {
        "guardian_up": 1.0,
        "guardian_run_info": 1.0,
        "guardian_check_status": -1.0,
        "guardian_open_incident_severity": 0.0,
        "guardian_incidents_total": 0.0,
        "guardian_interventions_total": 0.0,
        "guardian_intervention_in_progress": 0.0,
        "guardian_store_degraded": 0.0,
        "guardian_store_pending_writes": 0.0,
        "guardian_store_dropped_writes_total": 0.0,
        "guardian_pinned_checkpoints": 0.0,
        "guardian_pinned_bytes": 0.0,
    }
    assert ("guardian_check_status", labels(RUN_B, check="stall")) in got
    assert ("guardian_up", b) in got and ("guardian_step", labels(RUN_A)) in got
    assert ("guardian_run_info", labels(RUN_B, attempt="", mode="", version=__version__)) in got


def test_infinities_and_a_stopped_guardian() -> None:
    snap = replace(
        RUN_A,
        up=False,
        last_poll_success=False,
        last_step_age_seconds=math.inf,
        signals={Signal.ENTROPY: math.inf, Signal.KL: -math.inf, Signal.REWARD: 0.0},
    )
    got = series_of(exposition(FixedSource([snap])))
    run = labels(snap)
    assert got[("guardian_up", run)] == 0.0
    assert got[("guardian_last_poll_success", run)] == 0.0
    assert got[("guardian_reward_mean", run)] == 0.0  # zero is a value, not a gap
    names = {name for name, _ in got}
    assert not names & {"guardian_policy_entropy_nats", "guardian_kl_to_reference", "guardian_last_step_age_seconds"}


def test_state_is_read_at_scrape_time_and_duplicates_are_dropped() -> None:
    source = FixedSource([RUN_A])
    registry = build_registry(source)
    first = series_of(generate_latest(registry).decode())
    source.snapshots = [replace(RUN_A, step=121), replace(RUN_A, step=999, experiment="other")]
    second = series_of(generate_latest(registry).decode())
    assert first[("guardian_step", labels(RUN_A))] == 120.0
    assert second[("guardian_step", labels(RUN_A))] == 121.0  # the duplicate run-a was dropped
    assert [k for k in second if k[0] == "guardian_step"] == [("guardian_step", labels(RUN_A))]
    assert source.calls == 2


def test_openmetrics_exposition_parses_with_units() -> None:
    text = generate_openmetrics(build_registry(FixedSource([RUN_A]))).decode()
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["guardian_last_step_age_seconds"].unit == "seconds"
    assert families["guardian_policy_entropy_nats"].unit == "nats"
    assert families["guardian_run"].type == "info"
    assert families["guardian_incidents"].type == "counter"


# ------------------------------------------------------------------------------------------ serving


def test_scrape_over_http(served: tuple[FixedSource, str]) -> None:
    source, url = served
    text, content_type = scrape(url)
    assert content_type.startswith("text/plain")
    got = series_of(text)
    assert got[("guardian_step", labels(RUN_A))] == 120.0
    assert ("guardian_up", labels(RUN_B)) in got
    assert "# TYPE guardian_interventions_total counter" in text
    source.snapshots = [replace(RUN_A, step=200)]
    assert series_of(scrape(url)[0])[("guardian_step", labels(RUN_A))] == 200.0


def test_promtool_check_metrics_passes(served: tuple[FixedSource, str]) -> None:
    promtool = required_tool("promtool", "prometheus")
    text, _ = scrape(served[1])
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "::",
        "[::]",
        "",
        " 0.0.0.0 ",
        "0:0:0:0:0:0:0:0",
        "0",
        "0.0",
        "0x0",
        "::ffff:0.0.0.0",
        "[::ffff:0.0.0.0]",
    ],
)
def test_serving_on_every_interface_is_refused_unless_asked(host: str) -> None:
    """Every spelling of "every interface" is caught: the decision is made on the resolved address."""
    assert is_public_host(host)
    with pytest.raises(ValueError, match="allow_public"):
        serve(FixedSource([]), host, 0)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.1", "::ffff:127.0.0.1", "10.1.2.3", "fe80::1"])
def test_loopback_and_explicit_interface_addresses_are_not_public(host: str) -> None:
    assert not is_public_host(host)


def test_a_host_name_is_public_unless_it_resolves_to_loopback_only() -> None:
    names = {
        "metrics.internal": ["10.1.2.3"],
        "dual.internal": ["127.0.0.1", "10.1.2.3"],
        "wildcard.internal": ["0.0.0.0"],
        "local.internal": ["127.0.0.1", "::1"],
    }
    resolve = names.__getitem__
    assert is_public_host("metrics.internal", resolve) and is_public_host("dual.internal", resolve)
    assert is_public_host("wildcard.internal", resolve)
    assert not is_public_host("local.internal", resolve)
    with pytest.raises(ValueError, match=r"metrics\.internal.*resolving to 10\.1\.2\.3.*allow_public"):
        serve(FixedSource([]), "metrics.internal", 0, resolve=resolve)


def test_the_address_bound_is_the_one_decided_on() -> None:
    """A name is resolved once: the server listens on the address that was judged loopback."""
    server, thread = serve(FixedSource([RUN_A]), "loop.internal", 0, resolve=lambda _: ["127.0.0.1"])
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert "guardian_up" in scrape(f"http://127.0.0.1:{server.server_port}/metrics")[0]
    finally:
        shutdown(server, thread)


def test_an_unresolvable_host_is_a_clear_error() -> None:
    def unknown(host: str) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(ValueError, match=r"'no-such-host\.invalid' does not resolve.*not known"):
        is_public_host("no-such-host.invalid", unknown)


def test_allow_public_serves_and_shutdown_closes_the_port() -> None:
    server, thread = serve(FixedSource([RUN_A]), "0.0.0.0", 0, allow_public=True)
    port = server.server_port
    try:
        assert "guardian_up" in scrape(f"http://127.0.0.1:{port}/metrics")[0]
    finally:
        shutdown(server, thread)
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.1:{port}/metrics")


# -------------------------------------------------------------------------- a real guardian and store


def _write_run(path: Path, steps: range, null_grad_from: int) -> None:
    with path.open("w") as out:
        for step in steps:
            data = {
                "actor/entropy": 1.0 - 0.05 * step,
                "actor/kl_loss": 0.001 * step,
                "rollout_corr/training_log_ppl": 0.4,
                "critic/score/mean": 0.1 * step,
                "response_length/mean": 300.0 + step,
                "actor/grad_norm": None if step >= null_grad_from else 1.5,
                "actor/lr": 1e-6,
                "timing_s/step": 42.0,
            }
            out.write(json.dumps({"step": step, "data": data}) + "\n")


def test_snapshot_from_a_real_guardian(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _write_run(metrics, range(1, 7), null_grad_from=5)  # grad norm null for 2 steps: non_finite critical
    clock = [1_000.0]
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        store.ensure_run(
            "r1",
            name="python -m verl.trainer.main_ppo trainer.experiment_name=exp-a",
            metrics_path=str(metrics),
            rollouts_dir="",
            checkpoints_dir=None,
            mode="observe",
            now=clock[0],
            config_json=json.dumps({"command": ["python", "-m", "x", "trainer.experiment_name=exp-a"], "cwd": "."}),
        )
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="r1", metrics=MetricsFile(metrics), clock=lambda: clock[0]
        )
        guardian.tick()
        incident = store.list_incidents("r1")[0]
        done = store.create_intervention("r1", incident.id, kind="remediate", rung=1, from_attempt_id=None, now=1_001)
        store.advance(done.id, "RESOLVED", now=1_002)
        store.create_intervention("r1", incident.id, kind="remediate", rung=2, from_attempt_id=None, now=1_003)
        for step, mode, added in ((10, PinMode.COPY, 7 << 30), (20, PinMode.LINK, 0), (30, PinMode.COPY, 1 << 30)):
            pin = store.record_pin(
                "r1", step=step, source_path="s", pinned_path="p", mode=mode, bytes_added=added, now=1_003
            )
        store.release_pin(pin.id, now=1_004, note="released: no longer counted")

        snap = snapshot_from(guardian, store, 1_012.0, last_poll_success=True, last_poll_success_at=1_000.0)

        assert (snap.run_id, snap.experiment, snap.attempt, snap.mode) == ("r1", "exp-a", 1, "observe")
        assert snap.step == 6 and snap.last_step_age_seconds == pytest.approx(12.0)
        assert snap.signals[Signal.ENTROPY] == pytest.approx(0.7)
        assert snap.signals[Signal.LOG_PPL] == pytest.approx(0.4)
        assert snap.step_time_seconds == 42.0
        assert math.isnan(snap.signals[Signal.GRAD_NORM])
        assert Signal.EGR not in snap.signals  # no rollouts
        assert snap.checks["non_finite"] is Severity.CRITICAL
        assert set(snap.checks) == {check.name for check in guardian.checks}
        assert snap.incidents_opened == {"non_finite": 1}
        assert snap.interventions_finished == {"resolved": 1} and snap.intervention_in_progress
        assert (snap.pinned_checkpoints, snap.pinned_bytes) == (2, 7 << 30), "the live pins and what they added"

        # the same run through the glue object, scraped over HTTP (the store read from the server thread)
        source = GuardianSource(guardian, store, clock=lambda: clock[0] + 5)
        server, thread = serve(source, port=0)
        try:
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            before = series_of(scrape(url)[0])
            source.record_poll(True, at=1_004.0)
            source.record_poll(False, at=1_005.0)
            got = series_of(scrape(url)[0])
        finally:
            shutdown(server, thread)
    run = frozenset({"run_id": "r1", "experiment": "exp-a"}.items())
    assert ("guardian_last_poll_success", run) not in before  # no poll recorded yet: unknown, left out
    assert got[("guardian_last_poll_success", run)] == 0.0
    assert got[("guardian_last_poll_timestamp_seconds", run)] == 1_004.0  # the last *successful* poll
    assert got[("guardian_step", run)] == 6.0
    assert got[("guardian_last_step_age_seconds", run)] == pytest.approx(5.0)
    assert got[("guardian_mean_log_prob_nats", run)] == pytest.approx(-0.4)
    assert not any(name == "guardian_grad_norm" for name, _ in got)
    assert got[("guardian_check_status", run | {("check", "non_finite")})] == 2.0
    assert got[("guardian_incidents_total", run | {("check", "non_finite")})] == 1.0
    assert got[("guardian_interventions_total", run | {("state", "resolved")})] == 1.0
    assert got[("guardian_intervention_in_progress", run)] == 1.0
    assert got[("guardian_run_info", run | {("attempt", "1"), ("mode", "observe"), ("version", __version__)})] == 1.0


def test_experiment_falls_back_to_the_run_name_or_id(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("")
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as store:
        for run_id, name, config_json in [
            ("watched", "my-watch", None),
            ("launched", "python train.py a=b", json.dumps({"command": ["python", "train.py", "a=b"]})),
        ]:
            store.ensure_run(
                run_id,
                name=name,
                metrics_path=str(metrics),
                rollouts_dir="",
                checkpoints_dir=None,
                mode="observe",
                now=0.0,
                config_json=config_json,
            )
        experiments = {}
        for run_id in ("watched", "launched"):
            guardian = IncidentTick(
                config=GuardianConfig(), store=store, run_id=run_id, metrics=MetricsFile(metrics), clock=lambda: 0.0
            )
            snap = snapshot_from(guardian, store, 0.0)
            experiments[run_id] = snap.experiment
            assert snap.step is None and snap.attempt is None and snap.last_step_age_seconds is None
            assert snapshot_from(guardian, store, 0.0, experiment="given").experiment == "given"
    assert experiments == {"watched": "my-watch", "launched": "launched"}


def test_a_stopped_guardian_lingers_with_up_zero_until_a_second_signal(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("")
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as store:
        store.ensure_run(
            "r1", name="r1", metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="enforce", now=0.0
        )
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="r1", metrics=MetricsFile(metrics), clock=time.time
        )
        port = free_port()
        cfg = ExporterConfig(enabled=True, port=port, linger_s=5.0)
        stop = threading.Event()
        seen: list[float] = []

        def scrape_then_stop() -> None:
            time.sleep(0.3)
            got = series_of(scrape(f"http://127.0.0.1:{port}/metrics")[0])
            seen.append(got[("guardian_up", frozenset({"run_id": "r1", "experiment": "r1"}.items()))])
            stop.set()  # a second Ctrl-C during the linger ends it

        started = time.monotonic()
        with exporting(guardian, store, cfg, time.time, stop) as polled:
            polled(True)
            stop.set()  # the first Ctrl-C / SIGTERM ended the guard loop: the exporter still lingers
            threading.Thread(target=scrape_then_stop, daemon=True).start()
        assert seen == [0.0] and 0.3 <= time.monotonic() - started < 4.0
        assert stop.is_set()  # the caller still sees the stop

        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt), exporting(guardian, store, cfg, time.time, threading.Event()):
            raise KeyboardInterrupt  # an exception ends it at once
        assert time.monotonic() - started < 2.0


def test_notification_counters_start_at_zero_and_only_count_final_results(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("")
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as store:
        store.ensure_run(
            "r1", name="r1", metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="enforce", now=0.0
        )
        for key, status in (("incident:1:critical", "sent"), ("incident:2:critical", "failing")):
            store.record_delivery("r1", "oncall", key, check="stall", level=2, status=status, now=1.0)
        guardian = IncidentTick(
            config=GuardianConfig(), store=store, run_id="r1", metrics=MetricsFile(metrics), clock=lambda: 0.0
        )
        snap = snapshot_from(guardian, store, 2.0, sinks=["log", "oncall"])
    assert snap.notifications == {
        ("log", "sent"): 0,
        ("log", "suppressed"): 0,
        ("log", "dropped"): 0,
        ("oncall", "sent"): 1,
        ("oncall", "suppressed"): 0,
        ("oncall", "dropped"): 0,  # present before the first drop, so increase() sees it
    }  # the failing row is not counted: it will turn sent or dropped, and a counter never goes down


def _watched(run_id: str, metrics: Path, store: Store, clock: list[float]) -> IncidentTick:
    """An observe-mode guardian of ``metrics`` on the clock ``clock[0]``."""
    store.ensure_run(
        run_id, name=run_id, metrics_path=str(metrics), rollouts_dir="", checkpoints_dir=None, mode="observe", now=0.0
    )
    return IncidentTick(
        config=GuardianConfig(), store=store, run_id=run_id, metrics=MetricsFile(metrics), clock=lambda: clock[0]
    )


def test_scrapes_serve_the_snapshot_of_the_last_tick(tmp_path: Path) -> None:
    """Store reads happen when a tick publishes, never at scrape time; between ticks a scrape gets the
    very same snapshot (so its exposition is rendered once), only ``up`` follows at once."""
    metrics = tmp_path / "metrics.jsonl"
    _write_run(metrics, range(1, 4), null_grad_from=99)
    clock = [1_000.0]
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        guardian = _watched("r1", metrics, store, clock)
        guardian.tick()
        clock[0] = 1_002.0
        source = GuardianSource(guardian, store, clock=lambda: clock[0])
        [first] = source.snapshot()
        assert (first.step, first.attempt, first.last_step_age_seconds) == (3, 1, 2.0)

        _write_run(metrics, range(1, 6), null_grad_from=99)  # same head, longer: steps 4-5 arrive
        clock[0] = 1_010.0
        guardian.tick()
        assert source.snapshot() is source.snapshot()  # no publish since: the previous tick's view
        assert source.snapshot()[0] is first

        clock[0] = 1_011.0
        source(True, 0.25)  # what the guard loop calls after a tick: ok, and the tick's duration
        source.stopped()
        [fresh] = source.snapshot()
    assert (fresh.step, fresh.last_step_age_seconds, fresh.up, fresh.tick_seconds) == (5, 1.0, False, 0.25)
    assert (fresh.last_poll_success, fresh.last_poll_success_at) == (True, 1_011.0)


def test_an_exposition_is_rendered_once_per_snapshot_and_format() -> None:
    class Published:
        def __init__(self) -> None:
            self.current: tuple[RunSnapshot, ...] = (RUN_A,)

        def snapshot(self) -> tuple[RunSnapshot, ...]:
            return self.current

    source = Published()
    rendered: list[Sequence[RunSnapshot]] = []

    def registry_for(snapshots: Sequence[RunSnapshot]) -> CollectorRegistry:
        rendered.append(snapshots)
        return build_registry(FixedSource(snapshots))

    app = ExpositionApp(source, registry_for)
    text, headers = app.body("", "")
    assert app.body("", "") == (text, headers) and len(rendered) == 1
    zipped, zipped_headers = app.body("", "gzip")
    assert gzip.decompress(zipped) == text and ("Content-Encoding", "gzip") in zipped_headers
    openmetrics, om_headers = app.body("application/openmetrics-text; version=1.0.0", "")
    assert openmetrics.endswith(b"# EOF\n") and om_headers[0][1].startswith("application/openmetrics-text")
    assert len(rendered) == 3  # one per format
    source.current = (replace(RUN_A, step=121),)  # a tick published
    assert series_of(app.body("", "")[0].decode())[("guardian_step", labels(RUN_A))] == 121.0
    assert len(rendered) == 4


def test_a_store_that_cannot_be_read_keeps_the_live_state_fresh_and_says_it_is_degraded(tmp_path: Path) -> None:
    """The database file is damaged mid-run: ticks queue their writes (write-behind) and publishing goes on
    from memory over the last record read, with the store's health exported."""
    metrics, db = tmp_path / "metrics.jsonl", tmp_path / "guardian.db"
    _write_run(metrics, range(1, 4), null_grad_from=99)
    clock = [1_000.0]
    with Store.open(f"sqlite:///{db}") as store:
        guardian = _watched("r1", metrics, store, clock)
        guardian.tick()
        source = GuardianSource(guardian, store, clock=lambda: clock[0])
        [healthy] = source.snapshot()
        assert (healthy.step, healthy.attempt, healthy.store_degraded) == (3, 1, False)

        corrupt_table(db)
        store.close()  # connections opened from here on read the damaged file
        _write_run(metrics, range(1, 6), null_grad_from=99)
        clock[0] = 1_010.0
        guardian.tick()
        source.record_poll(True)
        [degraded] = source.snapshot()
        got = series_of(generate_latest(build_registry(source)).decode())
    assert (degraded.step, degraded.attempt, degraded.store_degraded) == (5, 1, True)
    assert degraded.store_pending_writes >= 1
    run = frozenset({"run_id": "r1", "experiment": "r1"}.items())
    assert got[("guardian_store_degraded", run)] == 1.0
    assert got[("guardian_store_pending_writes", run)] == degraded.store_pending_writes
    assert got[("guardian_store_dropped_writes_total", run)] == 0.0
    assert got[("guardian_step", run)] == 5.0


def test_a_quiet_tick_reads_the_store_only_every_refresh_interval(tmp_path: Path) -> None:
    """What the store holds (here: an incident another writer opened) shows at the next tick that moved, or once
    ``store_refresh_s`` passed; a quiet tick before that republishes the live state over the last read."""
    metrics = tmp_path / "metrics.jsonl"
    _write_run(metrics, range(1, 4), null_grad_from=99)
    clock = [1_000.0]
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        guardian = _watched("r1", metrics, store, clock)
        guardian.tick()
        source = GuardianSource(guardian, store, clock=lambda: clock[0], store_refresh_s=5.0)
        assert source.latest.incidents_total == 0
        store.open_incident("r1", Finding("kl_drift", Severity.WARN, 3, "KL rising"), now=clock[0])

        clock[0] = 1_002.0
        source(True, 0.01, False)  # quiet, 2 s after the last read: memory only
        assert source.latest.incidents_total == 0 and source.latest.tick_seconds == 0.01
        source(True, 0.01, True)  # moved: read again
        assert source.latest.incidents_total == 1

        store.open_incident("r1", Finding("stall", Severity.WARN, 3, "slow"), now=clock[0])
        clock[0] = 1_006.0
        source(True, 0.01, False)  # quiet, 4 s after: memory only
        assert source.latest.incidents_total == 1
        clock[0] = 1_007.5
        source(True, 0.01, False)  # quiet, 5.5 s after: read again
        assert source.latest.incidents_total == 2
        assert source.latest.last_step_age_seconds == pytest.approx(7.5)  # the live part is fresh on every tick
