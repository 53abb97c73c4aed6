"""What the guardian does to a training run, as opposed to what it observes: launch, stop and re-attach to the
trainer (``process``, with the ``runner`` wrapper that keeps the trainer's exit status beyond the guardian's
lifetime), and the rescue steps built on them (rollback, patch, resume) in the sibling modules.
"""
