"""Rollout dump retention (issue 25, item 6): the pure plan keeps what the judgment needs and removes the oldest rest
down to the cap; the removal touches only the guardian's own dump files."""

from __future__ import annotations

from pathlib import Path

from guardian.actions.dump_pruning import remove_dumps, scan_dumps
from guardian.actions.dump_retention import Abandoned, DumpFile, Retention, plan_pruning
from guardian.actions.launcher import RunFolder
from guardian.config import GuardianConfig
from guardian.core import Finding, Severity
from guardian.incidents.health import StepHealth
from guardian.rescue.pruner import DumpPruner, trouble_ranges

MB = 1 << 20


def dumps(steps: range, *, attempt: int = 1, size: int = MB, **kind: bool) -> list[DumpFile]:
    return [DumpFile(Path(f"a{attempt}/{s}.jsonl"), s, size, attempt, **kind) for s in steps]


def policy(keep_bytes: int, *, recent: int = 10, around: int = 5, first: int = 0) -> Retention:
    return Retention(keep_bytes, keep_recent_steps=recent, keep_around_incident_steps=around, keep_first_steps=first)


def steps_of(files: tuple[DumpFile, ...]) -> list[int]:
    return [f.step for f in files]


def test_oldest_removed_first_down_to_the_cap() -> None:
    plan = plan_pruning(dumps(range(1, 101)), newest_step=100, incidents=[], abandoned=[], policy=policy(60 * MB))
    assert steps_of(plan.remove) == list(range(1, 41))
    assert (plan.kept_files, plan.kept_bytes, plan.over_cap) == (60, 60 * MB, False)


def test_under_the_cap_nothing_is_removed() -> None:
    plan = plan_pruning(dumps(range(1, 51)), newest_step=50, incidents=[], abandoned=[], policy=policy(50 * MB))
    assert plan.remove == () and plan.kept_files == 50


def test_the_recent_window_is_kept_even_over_the_cap() -> None:
    plan = plan_pruning(dumps(range(1, 101)), newest_step=100, incidents=[], abandoned=[], policy=policy(0, recent=30))
    assert steps_of(plan.remove) == list(range(1, 71))
    assert plan.over_cap and plan.kept_bytes == 30 * MB


def test_the_newest_logged_step_sets_the_window_when_dumps_lag() -> None:
    plan = plan_pruning(dumps(range(1, 101)), newest_step=120, incidents=[], abandoned=[], policy=policy(0, recent=30))
    assert steps_of(plan.remove) == list(range(1, 91))


def test_the_steps_around_every_incident_are_kept() -> None:
    plan = plan_pruning(
        dumps(range(1, 101)), newest_step=100, incidents=[(30, 34), (50, 50)], abandoned=[], policy=policy(0)
    )
    kept = set(range(1, 101)) - set(steps_of(plan.remove))
    assert kept == set(range(25, 40)) | set(range(45, 56)) | set(range(91, 101))


def test_quarantined_dumps_and_abandoned_branches_are_kept() -> None:
    files = (
        dumps(range(1, 61))  # attempt 1: steps 41-60 abandoned by a rollback to 40
        + dumps(range(41, 101), attempt=2)
        + [DumpFile(Path("a2/.guardian-quarantine/incident-1/7.jsonl"), 7, MB, 2, quarantined=True)]
    )
    plan = plan_pruning(files, newest_step=100, incidents=[], abandoned=[Abandoned(1, 40)], policy=policy(0))
    removed = {(f.attempt, f.step) for f in plan.remove}
    assert removed == {(1, s) for s in range(1, 41)} | {(2, s) for s in range(41, 91)}
    assert all(not f.quarantined for f in plan.remove)


def test_a_restart_from_scratch_abandons_the_whole_attempt() -> None:
    files = dumps(range(1, 21)) + dumps(range(1, 101), attempt=2)
    plan = plan_pruning(files, newest_step=100, incidents=[], abandoned=[Abandoned(1, -1)], policy=policy(0))
    assert {f.attempt for f in plan.remove} == {2}


def test_each_attempts_first_steps_are_kept_for_the_baseline() -> None:
    files = dumps(range(1, 41)) + dumps(range(21, 101), attempt=2)
    plan = plan_pruning(files, newest_step=100, incidents=[], abandoned=[], policy=policy(0, first=3))
    kept = {(f.attempt, f.step) for f in files} - {(f.attempt, f.step) for f in plan.remove}
    assert kept == {(1, 1), (1, 2), (1, 3), (2, 21), (2, 22), (2, 23)} | {(2, s) for s in range(91, 101)}


def test_a_users_dump_folder_is_never_removed_nor_counted() -> None:
    users = dumps(range(1, 101), attempt=1, owned=False)
    plan = plan_pruning(users, newest_step=100, incidents=[], abandoned=[], policy=policy(0))
    assert plan.remove == () and plan.kept_files == 0 and not plan.over_cap


def test_removal_takes_only_the_planned_dumps_of_the_guardians_folders(tmp_path: Path) -> None:
    own, users = tmp_path / "attempt-1" / "rollouts", tmp_path / "users"
    quarantine = own / ".guardian-quarantine" / "incident-1"
    for folder in (own, users, quarantine):
        folder.mkdir(parents=True)
        for step in (1, 2, 3):
            (folder / f"{step}.jsonl").write_text('{"score": 1}\n' * step)
    (own / "4.jsonl").symlink_to(users / "3.jsonl")
    found = scan_dumps({1: own})
    assert sorted((f.quarantined, f.step) for f in found) == [(q, s) for q in (False, True) for s in (1, 2, 3)]
    wanted = [f for f in found if f.step < 3] + [DumpFile(users / "1.jsonl", 1, 13, None)]
    done = remove_dumps(wanted, [own])
    assert done.files == 1 + 1 and done.bytes == 13 + 26
    assert sorted(p.name for p in own.iterdir()) == [".guardian-quarantine", "3.jsonl", "4.jsonl"]
    assert len(list(quarantine.iterdir())) == 3 and len(list(users.iterdir())) == 3
    assert len(done.failed) == 3  # two quarantined, one in the user's folder: each named, left alone


def test_a_run_whose_command_names_its_dump_folder_is_never_pruned(tmp_path: Path) -> None:
    config = GuardianConfig.model_validate({"home": str(tmp_path)})
    assert DumpPruner.of(config, "r", RunFolder(tmp_path / "runs/r"), users_dumps=True) is None
    assert DumpPruner.of(config, "r", RunFolder(tmp_path / "runs/r"), users_dumps=False) is not None
    off = GuardianConfig.model_validate({"home": str(tmp_path), "rollouts": {"keep_gib": None}})
    assert DumpPruner.of(off, "r", RunFolder(tmp_path / "runs/r"), users_dumps=False) is None


def test_warning_stretches_and_standing_findings_onsets_are_kept() -> None:
    health = StepHealth()
    for step in range(1, 101):
        severity = Severity.WARN if step in (40, 41, 44, 70) else Severity.OK
        health.note(step, [Finding("c", severity, step, "")])
    standing = [
        Finding("entropy", Severity.CRITICAL, 100, "", onset_step=85),
        Finding("reward", Severity.WARN, 100, "converged", onset_step=10, advice=True),
    ]
    assert trouble_ranges(health, standing, gap=3) == [(40, 44), (70, 70), (85, 100)]


def test_the_pass_is_due_every_few_steps_and_after_a_resume(tmp_path: Path) -> None:
    pruner = DumpPruner(policy(0), 10, "r", RunFolder(tmp_path))
    assert pruner.due(5) and not pruner.due(None)
    pruner._pruned_at = 50
    assert not pruner.due(59) and pruner.due(60) and pruner.due(40)
