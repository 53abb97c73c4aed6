"""What the commands do once ``guardian.cli`` has parsed them: ``run``, ``demo``, ``watch``, ``doctor``, and
the terminal views they share."""
