"""The demo trainer's command line: Hydra's value grammar, struct mode, and the errors a launcher sees."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from guardian.demo import trainer
from guardian.demo.config import ConfigError, accepted_keys, compose
from guardian.demo.overrides import OverrideError, apply_overrides, parse_override, parse_value
from guardian.demo.settings import from_tree


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("-3", -3),
        ("1_000", 1000),
        ("1e-6", 1e-6),
        ("5e-5", 5e-5),
        ("1.0", 1.0),
        (".5", 0.5),
        ("1e5", 1e5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("abc", "abc"),
        ("0x10", "0x10"),
        ("1e-6x", "1e-6x"),
        ("'5'", "5"),
        ('"a b"', "a b"),
        ("", ""),
        ("[console,file]", ["console", "file"]),
        ('["console","file"]', ["console", "file"]),
        ('\'["console","file"]\'', '["console","file"]'),
        ("[model]", ["model"]),
        ("[1, 2.5, null]", [1, 2.5, None]),
        ("[]", []),
        ("{x: 1, y: [a]}", {"x": 1, "y": ["a"]}),
        ("/tmp/x/global_step_5/", "/tmp/x/global_step_5/"),
        ("${trainer.project_name}", "${trainer.project_name}"),
    ],
)
def test_values_are_typed_like_hydra(text: str, expected: object) -> None:
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


def test_special_floats() -> None:
    assert parse_value("inf") == math.inf
    assert math.isnan(parse_value("nan"))


def test_prefixes() -> None:
    assert parse_override("a.b=1").prefix == ""
    assert parse_override("+a.b=1").prefix == "+"
    assert parse_override("++a.b=1").prefix == "++"
    with pytest.raises(OverrideError, match="expected key=value"):
        parse_override("trainer.save_freq")
    with pytest.raises(OverrideError, match="not supported"):
        parse_override("~trainer.save_freq")


def test_struct_mode_matches_hydra_messages() -> None:
    base = {"trainer": {"save_freq": -1}}
    with pytest.raises(OverrideError) as missing:
        apply_overrides(base, [parse_override("trainer.seed=3")])
    assert str(missing.value).startswith(
        "Could not override 'trainer.seed'.\nTo append to your config use +trainer.seed=3"
    )
    with pytest.raises(OverrideError) as present:
        apply_overrides(base, [parse_override("+trainer.save_freq=3")])
    assert str(present.value).startswith("Could not append to config. An item is already at 'trainer.save_freq'.")
    tree = apply_overrides(base, [parse_override("++trainer.save_freq=3"), parse_override("++trainer.seed=4")])
    assert tree == {"trainer": {"save_freq": 3, "seed": 4}}
    assert base == {"trainer": {"save_freq": -1}}, "the base tree is not modified"


def test_compose_resolves_the_interpolated_defaults() -> None:
    tree = compose(["trainer.project_name=p", "trainer.experiment_name=e"]).tree
    assert tree["trainer"]["default_local_dir"] == "checkpoints/p/e"
    checkpoint = tree["actor_rollout_ref"]["actor"]["checkpoint"]
    assert checkpoint["load_contents"] == checkpoint["save_contents"] == ["model", "optimizer", "extra"]
    assert compose(["actor_rollout_ref.actor.checkpoint.load_contents=[model]"]).tree["actor_rollout_ref"]["actor"][
        "checkpoint"
    ]["load_contents"] == ["model"]


def test_plus_keys_known_and_unknown() -> None:
    composed = compose(["+trainer.seed=7", "+trainer.fault.nan_at_step=3", "+trainer.wandb_proxy=http://x"])
    settings = from_tree(composed.tree)
    assert settings.rollout_seed == settings.data_seed == 7
    assert settings.faults.nan_at_step == 3
    assert composed.warnings == ["WARN: the demo trainer ignores 'trainer.wandb_proxy' (not used on CPU)"]
    with pytest.raises(ConfigError, match="unknown fault"):
        compose(["+trainer.fault.nan_at_stpe=3"])


def test_inert_verl_keys_are_accepted() -> None:
    assert "actor_rollout_ref.model.path" in accepted_keys()
    composed = compose(["actor_rollout_ref.model.path=/models/qwen", "trainer.n_gpus_per_node=1"])
    assert composed.warnings == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["actor_rollout_ref.actor.optim.lr=abc"], "actor_rollout_ref.actor.optim.lr must be a number"),
        (["algorithm.adv_estimator=gae"], "algorithm.adv_estimator='gae' is not supported"),
        (["trainer.resume_mode=foo"], "trainer.resume_mode='foo' is not supported"),
        (["trainer.logger=[console,tensorboardx]"], "trainer.logger: tensorboardx not supported"),
        (['trainer.logger=\'["console","file"]\''], 'trainer.logger: ["console","file"] not supported'),
        (["data.train_batch_size=6"], "must be a multiple of ppo_mini_batch_size"),
        (["actor_rollout_ref.rollout.temperature=0"], "temperature must be > 0"),
        (["actor_rollout_ref.actor.kl_loss_type=full"], "kl_loss_type='full' is not supported"),
    ],
)
def test_bad_values_fail_at_start(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        from_tree(compose(argv).tree)
    assert message in str(exc.value)


def test_bad_override_exits_1_like_hydra(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert trainer.main(["trainer.sed=1"]) == 1
    err = capsys.readouterr().err
    assert "Could not override 'trainer.sed'.\nTo append to your config use +trainer.sed=1" in err
    assert "HYDRA_FULL_ERROR" in err
    assert trainer.main(["data.train_batch_size=1000"]) == 1
    assert "exceeds the dataset" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "nothing is written when the configuration is rejected"


def test_logger_lists_in_both_spellings() -> None:
    for spelling in ("trainer.logger=[console,file]", 'trainer.logger=["console","file"]'):
        assert from_tree(compose([spelling]).tree).loggers == ("console", "file")
    settings = from_tree(compose([]).tree)
    assert settings.loggers == ("console",)
    assert settings.ignored_loggers == ("wandb",), "verl's default logger list; wandb is ignored with a warning"
    assert from_tree(compose(["trainer.logger=console"]).tree).loggers == ("console",), "a bare name, as in verl"
