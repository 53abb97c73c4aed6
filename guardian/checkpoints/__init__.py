"""verl's checkpoints as the guardian keeps them: the folder scan, verdicts, pins, quarantine, restore, the target.

One view per tick (``view.CheckpointsView``: one disk scan and the stored verdicts) is what the rescue reads.
Pure decisions (``verdicts``, ``pin_plan``, ``target``) are apart from the disk work (``writes``, ``quarantine``,
``restore``, ``pinning``); the pins' rows are the store's (``guardian.store.pins``).
"""
