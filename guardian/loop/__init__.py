"""The one guard loop of ``run``, ``watch`` and ``demo``: the guarded tick, its pace, what follows each tick
(exporter, views, notifiers), and when failing ticks or a store outage end the guarding."""
