"""A key written twice in one YAML mapping is refused, naming the file, the line and the key, in every YAML the
guardian reads: guardian.yaml, the fleet file, a run's Hydra config, the training command's ``--config-name`` file
(red-team finding F2: the last value silently won - a second ``runs:`` dropped runs, a second ``mode:`` turned
observe into enforce)."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardian import verl_keys
from guardian.cli import EXIT_USAGE, main
from guardian.config import ConfigError, GuardianConfig, load_config
from guardian.fleet.spec import load_fleet
from guardian.overrides import EffectiveConfig
from guardian.sources.hydra_config import total_training_steps
from guardian.verl_keys import PatchError
from guardian.yamlio import YamlError, load_yaml


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "line", "key", "first"),
    [
        ("mode: observe\nsources:\n  poll_interval_s: 1\nmode: enforce\n", 4, "mode", 1),
        ("checks:\n  stall:\n    enabled: false\n    enabled: true\n", 4, "enabled", 3),
        ("exporter: {enabled: true, enabled: false}\n", 1, "enabled", 1),
        ("1: a\n01: b\n", 2, "01", 1),  # the same key once read: 1 == 01
        ("yes: a\ntrue: b\n", 2, "true", 1),
    ],
)
def test_the_loader_refuses_a_repeated_key_naming_its_line(text: str, line: int, key: str, first: int) -> None:
    with pytest.raises(YamlError) as caught:
        load_yaml(text, "config file g.yaml")
    assert str(caught.value) == (
        f"config file g.yaml line {line}: key {key!r} is given twice (first on line {first}); the second would "
        "silently replace the first: keep one"
    )


def test_merge_keys_and_keys_of_other_mappings_are_not_repeats() -> None:
    text = "base: &b {lr: 1, kl: 2}\nrun:\n  <<: *b\n  lr: 3\nother:\n  lr: 4\nlist:\n  - {lr: 1}\n  - {lr: 2}\n"
    loaded = load_yaml(text, "x")
    assert loaded.data["run"] == {"lr": 3, "kl": 2}
    assert loaded.lines[("list", 1, "lr")] == 9 and loaded.lines[("run", "lr")] == 4


def test_a_repeated_mode_in_guardian_yaml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path / "guardian.yaml", "mode: observe\nhome: /tmp/h\nmode: enforce\n")
    with pytest.raises(ConfigError, match=r"guardian.yaml line 3: key 'mode' is given twice \(first on line 1\)"):
        load_config(config, env={})
    assert main(["--log-level", "ERROR", "config", "--config", str(config)]) == EXIT_USAGE
    assert "key 'mode' is given twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (
            "runs:\n  - {run_id: alpha, command: [x]}\n  - {run_id: beta, command: [x]}\nruns:\n"
            "  - {run_id: gamma, command: [x]}\n",
            4,
            "runs",
        ),
        ("runs:\n  - run_id: a\n    command: [x]\n    run_id: b\n", 4, "run_id"),
    ],
)
def test_a_repeated_key_in_a_fleet_file_is_refused(tmp_path: Path, text: str, line: int, key: str) -> None:
    fleet = write(tmp_path / "fleet.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_fleet(fleet, GuardianConfig())
    assert f"fleet file {fleet} line {line}: key {key!r} is given twice" in str(caught.value)


def test_a_repeated_key_in_a_fleet_runs_own_config_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "own.yaml", "mode: observe\nmode: enforce\n")
    fleet = write(tmp_path / "fleet.yaml", "runs:\n  - {run_id: a, command: [x], config: own.yaml}\n")
    with pytest.raises(ConfigError, match=r"run a of the fleet: config file .*own.yaml line 2: key 'mode' is given"):
        load_fleet(fleet, GuardianConfig())


def test_a_repeated_key_in_the_runs_hydra_config_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "config.yaml", "trainer:\n  total_training_steps: 60\n  total_training_steps: 6\n")
    with pytest.raises(ConfigError, match=r"run config .*config.yaml line 3: key 'total_training_steps' is given"):
        total_training_steps(path)


def test_a_repeated_key_in_the_trainers_config_file_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "grpo.yaml", "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 5e-5\n      lr: 1e-6\n")
    argv = ["python", "-m", "verl.trainer.main_ppo", f"--config-path={tmp_path}", "--config-name=grpo"]
    with pytest.raises(PatchError, match=r"grpo.yaml line 5: key 'lr' is given twice \(first on line 4\)"):
        EffectiveConfig.of(argv, verl_keys.defaults())


def test_every_yaml_the_guardian_reads_goes_through_the_one_loader() -> None:
    """No module but guardian/yamlio.py calls PyYAML's loaders (a new reader would let duplicate keys win again)."""
    package = Path(__file__).resolve().parents[2] / "guardian"
    callers = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        if path.name != "yamlio.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if any(call in line for call in ("yaml.load(", "yaml.safe_load(", "yaml.full_load(", "yaml.unsafe_load("))
    ]
    assert not callers, f"read YAML with guardian.yamlio.load_yaml: {callers}"


def test_a_deeply_nested_file_is_one_error_not_a_traceback() -> None:
    with pytest.raises(YamlError, match=r"config file g\.yaml is nested too deeply"):
        load_yaml("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "config file g.yaml")
