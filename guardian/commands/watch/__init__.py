"""``guardian watch``: follow a run it did not start, in observe mode, until the run ends.

Each tick of ``loop.WatchLoop`` samples the trainer's liveness (``--pid``), reads the metrics file, judges and stores
the new steps; ``display`` shows the tick, ``end.end_reason`` decides whether the watch ends, and ``summary`` turns
the history into the verdict. ``session`` runs one watch (wired by ``commands.compose``); a watch never stops or
patches a trainer.
"""
