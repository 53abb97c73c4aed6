"""The rescue: what to do about a collapsing run, decided purely from a snapshot and carried out through ports.

snapshot.py   the run at one moment (frozen)      decide.py    snapshot -> next effect (pure)
effects.py    the effects, one record each        executor.py  carries an effect out, state committed first
ports.py      trainer, checkpoints, planner        local.py     those ports on one machine"""
