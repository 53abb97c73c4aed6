"""verl-guardian: watch a verl RL run, judge its health step by step, keep the history."""

__version__ = "0.1.0"
