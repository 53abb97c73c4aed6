"""Checkpoint verdicts of the guard loop: weights saved at a step with NaN/inf stay unhealthy, whatever becomes of
the incident (a rollback must never land on them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardian.checkpoints.verdicts import NON_FINITE_NOTE
from guardian.config import GuardianConfig
from guardian.incidents.tick import IncidentTick
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store

RUN = "r"


def line(step: int, finite: bool = True) -> str:
    nan = float("nan")
    data = {
        "actor/entropy": 1.0 - 0.001 * step,
        "critic/score/mean": 0.3 + 0.01 * step,
        "actor/pg_loss": 0.1 if finite else nan,
        "actor/grad_norm": 1.0 if finite else nan,
    }
    return json.dumps({"step": step, "data": data}).replace("NaN", "null") + "\n"  # verl writes NaN as null


class Run:
    def __init__(self, root: Path) -> None:
        self.metrics, self.ckpt, self.db = root / "metrics.jsonl", root / "ckpt", root / "guardian.db"
        self.ckpt.mkdir()
        self.metrics.touch()

    def log(self, step: int, finite: bool = True, saved: bool = False) -> None:
        with self.metrics.open("a") as handle:
            handle.write(line(step, finite))
        if saved:
            (self.ckpt / f"global_step_{step}").mkdir()

    def register(self, store: Store) -> None:
        store.ensure_run(
            RUN,
            name=RUN,
            metrics_path=str(self.metrics),
            rollouts_dir="",
            checkpoints_dir=str(self.ckpt),
            mode="observe",
            now=0.0,
        )

    def guardian(self, store: Store, close_on_clear: bool) -> IncidentTick:
        return IncidentTick(
            config=GuardianConfig(),
            store=store,
            run_id=RUN,
            metrics=MetricsFile(self.metrics),
            checkpoints_dir=self.ckpt,
            clock=lambda: 1.0,
            close_on_clear=close_on_clear,
        )


def verdicts(store: Store) -> dict[int, tuple[str, str | None]]:
    return {c.step: (c.verdict, c.note) for c in store.checkpoints(RUN)}


@pytest.mark.parametrize("close_on_clear", [True, False], ids=["observe-closes-the-incident", "enforce-keeps-it"])
def test_a_checkpoint_saved_during_nan_steps_stays_unhealthy_after_the_run_recovers(
    tmp_path: Path, close_on_clear: bool
) -> None:
    run = Run(tmp_path)
    with Store.open(f"sqlite:///{run.db}") as store:
        run.register(store)
        guardian = run.guardian(store, close_on_clear)
        for step in range(1, 21):
            run.log(step, saved=step == 20)
        guardian.tick()
        run.log(21, finite=False)
        guardian.tick()
        run.log(22, finite=False, saved=True)  # two NaN steps: the non_finite incident opens, the save is suspect
        guardian.tick()
        (incident,) = store.list_incidents(RUN)
        assert incident.check == "non_finite" and incident.is_open
        assert verdicts(store)[22][0] == "unhealthy"

        run.log(23)  # finite again: in observe mode the incident closes, recovered without intervention
        run.log(24, saved=True)
        guardian.tick()
        guardian.tick()
        assert store.list_incidents(RUN)[0].is_open is not close_on_clear
        after = verdicts(store)
        assert after[20][0] == "healthy" and after[22][0] == "unhealthy"
        assert after[24][0] == ("healthy" if close_on_clear else "unhealthy")  # an open incident taints later saves

        restarted = run.guardian(store, close_on_clear)  # a guardian started again rebuilds its view from the files
        restarted.tick()
        restarted.tick()
        assert verdicts(store)[22][0] == "unhealthy"


def test_the_non_finite_verdict_says_why(tmp_path: Path) -> None:
    run = Run(tmp_path)
    with Store.open(f"sqlite:///{run.db}") as store:
        run.register(store)
        guardian = run.guardian(store, close_on_clear=True)
        for step in range(1, 11):
            run.log(step)
        run.log(11, finite=False, saved=True)  # one NaN step: only a warning, but the weights saved after it
        run.log(12)
        guardian.tick()
        assert store.list_incidents(RUN) == []
        assert verdicts(store)[11] == ("unhealthy", NON_FINITE_NOTE)
