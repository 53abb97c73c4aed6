"""``guardian watch``: follow a run it did not start, in observe mode, until the run ends.

The data flow: in the guard loop (``guardian.loop.guard``), each tick of ``loop.WatchLoop`` samples the
trainer's liveness (``trainer.TrainerLiveness``, from ``--pid``), then ticks the ``daemon.Guardian`` that reads
the metrics file through ``loop.FollowedFile`` (which notes whether bytes are left, the file is at its end or
not there yet), judges the new steps and stores them; ``display`` shows the tick from its published snapshot
(a live table or plain lines), and ``end.end_reason`` decides
from what is known (follow or not, the file's state, the last step against the run's length, the
trainer's liveness) whether the watch ends. At the end, ``summary`` turns the guardian's history, the
stored incidents and the first critical finding its ``summary.VerdictTracker`` kept into the verdict and
the lines the command prints (``guardian.cli.watch``, which wires it all up).
"""
