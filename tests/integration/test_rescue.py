"""The rescue, pass by pass: every path from an incident to its end, on a real store with a manual clock and
recording ports (tests/rescue_world.py). The subprocess chaos tests (test_run_e2e.py) prove the same on real
processes; these prove each decision and each restart point in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from rescue_world import RUN, GuardianKilled, World

from guardian.actions.process import ExitStatus
from guardian.config import GuardianConfig
from guardian.exits import EXIT_GAVE_UP, EXIT_UNHEALTHY, EXIT_USAGE
from guardian.rescue.policy import SETUP_FAILURE
from guardian.rescue.snapshot import StandingFinding
from guardian.states import IncidentStatus, Kind, RunStatus, State
from guardian.store import Store

PATH_TO_RESUMING = [State.DETECTED, State.STOPPING, State.STOPPED, State.STOPPED, State.ROLLED_BACK, State.PATCHED]


@pytest.fixture
def world(tmp_path: Path) -> World:
    config = GuardianConfig.model_validate(
        {"home": str(tmp_path), "mode": "enforce", "intervention": {"probation_steps": 10}}
    )
    store = Store.open(f"sqlite:///{tmp_path / 'guardian.db'}")
    return World(store, tmp_path / "run", config)


def resumed(world: World) -> None:
    """An entropy collapse at step 40 (onset 35), checkpoints at 10, 20, 30 and 40: one pass reaches RESUMING."""
    world.save(10, 20, 30)
    world.save(40, verdict="unhealthy")
    world.incident()
    assert world.tick() is None


def test_a_collapse_is_rolled_back_patched_relaunched_and_resolved_once_the_fix_is_proven(world: World) -> None:
    resumed(world)
    (iv,) = world.interventions()
    assert (iv.state, iv.kind, iv.rung, iv.target_step) == (State.RESUMING, Kind.REMEDIATE, 0, 30)
    assert world.calls == [
        "stop intervention 1 of incident #1",
        "quarantine after 30: [40]",
        "launch attempt 2: train entropy_collapse-rung-1 resume=/ckpt/global_step_30",
    ]
    assert iv.plan is not None and iv.plan.diff[0].key == "actor.optim.lr"
    assert world.tick() is None, "no step yet: waits"
    world.logs(31, 32)
    world.proven(2)
    world.tick()
    assert world.interventions()[0].state is State.PROBATION
    world.proven(10)
    world.tick()
    (iv,) = world.interventions()
    assert iv.state is State.RESOLVED and world.states() == [
        *PATH_TO_RESUMING,
        State.RESUMING,
        State.PROBATION,
        State.RESOLVED,
    ]
    (incident,) = world.store.list_incidents(RUN)
    assert incident.status is IncidentStatus.RESOLVED
    assert "reward 0.55 vs 0.5 at the rollback point (higher)" in (incident.note or "")


def test_a_relapse_climbs_one_rung_and_rolls_back_one_checkpoint_further(world: World) -> None:
    resumed(world)
    world.logs(31)
    world.proven(1)
    world.tick()
    world.critical = [StandingFinding("entropy_collapse", 33)]
    assert world.tick() is None
    (first,) = world.interventions()
    assert first.state is State.RELAPSED and "critical again: entropy_collapse" in (first.note or "")
    world.critical = []
    world.tick()  # the next intervention opens on the next pass
    _, second = world.interventions()
    assert (second.state, second.rung, second.target_step) == (State.RESUMING, 1, 20)
    assert world.calls[-1] == "launch attempt 3: train entropy_collapse-rung-2 resume=/ckpt/global_step_20"


def test_each_relapse_escalates_until_the_budget_is_spent_then_it_gives_up_and_stays_stopped(world: World) -> None:
    world.save(5, 10, 20, 30)
    world.incident()
    for number in range(1, 4):  # the default budget: three remedies
        world.tick()
        world.clock.now += 10_000  # past the resume deadline, with no new step
        world.tick()
        assert world.interventions()[number - 1].state is State.RELAPSED
    assert [iv.rung for iv in world.interventions()] == [0, 1, 2]
    assert [iv.target_step for iv in world.interventions()] == [30, 20, 10]
    assert world.tick() == EXIT_GAVE_UP
    last = world.interventions()[-1]
    assert last.state is State.GAVE_UP and "budget spent (3 of 3)" in (last.note or "")
    assert world.store.get_run(RUN).status is RunStatus.GAVE_UP  # type: ignore[union-attr]
    assert world.store.list_incidents(RUN)[0].status is IncidentStatus.GAVE_UP
    world.calls.clear()
    assert world.tick() == EXIT_GAVE_UP and world.calls == ["stop gave up"], "a given-up run stays stopped"


def test_rungs_that_would_change_nothing_are_climbed_past_and_the_reason_says_so(world: World) -> None:
    world.planner.effective_from = 1
    resumed(world)
    (iv,) = world.interventions()
    assert iv.rung == 1
    stopping = world.store.intervention_events(iv.id)[1]
    assert "entropy-1 would change nothing in this run: rung 2 of 3" in stopping.detail.get("plan", "")


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda w: setattr(w.checkpoints, "refuse", "tracker file is a directory"), "rollback failed: tracker file"),
        (lambda w: setattr(w.planner, "refuse", "lr must be > 0"), "patch refused: lr must be > 0"),
    ],
)
def test_a_rollback_or_patch_that_cannot_be_done_gives_up_with_its_reason(world: World, setup, reason: str) -> None:  # type: ignore[no-untyped-def]
    setup(world)
    world.save(10, 20, 30)
    world.incident()
    assert world.tick() == EXIT_GAVE_UP
    (iv,) = world.interventions()
    assert iv.state is State.GAVE_UP and reason in (iv.note or "")
    assert not any(c.startswith("launch") for c in world.calls)


def test_a_check_with_no_ladder_gives_up_at_once(world: World) -> None:
    world.config = world.config.model_copy(
        update={"remediation": world.config.remediation.model_copy(update={"ladders": {}})}
    )
    world.new_guardian()
    world.incident()
    assert world.tick() == EXIT_GAVE_UP
    assert "no remediation ladder for entropy_collapse" in (world.interventions()[0].note or "")


def test_no_healthy_checkpoint_restarts_from_scratch_once_then_gives_up(world: World) -> None:
    world.save(40, verdict="unhealthy")
    world.incident()
    world.tick()
    (iv,) = world.interventions()
    assert iv.state is State.RESUMING and iv.target_step is None
    assert world.calls[1:] == ["quarantine all: [40]", "launch attempt 2: train entropy_collapse-rung-1 resume=disable"]
    world.exit_status = ExitStatus(1, None)
    world.tick()
    assert world.interventions()[0].state is State.RELAPSED
    assert world.tick() == EXIT_GAVE_UP
    assert "a restart from scratch failed too" in (world.interventions()[1].note or "")


def test_a_crash_opens_its_incident_with_the_output_and_restarts_with_the_same_config(world: World) -> None:
    world.save(10, 20)
    world.logs(40)  # trained through step 40 (a trainer that trained no step is a setup failure)
    world.exit_status = ExitStatus(1, None)
    world.tick()
    (crash,) = world.store.list_incidents(RUN)
    assert crash.check == "crash" and crash.message.endswith(
        "exit code 1: RuntimeError: CUDA error: an illegal memory access"
    )
    assert "Traceback" in str(crash.evidence["stdout_tail"])
    (iv,) = world.interventions()
    assert (iv.kind, iv.state, iv.target_step) == (Kind.RESTART, State.RESUMING, 20)
    assert world.calls[-1] == "launch attempt 2: train same-config resume=/ckpt/global_step_20"
    world.logs(21)
    world.proven(1)
    world.tick()
    world.proven(10)
    world.tick()
    assert world.interventions()[0].state is State.RESOLVED


def test_crash_output_that_cannot_be_read_is_said_in_the_incident_not_swallowed(world: World) -> None:
    world.trainer.tail = PermissionError(13, "Permission denied")
    world.logs(40)
    world.exit_status = ExitStatus(None, 9)
    world.tick()
    (crash,) = world.store.list_incidents(RUN)
    assert "killed by SIGKILL: (its output could not be read: [Errno 13] Permission denied)" in crash.message


def test_a_stall_is_answered_with_a_restart(world: World) -> None:
    world.save(10)
    world.incident("stall", step=12, onset=None)
    world.tick()
    (iv,) = world.interventions()
    assert iv.kind is Kind.RESTART and iv.target_step == 10


@pytest.mark.parametrize(
    ("arrange", "why"),
    [
        (lambda w: w.logs(25), "resumed at step 25, expected 30"),
        (lambda w: setattr(w, "exit_status", ExitStatus(1, None)), "ended before a new step: exit code 1"),
        (lambda w: setattr(w.clock, "now", w.clock.now + 951), "no new step 950s after the relaunch"),
    ],
)
def test_a_relaunch_that_does_not_train_past_its_checkpoint_relapses(world: World, arrange, why: str) -> None:  # type: ignore[no-untyped-def]
    resumed(world)
    world.clock.now += 949  # start-up 900 s + 5 typical steps of 10 s: not yet
    world.tick()
    assert world.interventions()[0].state is State.RESUMING
    world.clock.now -= 949
    arrange(world)
    world.tick()
    assert world.interventions()[0].state is State.RELAPSED and why in (world.interventions()[0].note or "")


def test_a_relaunch_may_take_a_multiple_of_what_the_first_launch_took_to_its_first_step(world: World) -> None:
    world.first_startup_s = 400.0  # x 3 = 1200 s, above intervention.startup_seconds (900 s)
    resumed(world)
    world.clock.now += 1249  # 1200 s + 5 typical steps of 10 s: not yet
    world.tick()
    assert world.interventions()[0].state is State.RESUMING
    world.clock.now += 2
    world.tick()
    assert world.interventions()[0].state is State.RELAPSED
    assert "no new step 1250s after the relaunch" in (world.interventions()[0].note or "")


def test_an_unproven_fix_is_unresolved_after_twice_the_probation_and_the_run_ends_unhealthy(world: World) -> None:
    resumed(world)
    world.logs(31)
    world.proven(10, reward=(0.5, 0.3))
    world.tick()
    world.tick()
    assert world.interventions()[0].state is State.PROBATION, "not proven: probation runs on"
    world.proven(20, reward=(0.5, 0.3))
    world.tick()
    assert world.interventions()[0].state is State.UNRESOLVED
    world.exit_status = ExitStatus(0, None)
    assert world.tick() == EXIT_UNHEALTHY
    assert world.calls[-1] == "finish exit code 0"


@pytest.mark.parametrize("mode", ["observe", "advise"])
def test_observe_and_advise_touch_nothing_advise_says_once_what_it_would_do(
    world: World, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    world.config = world.config.model_copy(update={"mode": mode})
    world.new_guardian()
    world.save(10, 20, 30)
    world.incident()
    world.tick()
    world.tick()
    assert world.interventions() == [] and world.calls == []
    advice = [r.getMessage() for r in caplog.records if "event=advice" in r.getMessage()]
    if mode == "advise":
        assert len(advice) == 1 and "roll back to step 30 and relaunch: train entropy_collapse-rung-1" in advice[0]
    else:
        assert advice == []
    world.exit_status = ExitStatus(0, None)
    assert world.tick() == EXIT_UNHEALTHY and world.calls == ["finish exit code 0"]


@pytest.mark.parametrize(
    "dies_after",
    ["DETECTED", "STOPPING", "STOPPED", "STOPPED+target", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION"],
)
def test_a_guardian_killed_after_any_commit_finishes_the_intervention_once(world: World, dies_after: str) -> None:
    world.kill_after = dies_after
    world.save(10, 20, 30)
    world.incident()
    world.proven(1)
    first_attempt = world.attempt_id

    def passes() -> None:
        for _ in range(4):
            world.tick()
            if world.attempt_id != first_attempt and not world.attempt_steps:
                world.logs(31)  # the relaunched trainer's first step

    with pytest.raises(GuardianKilled):
        passes()
    world.restarted()
    passes()
    world.proven(10)
    world.tick()
    (iv,) = world.interventions()
    assert iv.state is State.RESOLVED
    assert sum(c.startswith("launch attempt 2") for c in world.calls) == 1, world.calls
    assert sum(c.startswith("quarantine") for c in world.calls) == 1, world.calls
    assert len(world.store.attempts(RUN)) == 2
    assert world.states().count(State.RESUMING) == 1


def test_a_guardian_killed_between_resolved_and_the_incidents_close_closes_it_after_its_restart(world: World) -> None:
    world.save(10, 20, 30)
    world.incident()
    world.proven(1)
    for _ in range(3):
        world.tick()
        if world.attempt_id is not None and not world.attempt_steps:
            world.logs(31)
    world.kill_after = "RESOLVED"
    world.proven(10)
    with pytest.raises(GuardianKilled):
        world.tick()
    (incident,) = world.store.list_incidents(RUN)
    assert incident.is_open  # RESOLVED committed, the close not yet
    world.restarted()
    world.tick()
    (iv,) = world.interventions()  # not "came back": no second intervention
    assert iv.state is State.RESOLVED
    (incident,) = world.store.list_incidents(RUN)
    assert not incident.is_open and incident.status == "resolved"


# -- pinned checkpoints: verl's retention (trainer.max_actor_ckpt_to_keep) emptied the target's folder ---------------
def test_a_target_whose_folder_verls_retention_emptied_is_restored_from_its_pin_before_the_rollback(
    world: World,
) -> None:
    world.save(10, 20, 30)
    world.save(40, verdict="unhealthy")
    world.retention_deletes(10, 20, 30, pinned=True)
    world.incident()
    world.tick()
    (iv,) = world.interventions()
    assert (iv.state, iv.target_step) == (State.RESUMING, 30)
    assert world.calls == [
        "stop intervention 1 of incident #1",
        "restore 30 from its pin",
        "quarantine after 30: [40]",
        "launch attempt 2: train entropy_collapse-rung-1 resume=/ckpt/global_step_30",
    ]
    rolled_back = next(e for e in world.store.intervention_events(iv.id) if e.state is State.ROLLED_BACK)
    assert rolled_back.detail["restored_from"] == "/ckpt/.guardian-pinned/global_step_30"
    assert rolled_back.detail["restore_mode"] == "link" and rolled_back.detail["moved"] == [40]


def test_an_emptied_checkpoint_without_a_pin_is_no_rollback_target(world: World) -> None:
    world.save(10, 20, 30)
    world.retention_deletes(30, pinned=False)
    world.retention_deletes(10, pinned=True)
    world.incident()
    world.tick()
    assert world.interventions()[0].target_step == 20, "30 is gone and not pinned; 20 is still on disk"
    assert not any(c.startswith("restore") for c in world.calls), "an intact target needs no restore"


def test_with_every_healthy_checkpoint_gone_and_unpinned_it_restarts_from_scratch(world: World) -> None:
    world.save(10, 20, 30)
    world.retention_deletes(10, 20, 30, pinned=False)
    world.incident()
    world.tick()
    (iv,) = world.interventions()
    assert iv.target_step is None and world.calls[1] == "quarantine all: []"


def test_a_restore_that_cannot_be_done_gives_up_with_its_reason(world: World) -> None:
    world.checkpoints.refuse_restore = "disk full under /ckpt/.guardian-pinned while pinning /ckpt/global_step_30"
    world.save(10, 20, 30)
    world.retention_deletes(30, pinned=True)
    world.incident()
    assert world.tick() == EXIT_GAVE_UP
    (iv,) = world.interventions()
    assert iv.state is State.GAVE_UP and "rollback failed: disk full under /ckpt/.guardian-pinned" in (iv.note or "")
    assert not any(c.startswith(("quarantine", "launch")) for c in world.calls)


def test_a_relapse_after_a_restore_rolls_back_to_an_older_pin_and_the_abandoned_pins_go_aside(world: World) -> None:
    world.save(10, 20, 30)
    world.retention_deletes(10, 20, 30, pinned=True)
    world.incident()
    world.tick()
    world.clock.now += 10_000  # no new step before the deadline: relapsed
    world.tick()
    world.tick()
    first, second = world.interventions()
    assert (first.state, first.target_step, second.target_step) == (State.RELAPSED, 30, 20)
    assert world.calls.count("restore 20 from its pin") == 1 and world.calls.count("restore 30 from its pin") == 1
    assert world.pinned == {10, 20}, "the pin of 30 went aside with the branch abandoned a second time"


def test_a_guardian_killed_before_the_restore_restores_once_after_its_restart(world: World) -> None:
    world.kill_after = "STOPPED+target"
    world.save(10, 20, 30)
    world.retention_deletes(30, pinned=True)
    world.incident()
    with pytest.raises(GuardianKilled):
        world.tick()
    world.restarted()
    world.tick()
    assert world.interventions()[0].state is State.RESUMING
    assert world.calls.count("restore 30 from its pin") == 1


def test_advice_to_roll_back_to_an_emptied_checkpoint_says_how_to_restore_its_pin_first(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.config = world.config.model_copy(update={"mode": "advise"})
    world.new_guardian()
    world.save(10, 20, 30)
    world.retention_deletes(30, pinned=True)
    world.incident()
    with caplog.at_level("WARNING", logger="guardian"):
        world.tick()
    (advice,) = [r.getMessage() for r in caplog.records if "event=advice" in r.getMessage()]
    assert "restore its pin first (mv /ckpt/global_step_30 /ckpt/global_step_30.emptied && cp -al " in advice
    assert "/ckpt/.guardian-pinned/global_step_30 /ckpt/global_step_30), then roll back to step 30" in advice
    assert world.calls == [], "advise mode restores nothing itself"


# -- a setup failure: the trainer the user's command launched ended badly before its first training step -------------
@pytest.mark.parametrize("logged", [(), (0,)], ids=["no line", "only step 0's validation line"])
def test_a_trainer_that_fails_before_its_first_step_ends_the_run_as_a_setup_failure_never_relaunched(
    world: World, logged: tuple[int, ...], caplog: pytest.LogCaptureFixture
) -> None:
    world.trainer.tail = "Traceback ...\nModuleNotFoundError: No module named 'flash_attn'"
    stdout = world.home / "attempt-1" / "stdout.log"  # the attempt's whole output, beside the tail kept
    stdout.parent.mkdir(parents=True)
    stdout.write_text(world.trainer.tail)
    world.save(10)  # a checkpoint of an earlier run in the same folder: still no reason to relaunch
    world.logs(*logged)
    world.exit_status = ExitStatus(1, None)
    with caplog.at_level("INFO", logger="guardian"):
        assert world.tick() == EXIT_USAGE
    assert world.interventions() == [] and world.calls == ["finish exit code 1"], "stopped what it left; no relaunch"
    (incident,) = world.store.list_incidents(RUN)
    assert incident.check == SETUP_FAILURE and incident.is_open
    assert incident.message == (
        "trainer ended before its first training step: exit code 1: ModuleNotFoundError: No module named 'flash_attn'"
    )
    assert "Traceback" in str(incident.evidence["stdout_tail"])
    assert world.store.get_run(RUN).status is RunStatus.FINISHED  # type: ignore[union-attr]
    (line,) = [r.getMessage() for r in caplog.records if "event=setup_failed" in r.getMessage()]
    assert f"run={RUN} attempt=1 exit=" in line and "exit code 1" in line
    assert 'output="guardian incidents show 1"' in line and f"log={stdout}" in line
    world.restarted()  # a guardian started again on the ended run says the same, and records nothing twice
    world.calls.clear()
    assert world.tick() == EXIT_USAGE and world.calls == ["finish exit code 1"]
    assert len(world.store.list_incidents(RUN)) == 1


def test_a_trainer_the_guardian_stopped_itself_before_a_training_step_is_no_setup_failure(world: World) -> None:
    world.logs(0)  # its validation line at step 0 was already collapsing; the store was down: the guardian stopped it
    world.stopped_in_outage, world.exit_status = True, ExitStatus(None, 2)
    world.incident(step=0, onset=0)  # the store is back: the replayed findings open the incident
    assert world.tick() is None
    assert [i.check for i in world.store.list_incidents(RUN)] == ["entropy_collapse"]
    assert world.interventions()[0].state is State.RESUMING


def test_a_crash_after_a_training_step_is_no_setup_failure(world: World) -> None:
    world.logs(0, 1)
    world.exit_status = ExitStatus(1, None)
    world.tick()
    (crash,) = world.store.list_incidents(RUN)
    assert crash.check == "crash" and world.interventions()[0].kind is Kind.RESTART


def test_a_relaunch_that_fails_before_its_first_step_relapses_as_before_never_a_setup_failure(
    world: World,
) -> None:
    resumed(world)
    world.logs(30)  # the resumed trainer's validation line at its checkpoint's step, then it dies
    world.exit_status = ExitStatus(1, None)
    assert world.tick() is None
    assert world.interventions()[0].state is State.RELAPSED
    assert world.tick() is None, "the rescue goes on (within its budgets): the relaunch was the rescue's choice"
    assert len(world.interventions()) == 2 and world.calls[-1].startswith("launch attempt 3")
    assert not any(i.check == SETUP_FAILURE for i in world.store.list_incidents(RUN))
