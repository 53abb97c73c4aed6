"""Serve the Prometheus exporter for the duration of a guard loop (``exporter`` in guardian.yaml)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from guardian.config import ExporterConfig
from guardian.daemon import Clock, Guardian
from guardian.logs import event, get_logger
from guardian.sinks.prometheus import GuardianSource, build_registry, serve, shutdown
from guardian.store import Store

log = get_logger("export")


@contextmanager
def exporting(guardian: Guardian, store: Store, cfg: ExporterConfig, clock: Clock) -> Iterator[Callable[[], None]]:
    """Serve ``/metrics`` while the block runs; yields the callback to call after every successful tick.
    Disabled: serves nothing and yields a no-op."""
    if not cfg.enabled:
        yield lambda: None
        return
    source = GuardianSource(guardian, store, clock)
    server, thread = serve(build_registry(source), cfg.host, cfg.port, allow_public=cfg.allow_public)
    log.info(event("exporter", {"url": f"http://{cfg.host}:{server.server_port}/metrics", "run": guardian.run_id}))
    try:
        yield lambda: source.record_poll(True)
    finally:
        source.up = False
        shutdown(server, thread)
