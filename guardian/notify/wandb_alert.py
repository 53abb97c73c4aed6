"""The ``wandb.alert`` notifier: alerts mirrored on a W&B run of the guardian's own. A mirror, not the primary
path: offline clusters deliver them (if ever) with ``wandb sync`` (../shared/docs/observability-notes.md §5)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Final

from guardian.faults import is_outage
from guardian.notify.compose import Alert, truncate
from guardian.notify.events import Level
from guardian.notify.notifiers import NotifyError

_WANDB_LEVELS: Final = {Level.INFO: "INFO", Level.WARNING: "WARN", Level.CRITICAL: "ERROR"}
_WANDB_MODES: Final = frozenset({"online", "offline", "disabled", "shared"})
TITLE_LIMIT: Final = 63  # wandb.alert: the title must be under 64 characters


class WandbNotifier:
    """``run.alert`` on a W&B run of its own (job_type ``guardian``), started on the first ``send``.

    wandb is optional (``pip install verl-guardian[wandb]``) and imported only here. The run is created
    with ``reinit="create_new"``, so it neither finishes nor replaces another run of the process and
    does not become ``wandb.run``; console capture and system metrics are off. Offline, the alert goes
    into the run's ``.wandb`` file (delivered, if ever, by ``wandb sync``); ``mode="disabled"`` drops it.
    """

    def __init__(
        self,
        project: str,
        *,
        entity: str | None,
        run_name: str,
        mode: str | None = None,
        wait_duration_s: float = 60.0,
        directory: Path | None = None,
        name: str = "wandb",
    ) -> None:
        if mode is not None and mode not in _WANDB_MODES:
            raise ValueError(f"wandb notifier: mode must be one of {sorted(_WANDB_MODES)}, got {mode!r}")
        self.name = name
        self.project = project
        self.entity = entity
        self.run_name = run_name
        self.mode = mode
        self.wait_duration_s = wait_duration_s
        self.directory = directory
        self._run: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"WandbNotifier(name={self.name!r}, project={self.project!r}, run_name={self.run_name!r})"

    def send(self, alert: Alert) -> None:
        with self._lock:
            run = self._start()
            try:
                run.alert(
                    title=truncate(alert.title, TITLE_LIMIT),
                    text=alert.text,
                    level=_WANDB_LEVELS[alert.level],
                    wait_duration=self.wait_duration_s,
                )
            except Exception as exc:  # a third-party library: whatever it raises is a failed delivery
                raise NotifyError(
                    f"wandb {self.name}: alert failed: {type(exc).__name__}: {exc}", retryable=_retryable(exc)
                ) from exc

    def close(self) -> None:
        with self._lock:
            run, self._run = self._run, None
            if run is None:
                return
            try:
                run.finish()
            except Exception as exc:
                raise NotifyError(f"wandb {self.name}: finishing the run failed: {type(exc).__name__}: {exc}") from exc

    def _start(self) -> Any:
        if self._run is not None:
            return self._run
        try:
            import wandb
        except ImportError:
            raise NotifyError(
                "wandb notifier: the wandb package is not installed; pip install 'verl-guardian[wandb]'",
                retryable=False,
            ) from None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(
                project=self.project,
                entity=self.entity,
                name=self.run_name,
                job_type="guardian",
                mode=self.mode,  # type: ignore[arg-type]  # checked against _WANDB_MODES
                dir=self.directory,
                reinit="create_new",
                settings=wandb.Settings(
                    console="off", x_disable_stats=True, disable_git=True, save_code=False, x_save_requirements=False
                ),
            )
        except Exception as exc:
            raise NotifyError(
                f"wandb {self.name}: wandb.init failed: {type(exc).__name__}: {exc}", retryable=_retryable(exc)
            ) from exc
        return self._run


def _retryable(exc: Exception) -> bool:
    """Whether a failed ``wandb.init`` or ``run.alert`` may pass: W&B says it could not reach its server with
    a ``CommError`` (its ``AuthenticationError``, a bad key, is one too, and will not pass); else ``is_outage``."""
    from wandb.errors import AuthenticationError, CommError  # wandb is imported: it raised ``exc``

    return (isinstance(exc, CommError) and not isinstance(exc, AuthenticationError)) or is_outage(exc)
