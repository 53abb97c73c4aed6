"""``guardian run`` end to end on the demo trainer (real processes, real files, real GRPO on CPU):
a collapse is stopped, rolled back to the last healthy checkpoint, patched and resumed, and the
guardian can be killed with SIGKILL at every state of the intervention and still finish it once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import orjson
import pytest
from collapse_run import ENTROPY_KEY, collapse_command, config_for

from guardian.checkpoints.pinning import PIN_DIR, pinned_steps
from guardian.checkpoints.quarantine import QUARANTINE_DIR
from guardian.checkpoints.scan import resumable, scan_checkpoints
from guardian.commands.run import RunRequest, run_guarded
from guardian.rescue.policy import State
from guardian.store import Store

pytestmark = pytest.mark.slow


def saved_steps(home: Path) -> set[int]:
    """Every checkpoint step any attempt said it saved."""
    saved: set[int] = set()
    for log in home.glob("runs/*/attempt-*/stdout.log"):
        saved.update(int(m) for m in re.findall(r"Saving checkpoint to .*global_step_(\d+)", log.read_text()))
    return saved


def surviving_steps(ckpt: Path) -> set[int]:
    present = {c.step for c in scan_checkpoints(ckpt)}
    quarantined = {
        int(m.group(1)) for p in ckpt.glob(".guardian-quarantine/*/*") if (m := re.match(r"global_step_(\d+)", p.name))
    }
    return present | quarantined


def test_collapse_is_rolled_back_patched_resumed_and_resolved(tmp_path: Path) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    code = run_guarded(config, RunRequest(tuple(collapse_command(ckpt)), tmp_path, "collapse"))
    assert code == 0
    with Store.open(config.database_url()) as store:
        (intervention,) = [i for i in store.interventions("collapse") if i.state != State.RELAPSED]
        assert intervention.state == State.RESOLVED
        store_events = store.intervention_events(intervention.id)
        states = [e.state for e in store_events]
        assert [s for s in states if s != "STOPPED"] == [
            "DETECTED",
            "STOPPING",
            "ROLLED_BACK",
            "PATCHED",
            "RESUMING",
            "PROBATION",
            "RESOLVED",
        ]
        incident = store.get_incident(intervention.incident_id)
        assert incident is not None and incident.incident.check in ("entropy_collapse", "egr_collapse")
        assert incident.incident.status == "resolved"
        target = intervention.target_step
        assert target is not None and incident.incident.onset_step is not None
        assert target <= incident.incident.onset_step
        attempts = store.attempts("collapse")
    # the relaunch: the cause undone (a bonus instead of a penalty), LR and optimizer state kept, resumed
    # from the target
    argv = json.loads((home / "runs/collapse/attempt-2/command.json").read_text())["argv"]
    assert f"trainer.resume_from_path={ckpt}/global_step_{target}" in argv
    assert float(next(a for a in argv if a.startswith(f"{ENTROPY_KEY}=")).split("=")[1]) > 0
    assert not any("load_contents" in a for a in argv)
    lines = [orjson.loads(line) for line in (home / "runs/collapse/attempt-2/metrics.jsonl").read_bytes().splitlines()]
    assert lines[0]["step"] == target  # validation before training at the resume step, like verl
    first_trained = next(line for line in lines if "actor/lr" in line["data"])
    assert first_trained["step"] == target + 1 and first_trained["data"]["actor/lr"] == 2e-5
    # the probation proved it: the reward back to (at least) its level at the rollback point
    resolved = store_events[-1].detail["outcome"]
    assert resolved["reward"]["recovered"]
    assert resolved["signal_healthy"] or resolved["signal_vs_abandoned"]["at_least_as_good"]
    # never deleted: every checkpoint any attempt saved is present or in quarantine
    assert saved_steps(home) <= surviving_steps(ckpt)
    assert len(attempts) >= 2
    # the evidence is kept: each attempt dumped its rollouts into its own folder, so the abandoned branch's
    # dumps behind the decision are still there next to the resumed branch's
    first, second = (home / "runs/collapse/attempt-1/rollouts"), (home / "runs/collapse/attempt-2/rollouts")
    detected = incident.incident.opened_step
    assert detected is not None and (first / f"{detected}.jsonl").is_file()
    assert min(int(p.stem) for p in second.glob("*.jsonl")) == target + 1


def test_a_rollback_target_that_verls_retention_deleted_is_restored_from_its_pin(tmp_path: Path) -> None:
    """``trainer.max_actor_ckpt_to_keep=2`` (verl deletes all but its two newest saves' actor/) and the demo's slow
    collapse: by the detection every checkpoint before the onset has lost its actor/, so without pins there is
    nothing healthy to roll back to. The guardian pinned them while they were healthy around their steps; the
    rollback restores the target from its pin, the abandoned branch's pins go to quarantine, and it resolves."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home)
    command = (*collapse_command(ckpt), "trainer.max_actor_ckpt_to_keep=2")
    assert run_guarded(config, RunRequest(command, tmp_path, "retention")) == 0
    with Store.open(config.database_url()) as store:
        (iv,) = store.interventions("retention")
        assert iv.state == State.RESOLVED and iv.target_step is not None
        target = iv.target_step
        rolled_back = next(e for e in store.intervention_events(iv.id) if e.state == State.ROLLED_BACK)
        pins = store.pins("retention")
        live = store.pins("retention", live=True)
    # verl's retention (the demo trainer's, as verl's) deleted the target's actor/ before the rollback
    removed = (home / "runs/retention/attempt-1/stdout.log").read_text()
    assert f"remove previous save local path: {ckpt}/global_step_{target}/actor" in removed
    assert rolled_back.detail["restored_from"] == str(ckpt / PIN_DIR / f"global_step_{target}")
    assert rolled_back.detail["restore_mode"] == "link"
    emptied = ckpt / QUARANTINE_DIR / "before-restore" / f"global_step_{target}"
    assert (emptied / "data.pt").is_file() and not (emptied / "actor").exists(), "what verl left is kept"
    # resumed from the restored folder: verl's resume_path, the validation line at the target, training after it
    argv = json.loads((home / "runs/retention/attempt-2/command.json").read_text())["argv"]
    assert f"trainer.resume_from_path={ckpt}/global_step_{target}" in argv
    first = orjson.loads((home / "runs/retention/attempt-2/metrics.jsonl").read_bytes().splitlines()[0])
    assert first["step"] == target and resumable(ckpt / f"global_step_{target}")
    # pins: hard links (no bytes added), at most pin_keep live at the end, the older ones released
    assert pins and all(p.mode == "link" and p.bytes_added == 0 for p in pins)
    assert 0 < len(live) <= config.checkpoints.pin_keep and any(not p.live for p in pins)
    assert sorted(pinned_steps(ckpt)) == sorted(p.step for p in live)
    assert saved_steps(home) <= surviving_steps(ckpt)


def scripted_command(ckpt: Path, steps: int, *extra: str) -> list[str]:
    """tests/scripted_trainer.py with a wrong-signed entropy bonus: it learns for 15 steps, then collapses."""
    script = Path(__file__).parents[1] / "scripted_trainer.py"
    base = [f"trainer.default_local_dir={ckpt}", f"trainer.total_training_steps={steps}", "trainer.save_freq=5"]
    return [sys.executable, str(script), *base, f"{ENTROPY_KEY}=-0.1", *extra]


@pytest.mark.parametrize(("fixed_reward", "state", "exit_code"), [(0.6, State.RESOLVED, 0), (0.4, State.UNRESOLVED, 3)])
def test_probation_resolves_only_a_fix_whose_reward_comes_back(
    tmp_path: Path, fixed_reward: float, state: State, exit_code: int
) -> None:
    """A scripted trainer collapses, then - patched - holds its entropy and scores ``fixed_reward``: above
    the rollback point's level the fix is proven; below it the probation cannot prove it, and the run ends
    UNRESOLVED (the trainer ran on with the patch, a person must look, exit 3) instead of RESOLVED."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    command = scripted_command(ckpt, 60, f"+script.fixed_reward={fixed_reward}")
    config = config_for(home)
    assert run_guarded(config, RunRequest(tuple(command), tmp_path, "scripted")) == exit_code
    with Store.open(config.database_url()) as store:
        (intervention,) = store.interventions("scripted")
        assert intervention.state == state and intervention.target_step == 15
        outcome = store.intervention_events(intervention.id)[-1].detail["outcome"]
        assert outcome["signal_healthy"] and outcome["reward"]["at_rollback"] == pytest.approx(0.46, abs=0.02)
        assert outcome["reward"]["now"] == pytest.approx(fixed_reward, abs=0.02)
        incident = store.get_incident(intervention.incident_id)
        assert incident is not None and incident.incident.status == state.value.lower()
        assert len(store.attempts("scripted")) == 2, "the patched trainer ran on to the end"


def test_nothing_of_the_run_outlives_it_not_even_a_detached_child_of_the_resumed_attempt(tmp_path: Path) -> None:
    """Each attempt starts a child in its own session (it leaves the trainer's process group). The rescue's stop
    finds attempt 1's by the trainer marker; attempt 2 ends by itself and its child is stopped at the run's end."""
    home, ckpt, pids = tmp_path / "home", tmp_path / "ckpt", tmp_path / "children.txt"
    command = scripted_command(ckpt, 50, "+script.fixed_reward=0.6", f"+script.detached_child={pids}")
    try:
        assert run_guarded(config_for(home), RunRequest(tuple(command), tmp_path, "detached")) == 0
        children = [int(line) for line in pids.read_text().split()]
        assert len(children) == 2  # one per attempt
        assert not [pid for pid in children if _alive(pid)], "a detached child outlived the run"
        assert "event=strays_after_exit" in (home / "runs" / "detached" / "guardian.log").read_text()
    finally:  # never leave one behind, whatever failed
        for pid in [int(line) for line in pids.read_text().split()] if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_observe_mode_names_a_detached_child_left_at_the_run_end_and_touches_nothing(tmp_path: Path) -> None:
    home, ckpt, pids = tmp_path / "home", tmp_path / "ckpt", tmp_path / "children.txt"
    command = scripted_command(ckpt, 30, f"+script.detached_child={pids}")
    config = config_for(home).model_copy(update={"mode": "observe"})
    try:
        assert run_guarded(config, RunRequest(tuple(command), tmp_path, "observed")) == 3  # it collapsed
        (child,) = [int(line) for line in pids.read_text().split()]
        assert _alive(child), "observe mode stopped a process"
        assert not (ckpt / PIN_DIR).exists(), "observe mode pins nothing: it changes nothing on disk"
        log = (home / "runs" / "observed" / "guardian.log").read_text()
        assert f"event=strays_after_exit run=observed attempt=1 pids={child}" in log and "fix=" in log
    finally:
        for pid in [int(line) for line in pids.read_text().split()] if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a stopped child of another process may linger unreaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


CHAOS_POINTS = [
    "DETECTED", "STOPPING", "STOPPED", "STOPPED+target", "ROLLED_BACK", "PATCHED", "RESUMING", "PROBATION", "RESOLVED"
]  # fmt: skip


@pytest.mark.parametrize("die_after", CHAOS_POINTS)
def test_guardian_killed_at_every_state_finishes_the_intervention_once(tmp_path: Path, die_after: str) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    (tmp_path / "guardian.yaml").write_text(
        "sources: {poll_interval_s: 0.05}\n"
        "intervention: {probation_steps: 15, stop_sigint_s: 5, stop_sigterm_s: 5, stop_sigkill_s: 5}\n"
    )
    command = [
        sys.executable,
        "-m",
        "guardian",
        "--log-level",
        "WARNING",
        "run",
        "--config",
        "guardian.yaml",
        "--no-live",
        "--",
        *collapse_command(ckpt),
    ]
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    first = subprocess.run(
        command, cwd=tmp_path, env={**env, "GUARDIAN_TEST_DIE_AFTER": die_after}, capture_output=True, timeout=120
    )
    assert first.returncode == -9, first.stderr.decode()[-3000:]  # SIGKILLed right after committing the state
    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=180)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    assert b"run_attached" in second.stderr
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        (run,) = store.list_runs()
        interventions = store.interventions(run.id)
        resolved = [i for i in interventions if i.state == State.RESOLVED]
        assert len(resolved) >= 1
        for iv in interventions:
            states = [e.state for e in store.intervention_events(iv.id)]
            for state in ("STOPPING", "ROLLED_BACK", "PATCHED", "RESUMING"):
                assert states.count(state) <= 1, f"{state} committed twice: {states}"
        attempts = store.attempts(run.id)
    # never two trainers at once: each attempt started after the previous one ended
    runs = []
    for attempt in attempts:
        folder = home / "runs" / run.id / f"attempt-{attempt.number}"
        start = json.loads((folder / "exit.json.pid").read_text())["started_at"]
        end = json.loads((folder / "exit.json").read_text())["ended_at"]
        runs.append((start, end))
    for (_, ended), (started, _) in pairwise(runs):
        assert started >= ended
    assert len(attempts) == len(interventions) + 1  # exactly one relaunch per intervention
    assert saved_steps(home) <= surviving_steps(ckpt)


def test_demo_tells_the_whole_story(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's main job: `guardian demo` on embedded defaults ends resolved, within the time budget."""
    monkeypatch.setenv("GUARDIAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "--log-level", "ERROR", "demo", "--json"],
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert time.monotonic() - started < 120
    document = json.loads(done.stdout)
    resolved = [i for i in document["incidents"] if i["status"] == "resolved"]
    assert resolved, document["incidents"]
    events = [e["state"] for iv in resolved[0]["interventions"] for e in iv["events"]]
    assert events[-1] == "RESOLVED" and "ROLLED_BACK" in events and "PATCHED" in events


def test_advise_mode_says_what_it_would_do_and_does_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    config = config_for(home).model_copy(update={"mode": "advise"})
    command = [a for a in collapse_command(ckpt) if not a.startswith("trainer.total_training_steps")]
    command.append("trainer.total_training_steps=70")
    with caplog.at_level("WARNING", logger="guardian"):
        code = run_guarded(config, RunRequest(tuple(command), tmp_path, "advise"))
    assert code == 3  # the run ended unhealthy; nothing was done about it
    with Store.open(config.database_url()) as store:
        assert store.interventions("advise") == []
        assert len(store.attempts("advise")) == 1
    advice = [r.getMessage() for r in caplog.records if "event=advice" in r.getMessage()]
    assert advice and "roll back to step" in advice[0] and "entropy_coeff=0.003" in advice[0]


def test_dry_run_prints_the_prepared_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_for(tmp_path / "home")
    code = run_guarded(config, RunRequest(tuple(collapse_command(tmp_path / "ckpt")), tmp_path, "dry", dry_run=True))
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    argv = document["argv"]
    assert "trainer.logger=[console,wandb,file]" in argv
    assert any(a.startswith("++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=") for a in argv)
    assert document["env"]["VERL_FILE_LOGGER_PATH"].endswith("attempt-1/metrics.jsonl")
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").rglob("stdout.log"))
