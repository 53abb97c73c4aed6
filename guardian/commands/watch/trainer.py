"""Whether the trainer process that ``guardian watch --pid PID`` follows still runs, sampled once a tick."""

from __future__ import annotations

from collections.abc import Callable

from guardian.actions.liveness import pid_alive


class TrainerLiveness:
    """Sampled once per tick by the watch loop (``sample``), which hands the answer to that tick's checks
    (``IncidentTick.tick(trainer_alive=...)``), so the end decision and the stall check see the same answer. None
    when no process was named."""

    def __init__(self, pid: int | None, alive: Callable[[int], bool] = pid_alive) -> None:
        self.pid = pid
        self._alive = alive

    def sample(self) -> bool | None:
        return None if self.pid is None else self._alive(self.pid)
