"""Whether the trainer process that ``guardian watch --pid PID`` follows still runs, sampled once a tick."""

from __future__ import annotations

from collections.abc import Callable

from guardian.actions.liveness import pid_alive


class TrainerLiveness:
    """Sampled once per tick by the watch loop (``sample``) and read by the checks of that tick (calling
    the object: the ``IncidentTick.trainer_alive`` callback), so the end decision and the stall check see the
    same answer. None when no process was named."""

    def __init__(self, pid: int | None, alive: Callable[[int], bool] = pid_alive) -> None:
        self.pid = pid
        self._alive = alive
        self._last: bool | None = None

    def sample(self) -> bool | None:
        self._last = None if self.pid is None else self._alive(self.pid)
        return self._last

    def __call__(self) -> bool | None:
        return self._last
