"""The guardian's judgment on the two real verl 0.9.1 GRPO runs of tests/fixtures/verl-0.9.1-run/guarded.

Both runs were collapsed on purpose (a wrong-signed entropy bonus) and guarded end to end by an earlier
guardian, which called the collapse 10 and 12 steps late. Here: the judgment today is early enough
(within 6 steps of the collapse), it keeps the progress made until then, the live guard loop reaches the
same decisions a replay of the same files reaches, and the resumed branch is judged by its outcome.

The rollout dumps of a run's first attempt survive up to its old rollback point only: attempt 2 wrote its
own dumps into the same folder (the defect that made attempts keep their own dumps). Those are left out.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ManualClock, fixture_path

from guardian.config import ChecksConfig, GuardianConfig
from guardian.core import Severity
from guardian.history.timeline import RunHistory
from guardian.incidents.replay import replay_file
from guardian.incidents.tick import IncidentTick
from guardian.rescue.outcome import measure_outcome
from guardian.sources.jsonl import MetricsFile, read_all
from guardian.sources.rollouts import RolloutDir
from guardian.store import Store


@dataclass(frozen=True)
class RealRun:
    name: str
    collapse_step: int  # where the reward went flat while entropy fell 20-30 % a step (guarded/README.md)
    old_rollback: int  # the earlier guardian's rollback target: attempt 1's dumps survive up to it
    old_critical: int  # where the earlier guardian called it

    @property
    def folder(self) -> Path:
        return fixture_path("verl-0.9.1-run", "guarded", self.name)

    def attempt_1_dumps(self, into: Path) -> Path:
        into.mkdir(parents=True, exist_ok=True)
        for step in range(1, self.old_rollback + 1):
            shutil.copy(self.folder / "rollouts" / f"{step}.jsonl", into / f"{step}.jsonl")
        return into


RUNS = [RealRun("run-a", 15, 12, 25), RealRun("run-b", 20, 15, 32)]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_collapse_is_critical_within_six_steps_and_keeps_the_progress(run: RealRun, tmp_path: Path) -> None:
    result = replay_file(
        run.folder / "attempt-1.metrics.jsonl", ChecksConfig(), rollouts=run.attempt_1_dumps(tmp_path / "dumps")
    )
    first = result.first_critical
    assert first is not None and first.check == "entropy_collapse", [f.to_json() for f in result.raised]
    assert first.step is not None and 0 <= first.step - run.collapse_step <= 6
    assert first.step < run.old_critical
    # the onset is where the fast fall began, not where entropy began to ease (step 1): a rollback to a
    # checkpoint at or before it keeps the learning done until then
    assert first.onset_step is not None and run.old_rollback <= first.onset_step <= run.collapse_step + 2
    # the message says what the evidence says, and names the verl keys it read; the policy says why it acts
    assert "actor/entropy fell from" in first.message and "critic/score/mean" in first.message
    assert first.evidence["progress"] in ("not clearly improving", "stalled")
    assert first.evidence["policy"] == "mechanism/fast failure"
    # the cut at the 16-token cap is there by design: a warning that names the fix, never a critical
    truncation = [f for f in result.raised if f.check == "truncation"]
    assert truncation and all(f.severity == Severity.WARN for f in truncation)
    assert "data.max_response_length" in truncation[0].message


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_live_guard_loop_reaches_the_decisions_a_replay_reaches(run: RealRun, tmp_path: Path) -> None:
    """The trainer's files written line by line and dump by dump while the guard loop ticks, as verl
    writes them (the dump of a step lands after its metrics line), against a replay of the finished files."""
    dumps = run.attempt_1_dumps(tmp_path / "finished-dumps")
    replayed = replay_file(run.folder / "attempt-1.metrics.jsonl", ChecksConfig(), rollouts=dumps)
    live_dir = tmp_path / "live"
    (live_dir / "rollouts").mkdir(parents=True)
    metrics = live_dir / "metrics.jsonl"
    metrics.touch()
    clock = ManualClock(1_000_000.0)
    lines = (run.folder / "attempt-1.metrics.jsonl").read_bytes().splitlines(keepends=True)
    with Store.open(f"sqlite:///{tmp_path / 'guardian.db'}") as store:
        store.ensure_run(run.name, name=run.name, metrics_path=str(metrics), rollouts_dir="", checkpoints_dir="",
                         mode="observe", now=clock(), config_json="{}")  # fmt: skip
        guardian = IncidentTick(
            config=GuardianConfig(home=tmp_path / "home"),
            store=store,
            run_id=run.name,
            metrics=MetricsFile(metrics),
            clock=clock,
            rollouts=RolloutDir(live_dir / "rollouts"),
        )
        live = []
        for line in lines:
            with metrics.open("ab") as out:
                out.write(line)
            clock.now += 5.0
            live += guardian.tick().transitions
            step = read_all(metrics)[0][-1].step
            if (dumps / f"{step}.jsonl").exists():
                shutil.copy(dumps / f"{step}.jsonl", live_dir / "rollouts" / f"{step}.jsonl")
            for _ in range(2):  # a dump is read once it stopped changing between two polls
                clock.now += 0.25
                live += guardian.tick().transitions
    seen = [(t.finding.step, t.finding.check, t.change.value, t.finding.severity.label) for t in live]
    assert seen == [(t.finding.step, t.finding.check, t.change.value, t.finding.severity.label)
                    for t in replayed.transitions if t.finding.check != "stall"]  # fmt: skip
    assert (replayed.first_critical and replayed.first_critical.step) in {
        s for s, _, _, sev in seen if sev == "critical"
    }


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_resumed_branch_is_judged_by_its_outcome(run: RealRun) -> None:
    """Attempt 2 resumed from the old rollback point with the patch: its reward came back to the level at
    the rollback point (not to the 0.53-0.56 reached before the collapse: that is recorded beside it)."""
    history = RunHistory()
    checks = ChecksConfig()
    for attempt in (1, 2):
        for record in read_all(run.folder / f"attempt-{attempt}.metrics.jsonl")[0]:
            history.add(record)
    assert history.branch == 1 and history.steps[run.old_rollback] == run.old_rollback + 1
    outcome = measure_outcome(history, target_step=run.old_rollback, own=None, own_check=None, checks=checks)
    assert outcome.reward is not None and outcome.reward.key == "critic/score/mean"
    assert outcome.reward.recovered, outcome.describe()
    assert 0.9 < (outcome.reward.ratio or 0) < 1.3
    assert outcome.to_json()["reward"]["at_rollback"] == pytest.approx(outcome.reward.at_rollback, abs=1e-6)
