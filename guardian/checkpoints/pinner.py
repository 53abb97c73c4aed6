"""``guardian run``'s pin pass: after a tick that read new steps, keep the newest healthy checkpoints pinned.

``pin_plan`` decides; this pass does the disk work (``pinning``) before the store's row, so the store lags the disk
by at most one crash (an unknown pin folder is adopted, a row whose folder is gone is released). Advise and enforce
mode only. A failed pin is logged once (``event=pin_failed`` / ``pin_copy_refused``) and not retried for that step on
the same branch. Runs on the guard loop's thread. Why: docs/decisions/0014-checkpoint-pins.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from guardian.checkpoints.pin_plan import StepHealth, plan_pins
from guardian.checkpoints.pinning import GIB, CopyRefused, PinError, pin_checkpoint, release_pin, remove_leftovers
from guardian.checkpoints.view import CheckpointsView
from guardian.config import STORE_REREAD_S, CheckpointsConfig
from guardian.core import Clock
from guardian.logs import event, get_logger
from guardian.states import Verdict
from guardian.store import PinView, Store
from guardian.store.changes import StoreMemo

log = get_logger("pins")


@dataclass
class Pinner:
    config: CheckpointsConfig
    store: Store
    run_id: str
    checkpoint_dir: Path
    clock: Clock
    refused: dict[int, str] = field(default_factory=dict)  # step -> why its pin or release failed
    reread_s: float = STORE_REREAD_S  # store.reread_s
    _branch: int | None = None
    _swept: bool = False
    _reads: StoreMemo = field(init=False)  # the pins and verdicts read, kept while nothing was written

    def __post_init__(self) -> None:
        self._reads = StoreMemo(self.store.writes, self.reread_s, self.clock)

    def run(
        self,
        health: StepHealth,
        last_step: int | None,
        branch: int,
        *,
        on_disk: CheckpointsView,
        incident_open: bool | None = None,
    ) -> None:
        """One pass (see the module docstring); ``branch`` is the timeline's (a new one retries refused steps);
        ``on_disk``: the checkpoint dir as the tick read it; ``incident_open`` as the caller just read it (None: read
        it from the store here)."""
        if not self._swept:  # what a guardian killed while pinning left behind
            self._swept = True
            try:
                removed = remove_leftovers(self.checkpoint_dir)
            except PinError as exc:  # .guardian-pinned is a symlink or a file: nothing removed, said once
                log.error(event("pin_failed", {"run": self.run_id, "error": str(exc)}))
                removed = []
            if removed:
                log.info(event("pin_leftovers_removed", {"run": self.run_id, "folders": ",".join(removed)}))
        if branch != self._branch:
            self.refused.clear()
            self._branch = branch
        live = self._reconcile()
        stored = self._reads.read("checkpoints", lambda: tuple(self.store.checkpoints(self.run_id)))
        verdicts = {c.step: c.verdict for c in stored}
        plan = plan_pins(
            verdicts=verdicts,
            resumable=on_disk.resumable,
            pinned=set(live),
            health=health,
            last_step=last_step,
            window=self.config.healthy_window_steps,
            keep=self.config.pin_keep,
            incident_open=(
                any(i.is_open for i in self.store.list_incidents(self.run_id))
                if incident_open is None
                else incident_open
            ),
            skip=set(self.refused),
        )
        made = [step for step in plan.pin if self._pin(step)]
        if len(made) < len(plan.pin):
            return  # a pin failed: the older pins stay until the next pass has decided without it
        healthy = sorted(s for s in {*live, *made} if verdicts.get(s) == Verdict.HEALTHY)
        for step in plan.release:
            self._release(live[step], [s for s in healthy if s > step][: self.config.pin_keep])

    def _reconcile(self) -> dict[int, PinView]:
        """The live pins by step, once rows whose folder is gone are marked released."""
        live: dict[int, PinView] = {}
        for pin in self._reads.read("live_pins", lambda: tuple(self.store.pins(self.run_id, live=True))):
            if Path(pin.pinned_path).is_dir():
                live[pin.step] = pin
                continue
            note = "its folder is gone (set aside with an abandoned branch, or removed by hand)"
            self.store.release_pin(pin.id, now=self.clock(), note=note)
            log.warning(event("pin_gone", {"run": self.run_id, "step": pin.step, "path": pin.pinned_path}))
        return live

    def _pin(self, step: int) -> bool:
        started = self.clock()
        try:
            result = pin_checkpoint(self.checkpoint_dir, step, min_free_bytes=self.config.copy_min_free_bytes)
        except PinError as exc:
            self.refused[step] = str(exc)
            name = "pin_copy_refused" if isinstance(exc, CopyRefused) else "pin_failed"
            log.error(event(name, {"run": self.run_id, "step": step, "error": str(exc)}))
            return False
        self.store.record_pin(
            self.run_id,
            step=step,
            source_path=str(result.source),
            pinned_path=str(result.pinned),
            mode=result.mode,
            bytes_added=result.bytes_added,
            now=self.clock(),
        )
        fields = {
            "run": self.run_id,
            "step": step,
            "mode": result.mode.value,
            "files": result.files,
            "bytes_added": result.bytes_added,
            "seconds": round(self.clock() - started, 3),
            "path": result.pinned,
        }
        if result.adopted:
            fields["adopted"] = "already in place"
        if result.copied_because:
            fields["why"] = f"{result.copied_because}: copied, the pin takes {result.bytes_added / GIB:.2f} GiB"
            log.warning(event("checkpoint_pinned", fields))
        else:
            log.info(event("checkpoint_pinned", fields))
        return True

    def _release(self, pin: PinView, newer: list[int]) -> None:
        why = f"{len(newer)} newer healthy pins: steps {','.join(map(str, newer))}"
        try:
            release_pin(self.checkpoint_dir, pin.step)
        except PinError as exc:
            self.refused[pin.step] = str(exc)
            log.error(event("pin_failed", {"run": self.run_id, "step": pin.step, "error": str(exc)}))
            return
        self.store.release_pin(pin.id, now=self.clock(), note=why)
        log.info(event("pin_released", {"run": self.run_id, "step": pin.step, "why": why, "path": pin.pinned_path}))
