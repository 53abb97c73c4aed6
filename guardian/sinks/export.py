"""Publish a run's snapshot after every tick of a guard loop, and serve it as the Prometheus exporter while the
loop runs (``exporter`` in guardian.yaml); ``FleetSource`` serves several runs' snapshots on one exporter."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

from guardian.config import ExporterConfig
from guardian.core import Clock
from guardian.logs import event, get_logger
from guardian.sinks.prometheus import serve, shutdown
from guardian.sinks.snapshot import ExportSource, GuardedRun, GuardianSource, RunSnapshot
from guardian.store import Store

log = get_logger("export")


@contextmanager
def exporting(
    guardian: GuardedRun,
    store: Store,
    cfg: ExporterConfig,
    clock: Clock,
    stop: threading.Event | None = None,
    sinks: Sequence[str] = (),
    *,
    views_read_store: bool = False,
    on_linger: Callable[[str, float], None] | None = None,
) -> Iterator[GuardianSource]:
    """Serve ``/metrics`` while the block runs; yields the run's snapshots, to call after every tick with whether
    it succeeded (``guardian_last_poll_success``): that publishes the tick's snapshot, which the terminal views
    draw too (``latest``). Disabled: serves nothing, and the snapshots read the store only when
    ``views_read_store`` (a view shows what it holds); else they are the guardian's memory alone. When the block
    ends the run's snapshots say ``guardian_up 0``, served for the linger (``serving``; ``on_linger`` is told).
    """
    source = GuardianSource(
        guardian,
        store,
        clock,
        sinks=sinks,
        reads_store=cfg.enabled or views_read_store,
        store_refresh_s=cfg.store_refresh_s,
    )
    if not cfg.enabled:
        yield source
        return
    with serving(source, cfg, stop, {"run": guardian.run_id}, on_linger):
        try:
            yield source
        finally:
            source.stopped()


@contextmanager
def serving(
    source: ExportSource,
    cfg: ExporterConfig,
    stop: threading.Event | None,
    fields: Mapping[str, object],
    on_linger: Callable[[str, float], None] | None = None,
) -> Iterator[None]:
    """Serve ``source`` on ``/metrics`` (``cfg``'s host and port) while the block runs, then keep serving for
    ``cfg.linger_s`` (the caller has made its snapshots say ``guardian_up 0``), so the last state (a gave-up, the
    final counters) is scraped and a stop reads differently from a crash (whose series just vanish). That holds
    for a stop by signal too (``stop`` set: the first Ctrl-C or SIGTERM); a second one, setting ``stop`` again,
    ends the linger. An exception (Ctrl-C as KeyboardInterrupt in ``guardian demo``) ends it at once. ``fields``
    go on the ``event=exporter`` line; ``on_linger(url, seconds)`` is called as the linger starts, once a Ctrl-C
    would end it (a command tells the person at the terminal what it waits for)."""
    server, thread = serve(source, cfg.host, cfg.port, allow_public=cfg.allow_public)
    url = f"http://{cfg.host}:{server.server_port}/metrics"
    log.info(event("exporter", {"url": url, **fields}))
    ended = False
    try:
        yield
        ended = True
    finally:
        stop = stop or threading.Event()
        try:
            if ended and cfg.linger_s > 0:  # not after an exception
                stop.clear()
                log.info(event("exporter_linger", {"seconds": cfg.linger_s, "skip": "Ctrl-C"}))
                if on_linger is not None:
                    on_linger(url, cfg.linger_s)
                stop.wait(cfg.linger_s)
                stop.set()
        finally:
            shutdown(server, thread)


class RunSource(ExportSource, Protocol):
    """One run's published snapshots (``GuardianSource``), which can be told the run is no longer guarded."""

    def stopped(self) -> None: ...


class FleetSource:
    """An ``ExportSource`` over several runs guarded in one process (``guardian fleet``): each run's published
    snapshots, in the order the runs joined; a run that ended stays, saying ``guardian_up 0``. Runs join and leave
    from their own threads; a scrape reads one tuple, replaced whole."""

    def __init__(self) -> None:
        self._members: tuple[tuple[str, RunSource], ...] = ()
        self._lock = threading.Lock()

    def join(self, run_id: str, member: RunSource) -> None:
        with self._lock:
            self._members = (*self._members, (run_id, member))

    def stopped(self, run_id: str) -> None:
        """The run's guardian stopped guarding it (a run that never joined is nothing to mark)."""
        for joined, member in self._members:
            if joined == run_id:
                member.stopped()

    def snapshot(self) -> tuple[RunSnapshot, ...]:
        return tuple(snap for _, member in self._members for snap in member.snapshot())
