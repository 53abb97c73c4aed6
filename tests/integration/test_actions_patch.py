"""Hydra overrides, effective values, key validation, the default ladder and the patch plan."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from guardian import verl_keys
from guardian.actions import patch
from guardian.actions.patch import (
    RESUME_KEYS,
    RunFiles,
    crash_restart_plan,
    first_effective_rung,
    plan_patch,
    prepare_attempt,
)
from guardian.ladder import DEFAULT_LADDERS, INCIDENT_KINDS, LOAD_CONTENTS, LR, Change, RemediationConfig, Rung
from guardian.overrides import (
    EffectiveConfig,
    effective_value,
    parse_command,
    parse_value,
    render_value,
    with_overrides,
)
from guardian.verl_keys import PatchError, compose_check, validate

A = "actor_rollout_ref.actor."
ENV_METRICS = "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"
# the key overrides of the real verl 0.9.1 run (shared/verl-0.9.1-run/README.md), plus the paths it needs
VERL_RUN = [
    "python3", "-m", "verl.trainer.main_ppo",
    "algorithm.adv_estimator=grpo", "data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet",
    "data.train_batch_size=32", "data.max_prompt_length=32", "data.max_response_length=16",
    "actor_rollout_ref.model.path=/models/tiny-qwen2", "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=4", f"{A}optim.lr=1e-3", f"{A}ppo_mini_batch_size=16",
    f"{A}ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    f"{A}use_kl_loss=False", f"{A}entropy_coeff=0", 'trainer.logger=["console","file"]', "trainer.save_freq=10",
    "trainer.test_freq=10", "trainer.val_before_train=True", "trainer.rollout_data_dir=/runs/copy/rollouts",
    "reward.custom_reward_function.path=/src/reward.py", "reward.custom_reward_function.name=compute_score",
    "trainer.n_gpus_per_node=1", "trainer.default_local_dir=/ckpt/copy",
]  # fmt: skip
DEMO_RUN = ["python", "-m", "guardian.demo.trainer", f"{A}optim.lr=0.05", "trainer.save_freq=5"]
CKPT = "/ckpt/copy/global_step_20"


def have_verl_hydra() -> bool:
    """True when verl's config tree and hydra-core are importable; skips locally, fails in CI, when not."""
    if verl_keys.verl_config_dir() is not None and importlib.util.find_spec("hydra") is not None:
        return True
    message = "needs verl==0.9.1 (config tree) and hydra-core; pip install --no-deps verl==0.9.1 hydra-core omegaconf"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def need_hydra() -> None:
    """Skip locally without hydra-core; fail in CI, where it must be installed."""
    if importlib.util.find_spec("hydra") is None:
        if os.environ.get("CI"):
            pytest.fail("needs hydra-core (pip install hydra-core omegaconf)")
        pytest.skip("hydra-core not installed")


@pytest.fixture
def no_compose(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Record compose calls instead of running Hydra (a second each); the real compose has its own tests."""
    calls: list[list[str]] = []

    def fake(overrides: list[str], *, config_name: str = "ppo_trainer") -> str:
        calls.append(list(overrides))
        return "composed (test)"

    monkeypatch.setattr(patch, "compose_check", fake)
    yield calls


def files(tmp_path: Path, **kw: object) -> RunFiles:
    return RunFiles(tmp_path / "a1" / "metrics.jsonl", tmp_path / "a1" / "rollouts", cwd=tmp_path, **kw)  # type: ignore[arg-type]


def overrides_of(argv: list[str] | tuple[str, ...]) -> dict[str, str]:
    return {o.text().split("=", 1)[0]: o.value_text or "" for o in parse_command(argv).overrides}


# -- parsing and rendering ---------------------------------------------------------------------------------


def test_parse_command_splits_prefix_config_and_overrides() -> None:
    cmd = parse_command(
        ["env", "A=1", "python3", "-u", "-m", "verl.trainer.main_ppo", "--config-path=/cfg", "-cn", "grpo",
         "+trainer.wandb_proxy=x", "++a.b=1", "~c.d", "--cfg", "job", "e=[1,2]"]
    )  # fmt: skip
    assert cmd.prefix == ("env", "A=1", "python3", "-u", "-m", "verl.trainer.main_ppo") and cmd.is_verl
    assert (cmd.config_path, cmd.config_name) == ("/cfg", "grpo")
    assert [(o.op, o.key, o.value_text) for o in cmd.overrides] == [
        ("+", "trainer.wandb_proxy", "x"), ("++", "a.b", "1"), ("~", "c.d", None), ("", "e", "[1,2]")
    ]  # fmt: skip
    assert parse_command(["python", "/x/main_ppo.py", "k=1"]).is_verl
    assert not parse_command(DEMO_RUN).is_verl
    with pytest.raises(PatchError, match="cannot find the trainer"):
        parse_command(["make", "train"])  # a launch script is read (tests/e2e/test_run_script.py); make is not


VALUES = ["1e-6", "1e-06", "1.5e+3", ".5", "5.", "-1", "+1", "1_000", "True", "false", "NuLL", "[model]", "[]",
          "[a, 'b c', 1]", "'a b'", '"q"', "abc", "/abs/p-a_b.c", "${x.y}", "k3+", "0x10", "inf", "a:b"]  # fmt: skip


@pytest.mark.parametrize("text", VALUES)
def test_parse_value_agrees_with_hydra(text: str) -> None:
    need_hydra()
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert parse_value(text) == OverridesParser.create().parse_override(f"k={text}").value()


RENDER: list[tuple[object, str]] = [
    (1e-6, "1e-06"), (0.28, "0.28"), (5, "5"), (True, "true"), (None, "null"), (["model"], "[model]"),
    (["console", "file"], "[console,file]"), ("/a/b.jsonl", "/a/b.jsonl"), ("a b", "'a b'"), ("1", "'1'"),
    ("true", "'true'"), ("it's", '"it\'s"'), ("${x}", "'${x}'"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "text"), RENDER)
def test_render_value_round_trips(value: object, text: str) -> None:
    assert render_value(value) == text
    assert parse_value(text) == value
    if importlib.util.find_spec("hydra") is not None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        assert OverridesParser.create().parse_override(f"k={text}").value() == value
    with pytest.raises(PatchError, match="non-finite"):
        render_value(float("nan"))


# -- effective values -----------------------------------------------------------------------------------------

DEFAULTS = verl_keys.defaults()


def test_effective_value_cli_beats_yaml_beats_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "grpo.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  actor:\n    optim:\n      lr: 5e-5\n"
        "    kl_loss_coef: 0.0001\n  rollout:\n    temperature: 0.5\n"
    )
    argv = ["python", "-m", "verl.trainer.main_ppo", f"--config-path={cfg}", "--config-name=grpo",
            f"{A}kl_loss_coef=0.01", f"{A}kl_loss_coef=0.02"]  # fmt: skip
    assert effective_value(argv, f"{A}kl_loss_coef", defaults=DEFAULTS) == 0.02  # last override wins
    assert effective_value(argv, f"{A}optim.lr", defaults=DEFAULTS) == 5e-5  # YAML, 1e-6 style read as a float
    assert effective_value(argv, "actor_rollout_ref.rollout.temperature", defaults=DEFAULTS) == 0.5
    assert effective_value(argv, f"{A}clip_ratio_high", defaults=DEFAULTS) == 0.2  # verl default
    eff = EffectiveConfig.of(argv, DEFAULTS)
    assert eff.config_file == cfg / "grpo.yaml" and "defaults list" in eff.notes[0]
    assert effective_value([*argv, f"~{A}kl_loss_coef"], f"{A}kl_loss_coef", defaults=DEFAULTS) is None
    with pytest.raises(PatchError, match="no verl default"):
        effective_value(argv, "data.no_such_key", defaults=DEFAULTS)


def test_effective_value_finds_a_relative_config_path_and_refuses_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.yaml").write_text("trainer:\n  save_freq: 7\n")
    argv = ["python", "-m", "verl.trainer.main_ppo", "--config-path", "configs", "--config-name", "run"]
    assert effective_value(argv, "trainer.save_freq", defaults=DEFAULTS, cwd=tmp_path) == 7
    with pytest.raises(PatchError, match=r"run\.yaml not found"):
        effective_value(argv, "trainer.save_freq", defaults=DEFAULTS, cwd=tmp_path / "elsewhere")


def test_config_path_without_name_reads_ppo_trainer_yaml(tmp_path: Path) -> None:
    (tmp_path / "ppo_trainer.yaml").write_text("trainer:\n  save_freq: 3\n")
    argv = ["python", "-m", "verl.trainer.main_ppo", f"--config-path={tmp_path}"]
    assert effective_value(argv, "trainer.save_freq", defaults=DEFAULTS) == 3
    only_dir = [
        "python",
        "-m",
        "verl.trainer.main_ppo",
        f"--config-dir={tmp_path}",
        "--config-name=ppo_megatron_trainer",
    ]
    assert effective_value(only_dir, "trainer.save_freq", defaults=DEFAULTS) == -1  # a verl built-in: defaults


def test_effective_value_resolves_interpolations() -> None:
    argv = [*DEMO_RUN, "trainer.project_name=p", "trainer.experiment_name=e"]
    assert effective_value(argv, "trainer.default_local_dir", defaults=DEFAULTS) == "checkpoints/p/e"


# -- with_overrides -------------------------------------------------------------------------------------------


def test_with_overrides_replaces_in_place_appends_and_adds_plus_for_unknown_keys() -> None:
    argv = ["python", "-m", "verl.trainer.main_ppo", "--config-name=x", "a.lr=1", "b=2", "a.lr=3", "+c.d=4"]
    out = with_overrides(argv, {"a.lr": 1e-6, "c.d": "x y", "e": ["model"], "f.g": True}, known_keys={"a.lr", "e"})
    assert out == [
        "python", "-m", "verl.trainer.main_ppo", "--config-name=x", "b=2", "a.lr=1e-06", "++c.d='x y'",
        "e=[model]", "++f.g=true",
    ]  # fmt: skip
    with pytest.raises(PatchError, match="plain dotted key"):
        with_overrides(argv, {"+a.lr": 1}, known_keys=())


# -- verl keys ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        (f"{A}optim.lr", -1, "> 0"),
        (f"{A}optim.lr", float("nan"), "> 0"),
        (f"{A}entropy_coeff", "abc", "a number"),
        (f"{A}entropy_coeff", 0.2, "in [0, 0.1]"),
        (f"{A}use_kl_loss", 1, "true or false"),
        (f"{A}kl_loss_type", "k9", "low_var_kl"),
        ("actor_rollout_ref.rollout.n", 2.5, "an integer"),
        ("actor_rollout_ref.rollout.temperature", 0, "in (0, 2]"),
        ("trainer.resume_mode", "latest", "resume_path"),
        ("trainer.resume_from_path", "/c/global_step_5/", "no trailing slash"),
        (LOAD_CONTENTS, ["optimizer"], "'model'"),
        (LOAD_CONTENTS, ["model", "weights"], "items from"),
        ("actor_rollout_ref.actor.bogus", 1, "unknown key"),
    ],
)
def test_validate_refuses_with_key_value_and_rule(key: str, value: object, rule: str) -> None:
    with pytest.raises(PatchError) as err:
        validate(key, value)
    assert key in str(err.value) and rule in str(err.value)
    if "unknown" not in rule:
        assert repr(value) in str(err.value)


def test_validate_normalises() -> None:
    assert validate(f"{A}optim.lr", 1) == 1.0 and isinstance(validate(f"{A}optim.lr", 1), float)
    assert validate(f"{A}kl_loss_type", "k3+") == "k3+"
    assert validate(LOAD_CONTENTS, ("model",)) == ["model"]
    assert validate("trainer.rollout_data_dir", None) is None
    assert validate("ray_kwargs.ray_init.runtime_env.env_vars.X", "/p") == "/p"
    assert verl_keys.needs_plus("ray_kwargs.ray_init.runtime_env.env_vars.X")
    assert verl_keys.needs_plus("trainer.wandb_proxy") and not verl_keys.needs_plus(f"{A}optim.lr")


def test_known_keys_and_defaults_match_the_verl_wheel() -> None:
    have_verl_hydra()
    config_dir = verl_keys.verl_config_dir()
    assert config_dir is not None
    tree = yaml.safe_load((config_dir / "_generated_ppo_trainer.yaml").read_text())
    for key, spec in verl_keys.VERL_KEYS.items():
        node: object = tree
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        assert (node is not KeyError) == spec.in_yaml, key
        if spec.in_yaml and key != LOAD_CONTENTS:  # load_contents is ${.save_contents} there
            assert node == spec.default, key


def test_compose_check_uses_verls_hydra_tree() -> None:
    have_verl_hydra()
    assert "composed" in compose_check([f"{A}optim.lr=1e-05", f"{LOAD_CONTENTS}=[model]", f"{ENV_METRICS}=/m.jsonl"])
    with pytest.raises(PatchError, match=re.escape("Could not override 'actor_rollout_ref.actor.bogus'")):
        compose_check([f"{A}bogus=1"])
    with pytest.raises(PatchError, match=re.escape("trainer.wandb_proxy")):
        compose_check(["trainer.wandb_proxy=x"])


def test_compose_check_without_verl_checks_the_key_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_keys, "verl_config_dir", lambda: None)
    assert "key list only" in compose_check([f"{A}optim.lr=1e-05", "data.anything=1"])
    with pytest.raises(PatchError, match="must be"):
        compose_check([f"{A}optim.lr=abc"])
    with pytest.raises(PatchError, match=re.escape("write ++trainer.wandb_proxy")):
        compose_check(["trainer.wandb_proxy=x"])


# -- the ladder ---------------------------------------------------------------------------------------------


def test_change_and_rung_validation() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        Change(key=LR, multiply=0.5, at_least=1e-7)
    with pytest.raises(ValidationError, match="unknown key"):
        Change(key=f"{A}bogus", set=1)
    with pytest.raises(ValidationError, match="managed by the guardian"):
        Change(key="trainer.resume_mode", set="disable")
    with pytest.raises(ValidationError, match="must be"):
        Change(key=LR, set=-1.0)
    with pytest.raises(ValidationError, match="only 'set'"):
        Change(key=f"{A}use_kl_loss", multiply=2)
    with pytest.raises(ValidationError, match="verl would ignore the new LR"):
        Rung(name="r", why="w", changes=(Change(key=LR, multiply=0.5),), reset_optimizer=False)


def test_remediation_config_defaults_and_merge() -> None:
    assert set(DEFAULT_LADDERS) == set(INCIDENT_KINDS)
    from guardian.checks import default_checks  # every check of the default rule set has a ladder (stall: restart)
    from guardian.config import ChecksConfig

    assert {c.name for c in default_checks(ChecksConfig())} - {"stall"} == set(INCIDENT_KINDS)
    cfg = RemediationConfig.model_validate({"margin_steps": 5, "ladders": {"kl_drift": []}})
    assert cfg.rung("kl_drift", 0) is None and cfg.rung("entropy_collapse", 0) == DEFAULT_LADDERS["entropy_collapse"][0]
    assert cfg.rung("entropy_collapse", 3) is None
    with pytest.raises(ValidationError, match="unknown incident kind"):
        RemediationConfig.model_validate({"ladders": {"oops": []}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        RemediationConfig.model_validate({"margin": 1})


def test_rungs_cite_their_numbers() -> None:
    for kind, ladder in DEFAULT_LADDERS.items():
        assert len(ladder) == 3, kind
        for rung in ladder:
            assert any(
                src in rung.why for src in ("seed", "Skywork", "DAPO", "ProRL", "POLARIS", "verl", "§3.9", "PaLM")
            ), rung.name


# one kind per distinct ladder (some kinds share one): a Hydra compose costs about a second
DISTINCT = sorted({id(ladder): kind for kind, ladder in sorted(DEFAULT_LADDERS.items())}.values())


@pytest.mark.parametrize("kind", DISTINCT)
def test_default_ladder_gives_valid_commands(kind: str, tmp_path: Path, no_compose: list[list[str]]) -> None:
    """All rungs of a ladder in turn (a relapse each time) on the real run's command, then one Hydra compose."""
    argv: list[str] = VERL_RUN
    for rung in DEFAULT_LADDERS[kind]:
        plan = plan_patch(argv, rung, resume_from=CKPT, run_files=files(tmp_path))
        argv = list(plan.argv)
        for key, _before, after in plan.diff:
            validate(key, after)
    assert argv[:3] == VERL_RUN[:3]
    ov = overrides_of(argv)
    assert ov["trainer.resume_mode"] == "resume_path" and ov["trainer.resume_from_path"] == CKPT
    assert ov["trainer.rollout_data_dir"] == "/runs/copy/rollouts"  # the user's, kept
    assert float(ov[f"{A}optim.lr"]) < 1e-3 and ov[LOAD_CONTENTS] == "[model]"
    if importlib.util.find_spec("hydra") is not None and verl_keys.verl_config_dir() is not None:
        assert "composed" in compose_check(parse_command(argv).override_texts())


@pytest.mark.parametrize("kind", sorted(DEFAULT_LADDERS))
def test_default_ladder_on_the_demo_trainer(kind: str, tmp_path: Path, no_compose: list[list[str]]) -> None:
    ladder = DEFAULT_LADDERS[kind]
    rung = ladder[first_effective_rung(DEMO_RUN, ladder, 0, files(tmp_path))]
    plan = plan_patch(DEMO_RUN, rung, resume_from=CKPT, run_files=files(tmp_path))
    assert plan.argv[:3] == tuple(DEMO_RUN[:3]) and "is not verl" in plan.notes[-1] and no_compose == []
    ov = overrides_of(plan.argv)
    changed = {k for k, _, _ in plan.diff} - RESUME_KEYS
    assert changed, f"no rung of {kind} changes anything on the demo trainer"
    assert (ov.get(LOAD_CONTENTS) == "[model]") == (f"{A}optim.lr" in changed)  # the LR trap, only when needed
    assert ov[ENV_METRICS] == str(tmp_path / "a1" / "metrics.jsonl")


def test_lr_patch_resets_optimizer_state(tmp_path: Path, no_compose: list[list[str]]) -> None:
    rung = Rung(name="lr", why="LR", changes=(Change(key=LR, multiply=0.2),))
    plan = plan_patch(VERL_RUN, rung, resume_from=CKPT + "/", run_files=files(tmp_path))
    assert (LR, 1e-3, 0.0002) in plan.diff and (LOAD_CONTENTS, ["model", "optimizer", "extra"], ["model"]) in plan.diff
    assert plan.optimizer_reset and any("optimizer state reset" in n for n in plan.notes)
    assert plan.resume_from == CKPT and f"{LOAD_CONTENTS}=[model]" in plan.argv
    assert no_compose and f"{A}optim.lr=0.0002" in no_compose[0]
    quiet = plan_patch(VERL_RUN, Rung(name="t", why="T", changes=(Change(key=f"{A}entropy_coeff", set=0.001),)),
                       resume_from=CKPT, run_files=files(tmp_path))  # fmt: skip
    assert not quiet.optimizer_reset and LOAD_CONTENTS not in overrides_of(quiet.argv)


def test_changes_compound_on_the_current_command(tmp_path: Path, no_compose: list[list[str]]) -> None:
    first, second, third = DEFAULT_LADDERS["entropy_collapse"]
    one = plan_patch(VERL_RUN, first, resume_from=CKPT, run_files=files(tmp_path))
    diff = {k: (b, a) for k, b, a in one.diff}
    # rung 1 undoes what spends entropy and keeps the LR and the optimizer state
    assert diff[f"{A}entropy_coeff"] == (0, 0.003) and diff[f"{A}clip_ratio_high"] == (0.2, 0.28)
    assert LR not in diff and not one.optimizer_reset
    two = plan_patch(one.argv, second, resume_from=CKPT, run_files=files(tmp_path))
    three = plan_patch(two.argv, third, resume_from=CKPT, run_files=files(tmp_path))
    assert overrides_of(two.argv)[LR] == "0.0005" and overrides_of(three.argv)[LR] == "0.00025"  # compounds
    two_diff = {k: (b, a) for k, b, a in two.diff}
    assert two_diff[f"{A}entropy_coeff"] == (0.003, 0.005)
    assert two_diff[f"{A}use_kl_loss"] == (False, True) and two_diff[f"{A}kl_loss_coef"] == (0.001, 0.01)


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ([f"{A}use_kl_loss=true"], {f"{A}kl_loss_coef": 0.01}),  # 0.001 x 5, at least the seed's 0.01
        ([f"{A}use_kl_loss=true", f"{A}kl_loss_coef=0.004"], {f"{A}kl_loss_coef": 0.02}),
        (["algorithm.use_kl_in_reward=true"], {"algorithm.kl_ctrl.kl_coef": 0.01}),
        ([], {f"{A}use_kl_loss": True, f"{A}kl_loss_coef": 0.01}),
    ],
)
def test_kl_drift_raises_the_coefficient_the_run_uses(
    extra: list[str], expect: dict[str, object], tmp_path: Path, no_compose: list[list[str]]
) -> None:
    argv = [*VERL_RUN, *extra]
    plan = plan_patch(argv, DEFAULT_LADDERS["kl_drift"][0], resume_from=CKPT, run_files=files(tmp_path))
    changed = {k: a for k, _, a in plan.diff if "kl" in k}
    assert changed == expect


def test_patch_reads_the_runs_yaml(tmp_path: Path, no_compose: list[list[str]]) -> None:
    (tmp_path / "grpo.yaml").write_text("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 5e-5\n")
    argv = ["python", "-m", "verl.trainer.main_ppo", f"--config-path={tmp_path}", "--config-name=grpo"]
    plan = plan_patch(argv, DEFAULT_LADDERS["kl_drift"][0], resume_from=CKPT, run_files=files(tmp_path))
    assert (LR, 5e-5, 1e-5) in plan.diff and overrides_of(plan.argv)[LR] == "1e-05"
    assert LR in " ".join(no_compose[0]) and not any(o.startswith("data.") for o in no_compose[0])  # ours only


def test_plan_refuses_bad_values_and_paths(tmp_path: Path, no_compose: list[list[str]]) -> None:
    rung = Rung(name="t", why="T", changes=(Change(key=f"{A}entropy_coeff", multiply=2.0),))
    with pytest.raises(PatchError, match="not a number"):
        plan_patch([*VERL_RUN, f"{A}entropy_coeff=abc"], rung, resume_from=CKPT, run_files=files(tmp_path))
    too_hot = Rung(name="t", why="T", changes=(Change(key="actor_rollout_ref.rollout.temperature", multiply=3.0),))
    with pytest.raises(PatchError, match=re.escape("in (0, 2]")):
        plan_patch(VERL_RUN, too_hot, resume_from=CKPT, run_files=files(tmp_path))
    with pytest.raises(PatchError, match="global_step_"):
        plan_patch(VERL_RUN, DEFAULT_LADDERS["kl_drift"][0], resume_from="/ckpt/copy/latest", run_files=files(tmp_path))


# -- run files and crash restarts -----------------------------------------------------------------------------


def test_prepare_attempt_adds_file_logger_rollout_dir_and_metrics_path(tmp_path: Path) -> None:
    argv = ["python", "-m", "verl.trainer.main_ppo", "trainer.logger=[console,wandb]"]
    got = prepare_attempt(argv, metrics_path=Path("a1/m.jsonl"), rollout_dir=Path("a1/r"), cwd=tmp_path)
    ov = overrides_of(got.argv)
    assert ov["trainer.logger"] == "[console,wandb,file]"
    assert ov["trainer.rollout_data_dir"] == str(tmp_path / "a1" / "r") and not got.rollout_dir_is_users
    assert ov[ENV_METRICS] == str(tmp_path / "a1" / "m.jsonl") == got.env["VERL_FILE_LOGGER_PATH"]
    assert got.checkpoint_dir == tmp_path / "checkpoints" / "verl_examples" / "gsm8k"
    again = prepare_attempt(got.argv, metrics_path=Path("a1/m.jsonl"), rollout_dir=Path("a1/r"), cwd=tmp_path)
    assert again.argv == got.argv  # idempotent
    nxt = prepare_attempt(
        got.argv, metrics_path=Path("a2/m.jsonl"), rollout_dir=Path("a2/r"), cwd=tmp_path, user_command=argv
    )
    assert overrides_of(nxt.argv)["trainer.rollout_data_dir"] == str(tmp_path / "a2" / "r")  # not the user's: ours


@pytest.mark.parametrize("logger", ["console", '\'["console","wandb"]\'', "[console,file]"])
def test_prepare_attempt_reads_every_logger_spelling(logger: str, tmp_path: Path) -> None:
    argv = ["python", "-m", "verl.trainer.main_ppo", f"trainer.logger={logger}"]
    got = prepare_attempt(argv, metrics_path=tmp_path / "m.jsonl", rollout_dir=tmp_path / "r", cwd=tmp_path)
    loggers = parse_value(overrides_of(got.argv)["trainer.logger"])
    assert isinstance(loggers, list) and loggers[-1] == "file" and "console" in loggers


def test_prepare_attempt_keeps_the_users_rollout_dir(tmp_path: Path) -> None:
    got = prepare_attempt(VERL_RUN, metrics_path=tmp_path / "m.jsonl", rollout_dir=tmp_path / "r", cwd=tmp_path)
    assert got.rollout_dir == Path("/runs/copy/rollouts") and got.rollout_dir_is_users
    assert got.checkpoint_dir == Path("/ckpt/copy")
    assert got.argv[: len(VERL_RUN)] == tuple(VERL_RUN)  # nothing of the user's touched, one key appended
    assert got.argv[len(VERL_RUN) :] == (f"{ENV_METRICS}={tmp_path / 'm.jsonl'}",)


def test_crash_restart_keeps_the_config(tmp_path: Path, no_compose: list[list[str]]) -> None:
    plan = crash_restart_plan(VERL_RUN, resume_from=CKPT, run_files=files(tmp_path))
    assert {k for k, _, _ in plan.diff} == {"trainer.resume_mode", "trainer.resume_from_path"}
    assert plan.resume_from == CKPT and plan.rung is None and not plan.optimizer_reset
    fresh = crash_restart_plan([*VERL_RUN, f"{LOAD_CONTENTS}=[model]"], resume_from=None, run_files=files(tmp_path))
    assert fresh.diff == (("trainer.resume_mode", "auto", "disable"),) and fresh.resume_from is None
    assert any("from scratch" in n for n in fresh.notes)
    assert any("optimizer state is not restored" in n for n in fresh.notes)
    assert plan.to_json()["resume_from"] == CKPT


def test_a_rung_the_run_already_has_is_skipped(tmp_path: Path) -> None:
    # length-1 turns the entropy bonus off and clip-higher down: a run with neither gets length-2
    ladder = DEFAULT_LADDERS["length_explosion"]
    assert first_effective_rung(VERL_RUN, ladder, 0, files(tmp_path)) == 1
    bonus = [*VERL_RUN, f"{A}entropy_coeff=0.01"]
    assert first_effective_rung(bonus, ladder, 0, files(tmp_path)) == 0
