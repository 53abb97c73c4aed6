"""The run's ``event=signals`` line: which signals it logs (and under which key) and which it lacks.

A start with validation metrics alone reads ``training=not yet``; the full line follows the first training step
and again whenever a signal shows up later, so the last line is right."""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field

from guardian.keys import Signal, signals_present

VALIDATION: frozenset[Signal] = frozenset({Signal.VAL_SCORE})


@dataclass
class SignalReport:
    """Decides when the run's ``event=signals`` line is (re)said and what it holds."""

    run_id: str
    _said: frozenset[Signal] | None = field(default=None, init=False)  # the signals the last line named present
    _training: bool = field(default=False, init=False)  # the last line was said over a training step
    _keys_read: int = field(default=-1, init=False)  # how many keys had been seen at the last look

    def update(self, keys_seen: Set[str], tracked: Iterable[Signal], step: int | None) -> dict[str, object] | None:
        """The line's fields when there is something (new) to say about the keys seen so far, else None."""
        if len(keys_seen) == self._keys_read:  # the seen keys only grow: same count, nothing new
            return None
        self._keys_read = len(keys_seen)
        present = signals_present(frozenset(keys_seen))
        now = frozenset(present)
        training = bool(now - VALIDATION)
        if now == self._said and training == self._training:
            return None
        fields: dict[str, object] = {
            "run": self.run_id,
            "present": ",".join(f"{s.value}={k}" for s, k in present.items()),
        }
        if not training:
            fields["training"] = "not yet: validation metrics only so far (verl validates before training)"
        else:
            fields["missing"] = ",".join(s.value for s in tracked if s not in present)
            if self._said is not None:  # a correction of an earlier line
                fields["since_step"] = step
        self._said, self._training = now, training
        return fields
