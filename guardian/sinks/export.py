"""Publish a run's snapshot after every tick of a guard loop, and serve it as the Prometheus exporter while the
loop runs (``exporter`` in guardian.yaml)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from guardian.config import ExporterConfig
from guardian.incidents.guardian import Clock, Guardian
from guardian.logs import event, get_logger
from guardian.sinks.prometheus import serve, shutdown
from guardian.sinks.snapshot import GuardianSource
from guardian.store import Store

log = get_logger("export")


@contextmanager
def exporting(
    guardian: Guardian,
    store: Store,
    cfg: ExporterConfig,
    clock: Clock,
    stop: threading.Event | None = None,
    sinks: Sequence[str] = (),
    *,
    views_read_store: bool = False,
) -> Iterator[GuardianSource]:
    """Serve ``/metrics`` while the block runs; yields the run's snapshots, to call after every tick with whether
    it succeeded (``guardian_last_poll_success``): that publishes the tick's snapshot, which the terminal views
    draw too (``latest``). Disabled: serves nothing, and the snapshots read the store only when
    ``views_read_store`` (a view shows what it holds); else they are the guardian's memory alone.

    When the block ends the exporter says ``guardian_up 0`` and keeps serving for ``cfg.linger_s``, so
    the last state (a gave-up, the final counters) is scraped and a stop reads differently from a
    crash (whose series just vanish). That holds for a stop by signal too (``stop`` set: the first
    Ctrl-C or SIGTERM); a second one, setting ``stop`` again, ends the linger. An exception (Ctrl-C as
    KeyboardInterrupt in ``guardian demo``) ends it at once.
    """
    source = GuardianSource(guardian, store, clock, sinks=sinks, reads_store=cfg.enabled or views_read_store)
    if not cfg.enabled:
        yield source
        return
    server, thread = serve(source, cfg.host, cfg.port, allow_public=cfg.allow_public)
    log.info(event("exporter", {"url": f"http://{cfg.host}:{server.server_port}/metrics", "run": guardian.run_id}))
    ended = False
    try:
        yield source
        ended = True
    finally:
        source.stopped()
        stop = stop or threading.Event()
        try:
            if ended and cfg.linger_s > 0:  # not after an exception
                stop.clear()
                log.info(event("exporter_linger", {"seconds": cfg.linger_s, "skip": "Ctrl-C"}))
                stop.wait(cfg.linger_s)
                stop.set()
        finally:
            shutdown(server, thread)
