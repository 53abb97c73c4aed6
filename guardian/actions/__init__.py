"""What the guardian does to a training run: launch, stop and re-attach to the trainer (``process``, with the
``runner`` wrapper), and the steps a rescue is built from (patch, launch folders, dump pruning, strays).
It observes nothing: sources and checks do that.
"""
