"""Where a guarded run goes out besides the store, for ``run``, ``watch`` and ``demo``: the notifiers and the
published snapshots (the exporter's ``/metrics``, the terminal views).

Entered before the trainer starts, so a bad webhook setting or a busy port fails first; left after the loop, so the
last events are flushed and the exporter lingers on the final state.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from guardian.config import GuardianConfig
from guardian.core import Clock
from guardian.loop.outage import CannotContinue
from guardian.notify.compose import cannot_continue_alert
from guardian.notify.setup import notifying, sink_names
from guardian.sinks.export import exporting
from guardian.sinks.snapshot import GuardedRun, GuardianSource
from guardian.store import Store


@dataclass(frozen=True, slots=True)
class Outlets:
    """What a guard loop needs of them: ``announce`` tells the notifiers straight, with no stored event, that the
    guardian gives up (``Dispatcher.announce``); ``snapshots`` is called after every tick and holds its snapshot."""

    announce: Callable[[CannotContinue], None]
    snapshots: GuardianSource


@contextmanager
def outlets(
    config: GuardianConfig,
    store: Store,
    guardian: GuardedRun,
    clock: Clock,
    stop: threading.Event,
    *,
    views_read_store: bool = False,
    on_linger: Callable[[str, float], None] | None = None,
) -> Iterator[Outlets]:
    """The run's notifiers and snapshots while the block runs; ``stop`` (Ctrl-C, SIGTERM) also ends the exporter's
    linger. ``views_read_store``: a view shows what the store holds, so the snapshots read it even when the
    exporter is off. ``on_linger(url, seconds)``: told when the exporter's linger starts (``sinks.export.serving``)."""
    with (
        notifying(config, store, guardian.run_id, clock, os.environ) as dispatcher,
        exporting(
            guardian,
            store,
            config.exporter,
            clock,
            stop,
            sink_names(config),
            views_read_store=views_read_store,
            on_linger=on_linger,
        ) as snapshots,
    ):
        yield Outlets(lambda ending: dispatcher.announce(cannot_continue_alert(ending)), snapshots)
