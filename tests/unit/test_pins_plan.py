"""Which checkpoints to pin and release (guardian/checkpoints/pin_plan.py, pure), and the per-step health it reads
(guardian/incidents/health.py): healthy around the step, never while an incident is open, the newest K kept."""

from __future__ import annotations

from collections.abc import Iterable

from guardian.checkpoints.pin_plan import PinPlan, healthy_around, plan_pins
from guardian.core import Finding, Severity
from guardian.incidents.health import StepHealth
from guardian.states import Verdict

H, U = Verdict.HEALTHY, Verdict.UNHEALTHY


def health(last: int, *, warn: Iterable[int] = (), critical: Iterable[int] = ()) -> StepHealth:
    """Steps 1..last judged; warnings and critical findings at the steps given."""
    noted = StepHealth()
    warns, criticals = set(warn), set(critical)
    for step in range(1, last + 1):
        severity = Severity.CRITICAL if step in criticals else Severity.WARN if step in warns else Severity.OK
        noted.note(step, [Finding("entropy_collapse", severity, step, "x"), Finding("kl_drift", Severity.OK, step, "")])
    return noted


def plan(
    verdicts: dict[int, Verdict],
    noted: StepHealth,
    last: int,
    *,
    pinned: Iterable[int] = (),
    resumable: Iterable[int] | None = None,
    keep: int = 3,
    window: int = 5,
    incident_open: bool = False,
    skip: Iterable[int] = (),
) -> PinPlan:
    return plan_pins(
        verdicts=verdicts,
        resumable=set(verdicts) if resumable is None else set(resumable),
        pinned=set(pinned),
        health=noted,
        last_step=last,
        window=window,
        keep=keep,
        incident_open=incident_open,
        skip=set(skip),
    )


def test_a_checkpoint_is_pinned_once_the_window_after_it_is_judged_healthy() -> None:
    verdicts = {10: H, 20: H}
    assert plan(verdicts, health(24), 24) == PinPlan((10,), ()), "20 waits for step 25"
    assert plan(verdicts, health(25), 25) == PinPlan((20, 10), ())


def test_a_warning_within_the_window_before_or_after_blocks_the_pin_one_step_further_does_not() -> None:
    verdicts = {20: H}
    assert plan(verdicts, health(30, warn=[15]), 30).pin == ()
    assert plan(verdicts, health(30, warn=[25]), 30).pin == ()
    assert plan(verdicts, health(30, critical=[20]), 30).pin == ()
    assert plan(verdicts, health(30, warn=[14, 26]), 30).pin == (20,)
    assert plan(verdicts, health(30, warn=[14, 26]), 30, window=6).pin == ()


def test_nothing_is_pinned_or_released_while_an_incident_is_open() -> None:
    verdicts = {10: H, 20: H, 30: H, 40: H, 50: H}
    got = plan(verdicts, health(60), 60, pinned=[10, 20, 30], incident_open=True)
    assert got == PinPlan((), ()), "the rollback may need every pin"


def test_only_healthy_resumable_checkpoints_are_pinned() -> None:
    verdicts = {10: H, 20: U, 30: Verdict.UNKNOWN, 40: H}
    assert plan(verdicts, health(60), 60, resumable=[10, 20, 30]).pin == (10,), "40's actor/ is gone"


def test_the_newest_k_are_pinned_and_older_pins_released_once_k_newer_healthy_pins_exist() -> None:
    verdicts = {step: H for step in (10, 20, 30, 40, 50)}
    assert plan(verdicts, health(60), 60, keep=3) == PinPlan((50, 40, 30), ())
    got = plan(verdicts, health(60), 60, pinned=[10, 20, 30], keep=3)
    assert got == PinPlan((50, 40), (10, 20))


def test_an_unhealthy_pin_does_not_count_as_a_newer_healthy_one() -> None:
    """30 was pinned, then an incident dated its onset before it: it keeps 10 and 20 from being released, and goes
    itself once three newer healthy pins exist."""
    verdicts = {10: H, 20: H, 30: U, 40: H}
    assert plan(verdicts, health(60), 60, pinned=[10, 20, 30]) == PinPlan((40,), ())
    verdicts |= {50: H, 60: H}
    got = plan(verdicts, health(70), 70, pinned=[10, 20, 30, 40])
    assert got == PinPlan((60, 50), (10, 20, 30))


def test_steps_that_failed_are_not_tried_again() -> None:
    verdicts = {10: H, 20: H}
    assert plan(verdicts, health(30), 30, skip=[20]).pin == (10,)
    assert plan(verdicts, health(30), 30, pinned=[10], keep=1, skip=[10]).release == ()


def test_pin_keep_zero_pins_nothing() -> None:
    assert plan({10: H}, health(30), 30, keep=0) == PinPlan()


def test_health_forgets_an_abandoned_branch_when_the_timeline_resumes_earlier() -> None:
    noted = health(40, critical=range(31, 41))
    assert noted.worst_between(25, 35) is Severity.CRITICAL
    noted.note(30, [Finding("entropy_collapse", Severity.OK, 30, "")])  # resumed from the checkpoint at 30
    assert noted.worst_between(25, 40) is Severity.OK and max(noted.worst) == 30
    assert healthy_around(20, noted, 30, 5) and not healthy_around(30, noted, 30, 5), "31..35 not judged yet"


def test_the_worst_judgement_of_a_step_stands() -> None:
    """A step is judged when its line arrives and again when its rollout dump does: the worse one counts."""
    noted = StepHealth()
    noted.note(7, [Finding("egr_collapse", Severity.WARN, 7, "")])
    noted.note(7, [Finding("egr_collapse", Severity.OK, 7, "")])
    assert noted.worst[7] is Severity.WARN
