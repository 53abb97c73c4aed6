"""Prometheus exporter: ``/metrics`` for the runs the guardian watches.

``GuardianCollector`` turns each scrape's ``RunSnapshot``s into metric families; nothing is mirrored into
prometheus_client metric objects, and ``build_registry`` uses a private registry. Names come from ``guardian.keys``;
labels are bounded sets. Non-finite values are left out, never exported as NaN. The metric table is
docs/observability.md (a test keeps it equal to the families built here)."""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from guardian import __version__, keys
from guardian.config import ConfigError
from guardian.core import Severity
from guardian.keys import Signal
from guardian.logs import event, get_logger
from guardian.redact import printable
from guardian.sinks.exposition import BoundedServer, ExpositionApp, TimedHandler
from guardian.sinks.snapshot import ExportSource, RunSnapshot
from guardian.states import FINISHED_STATES

log = get_logger("prometheus")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 9464
# connections waiting to be accepted (Prometheus, Grafana, people's curls scraping at once)
LISTEN_BACKLOG: Final = 128

# the final intervention states as label values (always exported, 0 until reached)
INTERVENTION_OUTCOMES: Final = tuple(sorted(state.lower() for state in FINISHED_STATES))
# exported with the opposite sign: the store keeps -log pi (log-perplexity), people read log-prob
_NEGATED: Final = frozenset({Signal.LOG_PPL})

_RUN_LABELS: Final = (keys.PROM_LABEL_RUN_ID, keys.PROM_LABEL_EXPERIMENT)

_SIGNAL_HELP: Final[Mapping[Signal, tuple[str, str]]] = {
    # signal: (help text, unit suffix of the name or "")
    Signal.ENTROPY: ("Mean per-token entropy of the policy on the sampled responses (verl actor/entropy).", "nats"),
    Signal.KL: ("KL divergence to the reference policy (verl actor/kl_loss or the in-reward KL penalty).", ""),
    Signal.EGR: ("Effective group ratio: share (0-1) of GRPO groups whose rewards are not all equal.", ""),
    Signal.LOG_PPL: ("Mean per-token log-probability of the sampled responses under the old policy.", "nats"),
    Signal.REWARD: ("Mean score (or reward) of the batch (verl critic/score/mean).", ""),
    Signal.LENGTH_MEAN: ("Mean response length of the batch (verl response_length/mean).", "tokens"),
    Signal.GRAD_NORM: ("Actor gradient norm (verl actor/grad_norm).", ""),
    Signal.LR: ("Actor learning rate (verl actor/lr).", ""),
    Signal.STEP_TIME: ("Time of the last training step as the trainer measured it (verl timing_s/step).", "seconds"),
    Signal.TOOL_CALLS: ("Mean tool calls (searches) per trajectory (verl tool_call_counts/mean or num_turns).", ""),
}


# ----------------------------------------------------------------------------------------- collector


class GuardianCollector(Collector):
    """A custom collector turning its ``ExportSource``'s snapshots into families at each scrape.

    Runs are keyed by ``run_id``: a second snapshot with the same id in one scrape is dropped (with a
    warning), since duplicate series make the whole exposition invalid. An exception from the source
    fails the scrape (HTTP 500, so Prometheus records ``up == 0``) rather than serve partial data.
    """

    def __init__(self, source: ExportSource) -> None:
        self._source = source

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (lets the registry check names without a scrape)."""
        return iter(_Families().all())

    def collect(self) -> Iterator[Metric]:
        """The metric families with one set of samples per run."""
        families = _Families()
        seen: set[str] = set()
        for snap in self._source.snapshot():
            if snap.run_id in seen:
                log.warning(event("metrics_duplicate_run", {"run": snap.run_id}))
                continue
            seen.add(snap.run_id)
            families.add(snap)
        return iter(families.all())


def _gauge(name: str, documentation: str, unit: str = "", extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[*_RUN_LABELS, *extra], unit=unit)


class _Families:
    """One scrape's metric families, filled run by run."""

    def __init__(self) -> None:
        self.up = _gauge(keys.PROM_UP, "1 while the guardian guards the run; 0 once it stopped.")
        self.poll_success = _gauge(
            keys.PROM_LAST_POLL_SUCCESS, "1 if the guardian's last poll of the run's sources succeeded, else 0."
        )
        self.poll_timestamp = _gauge(
            keys.PROM_LAST_POLL_TIMESTAMP, "Unix time of the guardian's last successful poll of the run.", "seconds"
        )
        self.tick_duration = _gauge(
            keys.PROM_TICK_DURATION,
            "How long the guard loop's last tick of the run took: reading its sources, judging, acting, storing.",
            "seconds",
        )
        self.info = InfoMetricFamily(
            keys.PROM_RUN_INFO.removesuffix("_info"),
            "The run's current attempt number, guardian mode and guardian version.",
            labels=list(_RUN_LABELS),
        )
        self.step = _gauge(keys.PROM_STEP, "Last training step of the run's active timeline.")
        self.step_age = _gauge(
            keys.PROM_LAST_STEP_AGE, "Seconds since the first metrics line of the last step arrived.", "seconds"
        )
        self.signals = {
            signal: _gauge(name, *_SIGNAL_HELP[signal]) for signal, name in keys.PROM_SIGNAL_METRICS.items()
        }
        self.reward_components = _gauge(
            keys.PROM_REWARD_COMPONENT,
            "Mean of one reward component (a numeric field the reward function returns besides the score), "
            "from the run's rollout dumps.",
            extra=(keys.PROM_LABEL_COMPONENT,),
        )
        self.check_status = _gauge(
            keys.PROM_CHECK_STATUS,
            "Latest verdict of each health check: -1 unknown, 0 ok, 1 warn, 2 critical.",
            extra=(keys.PROM_LABEL_CHECK,),
        )
        self.open_incidents = _gauge(
            keys.PROM_OPEN_INCIDENT_SEVERITY,
            "Worst severity of the check's open incidents: 0 none open, 1 warn, 2 critical. Unlike the check "
            "status (the latest step's verdict), it holds from detection until the incident closes.",
            extra=(keys.PROM_LABEL_CHECK,),
        )
        self.incidents = CounterMetricFamily(
            keys.PROM_INCIDENTS,
            "Incidents the guardian opened on the run, per check.",
            labels=[*_RUN_LABELS, keys.PROM_LABEL_CHECK],
        )
        self.interventions = CounterMetricFamily(
            keys.PROM_INTERVENTIONS,
            "Interventions that finished, per final state (resolved, relapsed, gave_up).",
            labels=[*_RUN_LABELS, keys.PROM_LABEL_STATE],
        )
        self.in_progress = _gauge(keys.PROM_INTERVENTION_IN_PROGRESS, "1 while an intervention is under way, else 0.")
        self.notifications = CounterMetricFamily(
            keys.PROM_NOTIFICATIONS,
            "Guardian events per notifier or Grafana sink and final result (sent, suppressed, dropped).",
            labels=[*_RUN_LABELS, keys.PROM_LABEL_SINK, keys.PROM_LABEL_RESULT],
        )
        self.store_degraded = _gauge(
            keys.PROM_STORE_DEGRADED,
            "1 while the store refuses writes: the guardian judges and can stop the trainer from memory, the record "
            "waits (a rescue holds after its stop until the store is back).",
        )
        self.store_pending = _gauge(
            keys.PROM_STORE_PENDING_WRITES, "Units of the guard loop's work (a tick's writes) waiting for the store."
        )
        self.store_dropped = CounterMetricFamily(
            keys.PROM_STORE_DROPPED_WRITES,
            "Units of the guard loop's work dropped because the write-behind queue was full (a restarted guardian "
            "reads their steps again from the metrics files).",
            labels=list(_RUN_LABELS),
        )
        self.pinned = _gauge(
            keys.PROM_PINNED_CHECKPOINTS,
            "Healthy checkpoints the guardian keeps pinned under .guardian-pinned/, out of reach of verl's "
            "retention (trainer.max_actor_ckpt_to_keep), for a rollback to land on.",
        )
        self.pinned_bytes = _gauge(
            keys.PROM_PINNED_BYTES,
            "Bytes the pinned checkpoints added on disk when pinned: 0 for hard links, the size for a copy (hard "
            "links refused). A hard-linked pin keeps its files alive once verl deletes the original: guardian "
            "checkpoints RUN shows what each holds now.",
            "bytes",
        )

    def all(self) -> list[Metric]:
        return [
            self.up,
            self.poll_success,
            self.poll_timestamp,
            self.tick_duration,
            self.info,
            self.step,
            self.step_age,
            *self.signals.values(),
            self.reward_components,
            self.check_status,
            self.open_incidents,
            self.incidents,
            self.interventions,
            self.in_progress,
            self.notifications,
            self.store_degraded,
            self.store_pending,
            self.store_dropped,
            self.pinned,
            self.pinned_bytes,
        ]

    def add(self, snap: RunSnapshot) -> None:
        run = [snap.run_id, snap.experiment]
        self.up.add_metric(run, 1.0 if snap.up else 0.0)
        if snap.last_poll_success is not None:
            self.poll_success.add_metric(run, 1.0 if snap.last_poll_success else 0.0)
        polled_at = snap.last_poll_success_at
        if polled_at is not None and math.isfinite(polled_at):
            self.poll_timestamp.add_metric(run, float(polled_at))
        if snap.tick_seconds is not None and math.isfinite(snap.tick_seconds):
            self.tick_duration.add_metric(run, float(snap.tick_seconds))
        attempt = str(snap.attempt) if snap.attempt is not None else ""
        self.info.add_metric(run, {"attempt": attempt, "mode": snap.mode, "version": __version__})
        if snap.step is not None:
            self.step.add_metric(run, float(snap.step))
        age = snap.last_step_age_seconds
        if age is not None and math.isfinite(age):
            self.step_age.add_metric(run, float(age))
        for signal, family in self.signals.items():
            value = snap.signals.get(signal)
            if value is not None and math.isfinite(value):
                family.add_metric(run, -value if signal in _NEGATED else float(value))
        for component, value in sorted(snap.reward_components.items()):
            if math.isfinite(value):
                self.reward_components.add_metric([*run, component], float(value))
        for check, severity in sorted(snap.checks.items()):
            self.check_status.add_metric([*run, check], float(int(severity)))
        for check in sorted(set(snap.checks) | set(snap.open_incidents)):
            self.open_incidents.add_metric([*run, check], float(int(snap.open_incidents.get(check, Severity.OK))))
        for check in sorted(set(snap.checks) | set(snap.incidents_opened)):
            self.incidents.add_metric([*run, check], float(snap.incidents_opened.get(check, 0)))
        for state in sorted(set(INTERVENTION_OUTCOMES) | set(snap.interventions_finished)):
            self.interventions.add_metric([*run, state], float(snap.interventions_finished.get(state, 0)))
        self.in_progress.add_metric(run, 1.0 if snap.intervention_in_progress else 0.0)
        for (sink, result), count in sorted(snap.notifications.items()):
            self.notifications.add_metric([*run, sink, result], float(count))
        self.store_degraded.add_metric(run, 1.0 if snap.store_degraded else 0.0)
        self.store_pending.add_metric(run, float(snap.store_pending_writes))
        self.store_dropped.add_metric(run, float(snap.store_dropped_writes))
        self.pinned.add_metric(run, float(snap.pinned_checkpoints))
        self.pinned_bytes.add_metric(run, float(snap.pinned_bytes))


def build_registry(source: ExportSource) -> CollectorRegistry:
    """A private registry holding only a ``GuardianCollector`` over ``source``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardianCollector(source))
    return registry


# ------------------------------------------------------------------------------------------- serving


Resolver = Callable[[str], list[str]]


def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` names, as ``socket.getaddrinfo`` (what a bind uses) resolves it."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class BindTarget:
    """Where a host would listen: ``address`` is what gets bound (the first resolved address, as the
    HTTP server itself would pick); ``public`` says whether that needs ``allow_public``."""

    address: str
    public: bool
    reason: str


def bind_target(host: str, resolve: Resolver = resolve_host) -> BindTarget:
    """Decide on the *resolved* addresses, never the spelling, whether listening on ``host`` is public.

    - Empty, or any address that is unspecified (``0.0.0.0``, ``::``, ``::ffff:0.0.0.0``; also spelt
      ``0``, ``0.0``, ``0x0``, ``0:0:0:0:0:0:0:0``): every interface, public.
    - Every address loopback (``127.0.0.0/8``, ``::1``, ``::ffff:127.0.0.1``; ``localhost``): not public.
    - One canonical IP literal (``10.1.2.3``, ``fe80::1``): that one interface, chosen explicitly: not
      public (hosts on that network can connect; that is what naming the address asks for).
    - Anything else (a host name, a non-canonical number such as ``0x0a010203``) resolving to a
      non-loopback address: public. A name can resolve differently tomorrow, so only an explicit
      ``allow_public`` lets it expose the exporter beyond this machine.

    Raises ``ConfigError`` (a ``ValueError``) naming ``exporter.host`` and its value when it does not resolve.
    """
    bare = host.strip().removeprefix("[").removesuffix("]")
    if not bare:
        return BindTarget("", True, "empty host listens on every interface")
    try:
        resolved = [ipaddress.ip_address(address) for address in resolve(bare)]
    except (OSError, UnicodeError, ValueError) as exc:
        raise ConfigError(f"exporter.host {printable(repr(host))} does not resolve to an address: {exc}") from None
    if not resolved:
        raise ConfigError(f"exporter.host {printable(repr(host))} does not resolve to an address")
    plain = [_unmapped(address) for address in resolved]
    first = str(resolved[0])
    if any(address.is_unspecified for address in plain):
        return BindTarget(first, True, "resolves to every interface")
    if all(address.is_loopback for address in plain):
        return BindTarget(first, False, "loopback")
    if _is_literal(bare) and len(resolved) == 1:
        return BindTarget(first, False, "one interface address, named explicitly")
    return BindTarget(first, True, f"host name resolving to {first}, reachable from other hosts")


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``::ffff:a.b.c.d`` as ``a.b.c.d`` (a dual-stack socket bound to it listens on the IPv4 address)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _is_literal(text: str) -> bool:
    """Whether ``text`` is an IP address in its canonical spelling (``ipaddress`` rejects ``0x0``, ``0``)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_public_host(host: str, resolve: Resolver = resolve_host) -> bool:
    """Whether listening on ``host`` needs ``allow_public`` (see ``bind_target``)."""
    return bind_target(host, resolve).public


def serve(
    source: ExportSource,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    allow_public: bool = False,
    resolve: Resolver = resolve_host,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``source``'s snapshots at ``http://host:port/metrics`` from a daemon thread (one thread per
    scrape; a snapshot's exposition is rendered once, guardian/sinks/exposition.py).

    ``host`` is resolved once (``bind_target``): listening beyond loopback (every interface, or a host
    name that resolves to an interface address) exposes run names and health to the network, so it is
    refused unless ``allow_public`` is set; the address decided on is the one bound, so the name cannot
    resolve to something else in between. Port 0 picks a free port: read it from the returned server's
    ``server_port``. Stop with ``shutdown(server, thread)``. A refused or unresolvable host is a ``ConfigError``
    naming ``exporter.host`` and its value (the command's one-line configuration error, exit 2).
    """
    target = bind_target(host, resolve)
    if target.public and not allow_public:
        raise ConfigError(
            f"exporter.host {printable(repr(host))}: refusing to serve metrics there ({target.reason}); bind "
            "127.0.0.1 or a specific interface address, or set exporter.allow_public: true"
        )
    app = ExpositionApp(source, lambda snapshots: build_registry(_Fixed(snapshots)))
    server = make_server(target.address, port, app, _server_class(target.address), handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    log.info(
        event(
            "metrics_serving",
            {"host": host, "address": target.address, "port": server.server_port, "public": target.public},
        )
    )
    return server, thread


class _Server(BoundedServer):
    """One thread per scrape (capped, with timeouts: ``BoundedServer``), with a listen backlog for many scrapers
    at once: the socket's default of 5 drops the connections beyond it, and a dropped connection is retried only
    after 1 s, 3 s, 7 s."""

    request_queue_size = LISTEN_BACKLOG


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(TimedHandler):
    """No line per request on stderr (scrapes every few seconds would drown the event lines)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def _server_class(address: str) -> type[_Server]:
    """The server class for ``address``'s family (empty: every IPv4 interface)."""
    return _Server6 if address and ipaddress.ip_address(address).version == 6 else _Server


class _Fixed:
    """The snapshots of one rendering, as an ``ExportSource``."""

    def __init__(self, snapshots: Sequence[RunSnapshot]) -> None:
        self._snapshots = snapshots

    def snapshot(self) -> Sequence[RunSnapshot]:
        return self._snapshots


def shutdown(server: WSGIServer, thread: threading.Thread, timeout: float = 5.0) -> None:
    """Stop a server started by ``serve``, close its socket and wait for its thread."""
    server.shutdown()
    server.server_close()
    thread.join(timeout)
