"""``guardian run -- bash train.sh …``: a launch script like verl's ``run_*.sh`` (variables, then the trainer with its
own overrides and ``"$@"``). The guardian appends its arguments after the user's, exports its variables, guards and
rolls the run back through the script; a script that drops ``"$@"`` is named by one error line at the first step."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.actions.patch import UNKNOWN, RunFiles, plan_patch
from guardian.commands.run import RunRequest, run_guarded
from guardian.config import GuardianConfig
from guardian.ladder import LR, Rung
from guardian.overrides import parse_command
from guardian.sources.forwarding import Dropped, dropped_arguments, dropped_fields
from guardian.sources.printed_config import printed_config, read_printed_config
from guardian.states import State
from guardian.store import Store
from guardian.verl_keys import PatchError

ENT = "actor_rollout_ref.actor.entropy_coeff"
TEMP = "actor_rollout_ref.rollout.temperature"
CLIP_HIGH = "actor_rollout_ref.actor.clip_ratio_high"
SCRIPTED = Path(__file__).parents[1] / "scripted_trainer.py"


def write_script(folder: Path, trainer: str, *, forwards: bool) -> Path:
    """A run_*.sh as verl's examples write it: ``set -x``, exported variables, the trainer with its own overrides."""
    script, tail = folder / "train.sh", ' "$@"' if forwards else ""
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\nexport NCCL_DEBUG=WARN VLLM_USE_V1=1 HF_HUB_OFFLINE=1\n"
        f"{trainer}{tail}\n"
    )
    return script


def config_for(home: Path, **sources: float) -> GuardianConfig:
    return GuardianConfig.model_validate(
        {
            "home": str(home),
            "sources": {"poll_interval_s": 0.05, **sources},
            "intervention": {"probation_steps": 15, "stop_sigint_s": 5, "stop_sigterm_s": 5, "stop_sigkill_s": 5},
        }
    )


def guardian_log(home: Path, run_id: str) -> str:
    return (home / "runs" / run_id / "guardian.log").read_text()


# -- reading a script launch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "entry"),
    [
        (["bash", "train.sh", "a.b=1"], "train.sh"),
        (["bash", "-x", "examples/run_qwen.sh", "a.b=1"], "examples/run_qwen.sh"),
        (["./run_qwen2-7b.sh", "a.b=1"], "./run_qwen2-7b.sh"),
        (["/bin/sh", "launch", "a.b=1"], "launch"),
        (["bash", "--", "train.sh", "a.b=1"], "train.sh"),
    ],
)
def test_a_launch_script_is_read_with_the_arguments_after_it(argv: list[str], entry: str) -> None:
    cmd = parse_command(argv)
    assert cmd.script and cmd.entry == entry and not cmd.is_verl
    assert cmd.override_texts() == ["a.b=1"]


def test_a_python_launch_with_a_variable_naming_a_script_is_not_a_script_launch() -> None:
    cmd = parse_command(["env", "HOOK=/x/setup.sh", "python3", "-m", "verl.trainer.main_ppo", "a.b=1"])
    assert not cmd.script and cmd.is_verl and cmd.override_texts() == ["a.b=1"]


def test_an_inline_shell_command_is_refused_saying_what_to_write_instead() -> None:
    with pytest.raises(PatchError, match=r'script whose python command ends in "\$@"'):
        parse_command(["bash", "-c", "python3 -m verl.trainer.main_ppo a=1"])


def test_a_script_run_must_say_where_its_checkpoints_and_loggers_are(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "m.jsonl", tmp_path / "r", tmp_path)
    with pytest.raises(PatchError, match=r"trainer\.logger is not among the arguments after train\.sh.*plus file"):
        files.prepare(["bash", "train.sh", f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(PatchError, match=r"trainer\.default_local_dir is not among the arguments after train\.sh"):
        files.prepare(["bash", "train.sh", "trainer.logger=[console,file]"])


def test_a_patch_of_a_script_run_sets_what_it_can_and_refuses_what_needs_an_unknown_value(tmp_path: Path) -> None:
    """The script may set the LR itself: halving it needs the value, so the refusal names the key to pass after the
    script; setting the entropy bonus needs none, and the diff says the value before is unknown. Every key goes
    after the script's own arguments as ``++key`` (it wins even after the script's ``~key`` or ``+key``)."""
    files = RunFiles(tmp_path / "m.jsonl", tmp_path / "r", tmp_path)
    command = ["bash", "train.sh", "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}"]
    halve = Rung.model_validate({"name": "lr", "why": "x", "changes": [{"key": LR, "multiply": 0.5}]})
    with pytest.raises(PatchError, match=rf"current {LR} is unknown.*pass {LR}=VALUE after the script"):
        plan_patch(command, halve, resume_from=None, run_files=files)
    bonus = Rung.model_validate({"name": "ent", "why": "x", "changes": [{"key": ENT, "set": 0.001}]})
    plan = plan_patch(command, bonus, resume_from=str(tmp_path / "global_step_5"), run_files=files)
    assert (ENT, UNKNOWN, 0.001) in plan.diff
    assert plan.argv[:2] == ("bash", "train.sh")
    assert f"++{ENT}=0.001" in plan.argv and "++trainer.resume_mode=resume_path" in plan.argv
    assert any("launch script" in note for note in plan.notes)


def test_the_config_verl_printed_is_read_from_its_stdout_with_ray_prefixes_and_colours() -> None:
    """Real verl 0.9.1 output: the TaskRunner's pprint of its resolved config, each line behind its actor prefix."""
    log = fixture_path("verl-0.9.1-run", "harness", "collapse", "runs", "gpu-collapse", "attempt-1", "stdout.log")
    config = read_printed_config(log)
    assert config is not None and config["trainer"]["logger"] == ["console", "file"]
    assert config["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.001
    assert config["actor_rollout_ref"]["rollout"]["temperature"] == 1.0
    # another actor's line inside the print is left out; a dict without a trainer section is not a config
    text = "(TaskRunner pid=7) {'trainer': {'a': 1,\n(WorkerDict pid=8) noise\n(TaskRunner pid=7)  'b': 2}}\n"
    assert printed_config("{'step': 1}\n" + text) == {"trainer": {"a": 1, "b": 2}}
    assert printed_config("no config here\n") is None


def test_a_patch_of_a_script_run_computes_from_the_printed_config(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "m.jsonl", tmp_path / "r", tmp_path, recorded={"actor_rollout_ref": {"actor": {}}})
    command = ["bash", "train.sh", "trainer.logger=[console,file]", f"trainer.default_local_dir={tmp_path}"]
    halve = Rung.model_validate({"name": "lr", "why": "x", "changes": [{"key": LR, "multiply": 0.5}]})
    with pytest.raises(PatchError, match=rf"current {LR} is unknown"):  # not in what the attempt printed either
        plan_patch(command, halve, resume_from=None, run_files=files)
    printed = {"actor_rollout_ref": {"actor": {"optim": {"lr": 2e-6}}}}
    plan = plan_patch(command, halve, resume_from=None, run_files=replace(files, recorded=printed))
    assert (LR, 2e-6, 1e-6) in plan.diff and f"++{LR}=1e-06" in plan.argv


def test_dropped_arguments_is_decided_from_a_console_step_and_an_empty_metrics_file() -> None:
    assert dropped_arguments(console_step_at=10.0, metrics_bytes=0, now=20.0, grace_s=10.0)
    assert not dropped_arguments(console_step_at=10.0, metrics_bytes=0, now=19.0, grace_s=10.0)  # still in grace
    assert not dropped_arguments(console_step_at=10.0, metrics_bytes=120, now=99.0, grace_s=10.0)  # metrics came
    assert not dropped_arguments(console_step_at=None, metrics_bytes=0, now=99.0, grace_s=10.0)  # no step yet


def test_a_python_launch_whose_metrics_do_not_arrive_is_not_blamed_on_a_script(tmp_path: Path) -> None:
    dropped = Dropped(3, tmp_path / "stdout.log", tmp_path / "metrics.jsonl")
    fields = dropped_fields("r1", ["python3", "-m", "verl.trainer.main_ppo", "a.b=1"], dropped)
    assert "another Ray node" in str(fields["message"]) and '"$@"' not in str(fields["fix"])
    fields = dropped_fields("r1", ["bash", "run_qwen.sh", "a.b=1"], dropped)
    assert "run_qwen.sh does not pass on" in str(fields["message"]) and "guardian stop r1" in str(fields["fix"])


# -- guardian run on a script --------------------------------------------------------------------------------------
def test_dry_run_of_a_script_shows_the_appended_arguments_and_the_exported_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path, f'"{sys.executable}" "{SCRIPTED}" trainer.total_training_steps=5', forwards=True)
    command = ("bash", str(script), "trainer.logger=[console,wandb]", f"trainer.default_local_dir={tmp_path}/c")
    config = config_for(tmp_path / "home")
    assert run_guarded(config, RunRequest(command, tmp_path, "dry", dry_run=True)) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["argv"][:2] == ["bash", str(script)]
    metrics = str(tmp_path / "home/runs/dry/attempt-1/metrics.jsonl")
    assert document["appended"] == [
        "++trainer.logger=[console,wandb,file]",
        f"++trainer.rollout_data_dir={tmp_path}/home/runs/dry/attempt-1/rollouts",
        f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics}",
    ]
    assert document["env"] == {"VERL_FILE_LOGGER_PATH": metrics}
    assert '"$@"' in document["script"]["needs"] and document["script"]["path"] == str(script)
    assert not (tmp_path / "home/runs/dry/attempt-1/stdout.log").exists()


@pytest.mark.slow
def test_a_script_that_forwards_its_arguments_is_guarded_rolled_back_and_relaunched_with_the_patches(
    tmp_path: Path,
) -> None:
    """The script sets the run's length, save cadence, the wrong-signed entropy bonus and the other keys the entropy
    rung reads itself, and forwards ``"$@"``; the user passes only the checkpoint dir and loggers. The guardian
    reads the script's values from the config the attempt printed, rolls the collapse back to step 15 through the
    script, and the relaunch carries the resume path and the patch after the script's own arguments."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    own = (
        f"trainer.total_training_steps=60 trainer.save_freq=5 +script.fixed_reward=0.6 {ENT}=-0.1 {TEMP}=0.9 "
        f"{CLIP_HIGH}=0.2"
    )
    script = write_script(tmp_path, f'"{sys.executable}" "{SCRIPTED}" {own}', forwards=True)
    command = ("bash", str(script), "trainer.logger=[console,file]", f"trainer.default_local_dir={ckpt}")
    config = config_for(home)
    assert run_guarded(config, RunRequest(command, tmp_path, "script")) == 0
    with Store.open(config.database_url()) as store:
        (intervention,) = store.interventions("script")
        assert intervention.state == State.RESOLVED and intervention.target_step == 15
        assert len(store.attempts("script")) == 2
        patched = next(e for e in store.intervention_events(intervention.id) if e.state == "PATCHED").detail
    # the script's own values, read from what attempt 1 printed: the diff starts from them
    diff = {c["key"]: (c["before"], c["after"]) for c in patched["diff"]}
    assert diff[ENT] == (-0.1, 0.003) and diff[TEMP] == (0.9, 1.0) and diff[CLIP_HIGH] == (0.2, 0.28)
    assert any("read from the config its last attempt printed" in note for note in patched["notes"])
    first = json.loads((home / "runs/script/attempt-1/command.json").read_text())
    assert first["argv"][:2] == ["bash", str(script)] and first["env"]["VERL_FILE_LOGGER_PATH"].endswith(
        "attempt-1/metrics.jsonl"
    )
    argv = json.loads((home / "runs/script/attempt-2/command.json").read_text())["argv"]
    assert argv[:2] == ["bash", str(script)] and not any("fixed_reward" in a for a in argv)  # the script's own
    assert f"++trainer.resume_from_path={ckpt}/global_step_15" in argv and f"++{ENT}=0.003" in argv
    assert argv.index(f"++{ENT}=0.003") > 3  # after the user's arguments: last, so it wins over the script's own
    assert "event=arguments_not_forwarded" not in guardian_log(home, "script")


@pytest.mark.slow
def test_a_script_that_drops_its_arguments_is_named_by_one_error_at_the_first_step(tmp_path: Path) -> None:
    """The demo trainer (verl's loggers: console always, the file only when asked) run by a script without
    ``"$@"``: its console prints steps while the metrics file the guardian named stays empty."""
    home, ckpt = tmp_path / "home", tmp_path / "ckpt"
    trainer = (
        f'"{sys.executable}" -m guardian.demo.trainer trainer.total_training_steps=40 trainer.total_epochs=1000 '
        f"trainer.default_local_dir={ckpt} +trainer.fault.slow_steps=0.1"
    )
    script = write_script(tmp_path, trainer, forwards=False)
    command = ("bash", str(script), "trainer.logger=[console,file]", f"trainer.default_local_dir={ckpt}")
    run_guarded(config_for(home, forwarding_grace_s=1.0), RunRequest(command, tmp_path, "dropped"))
    stdout = (home / "runs/dropped/attempt-1/stdout.log").read_text()
    assert "step:40 - " in stdout and (home / "runs/dropped/attempt-1/metrics.jsonl").read_bytes() == b""
    (line,) = [line for line in guardian_log(home, "dropped").splitlines() if "event=arguments_not_forwarded" in line]
    assert "train.sh does not pass on the arguments the guardian appended" in line and 'with \\"$@\\"' in line
    assert "guardian stop dropped" in line
    assert int(line.split(" step=", 1)[1].split()[0]) <= 1  # the first step the console printed, not the last
