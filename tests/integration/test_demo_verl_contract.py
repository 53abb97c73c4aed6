"""Contract tests against verl 0.9.1's own code: its FileLogger and console formatter (loaded as
standalone modules from the installed wheel) and its Hydra config tree.

Needs ``pip install --no-deps verl==0.9.1`` plus ``hydra-core`` and ``omegaconf``; skipped locally
when they are missing, failed in CI (``CI`` set). ``import verl`` itself is never executed (it pulls
in torch and ray): files are located with ``importlib.util.find_spec`` and loaded by path.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import missing, verl_package

from guardian.demo import scenarios, trainer
from guardian.demo.config import DEMO_DEFAULTS, SCHEMA, compose
from guardian.demo.overrides import OverrideError, flatten, parse_override
from guardian.demo.writers import FileLogger, console_line
from guardian.sources.console import parse_console_line
from guardian.sources.jsonl import read_all


@pytest.fixture(scope="module")
def verl_dir() -> Path:
    return verl_package()


def _load(path: Path, name: str, stubs: tuple[str, ...] = ()) -> types.ModuleType:
    """Execute one verl source file as a module of its own, with empty stand-ins for ``stubs``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        for stub in stubs:
            if importlib.util.find_spec(stub) is None:
                patch.setitem(sys.modules, stub, types.ModuleType(stub))
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verl_tracking(verl_dir: Path) -> types.ModuleType:
    # tracking.py imports only the stdlib, orjson and packaging at module level: nothing to stub
    return _load(verl_dir / "utils" / "tracking.py", "verl_tracking_standalone")


@pytest.fixture(scope="module")
def verl_console(verl_dir: Path) -> types.ModuleType:
    # aggregate_logger.py imports torch at the top but never uses it in concat_dict_to_str
    return _load(verl_dir / "utils" / "logger" / "aggregate_logger.py", "verl_console_standalone", stubs=("torch",))


SAMPLE: dict[str, Any] = {
    "actor/pg_loss": 0.0123,
    "actor/entropy": np.float64(1.75),
    "num_turns/max": np.int32(4),
    "num_turns/mean": np.float64(2.0),
    "training/global_step": 7,
    "x/nan": float("nan"),
    "x/inf": np.float64("inf"),
    "x/float32": np.float32(0.1),
    "flag": True,
    "name": "gsm8k",
}


def test_file_logger_writes_the_same_bytes(
    verl_tracking: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    written = {}
    for who, cls in (("verl", verl_tracking.FileLogger), ("demo", FileLogger)):
        path = tmp_path / f"{who}.jsonl"
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
        logger = cls("proj", "exp")
        logger.log(data={"val-core/x/acc/mean@1": np.float64(0.5)}, step=0)
        logger.log(data=SAMPLE, step=1)
        logger.finish()
        assert capsys.readouterr().out == f"Creating file logger at {path}\n"
        written[who] = path.read_bytes()
    assert written["demo"] == written["verl"]
    assert b'"x/nan":null' in written["demo"]
    verl_records, _ = read_all(tmp_path / "verl.jsonl")
    demo_records, _ = read_all(tmp_path / "demo.jsonl")
    assert [(r.step, r.data.keys()) for r in demo_records] == [(r.step, r.data.keys()) for r in verl_records]


def test_file_logger_path_rules(
    verl_tracking: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "missing" / "m.jsonl"))
    for cls in (verl_tracking.FileLogger, FileLogger):
        with pytest.raises(FileNotFoundError):
            cls("proj", "exp")  # the parent of VERL_FILE_LOGGER_PATH is not created
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    for who, cls in (("verl", verl_tracking.FileLogger), ("demo", FileLogger)):
        monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / who))
        first = cls("proj", "exp")
        first.log(data={"a": 1}, step=1)
        first.finish()
        path = tmp_path / who / "proj" / "exp.jsonl"
        assert path.read_bytes() == b'{"step":1,"data":{"a":1}}\n'
        cls("proj", "exp").finish()
        assert path.read_bytes() == b"", "truncated on every start"


def test_console_line_is_verls(verl_console: types.ModuleType) -> None:
    expected = verl_console.concat_dict_to_str(SAMPLE, step=3)
    assert console_line(SAMPLE, 3) == expected
    assert "actor/entropy:np.float64(1.75)" in expected and "num_turns/max:np.int32(4)" in expected


def _run_demo(root: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Path:
    monkeypatch.chdir(root)
    metrics = root / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))
    argv = ["trainer.logger=[console,file]", "trainer.total_training_steps=4", "trainer.test_freq=2", *extra]
    assert trainer.main(argv) == 0
    return metrics


def test_demo_output_is_what_verls_logger_would_write(
    verl_tracking: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = _run_demo(
        tmp_path, monkeypatch, "actor_rollout_ref.actor.use_kl_loss=true", "+trainer.fault.nan_at_step=4"
    )
    console = capsys.readouterr().out
    replayed = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(replayed))
    logger = verl_tracking.FileLogger("p", "e")
    for line in metrics.read_bytes().splitlines():
        record = orjson.loads(line)
        logger.log(data=record["data"], step=record["step"])
    logger.finish()
    assert replayed.read_bytes() == metrics.read_bytes()

    from_jsonl, bad = read_all(metrics)
    assert not bad and [r.step for r in from_jsonl] == [0, 1, 2, 3, 4]
    from_console = [r for r in map(parse_console_line, console.splitlines()) if r is not None]
    assert [r.step for r in from_console] == [0, 1, 2, 3, 4]
    for a, b in zip(from_jsonl, from_console, strict=True):
        assert a.data.keys() == b.data.keys()
        for key, value in a.data.items():
            assert (math.isnan(value) and math.isnan(b.data[key])) or value == b.data[key], key


# -- Hydra: the key names and defaults come from verl's own config tree ------------------------------


@pytest.fixture(scope="module")
def verl_compose(verl_dir: Path) -> Iterator[Callable[[list[str]], Any]]:
    for module in ("hydra", "omegaconf"):
        if importlib.util.find_spec(module) is None:
            missing(f"{module} is not installed (contract tests need: pip install hydra-core omegaconf)")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_dir / "trainer" / "config"), version_base=None):
        yield lambda overrides: hydra_compose("ppo_trainer", overrides=overrides)


def _hydra(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _select(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except MissingMandatoryValue:
        return "???"  # a required value (verl's rollout.name)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def test_every_accepted_key_exists_in_verls_tree(verl_compose: Callable[[list[str]], Any]) -> None:
    defaults = flatten(compose([]).tree)
    plain = [f"{key}={_hydra(defaults[key])}" for key in flatten(SCHEMA)]
    cfg = verl_compose(plain)  # struct mode: any key verl lacks raises ConfigCompositionException
    for key in flatten(SCHEMA):
        assert _select(cfg, key) == defaults[key], key


def test_demo_defaults_are_verls_except_where_documented(verl_compose: Callable[[list[str]], Any]) -> None:
    cfg = verl_compose([])
    demo = flatten(compose([]).tree)
    for key in flatten(SCHEMA):
        verl_default = _select(cfg, key)
        if key in DEMO_DEFAULTS:
            assert DEMO_DEFAULTS[key] == (demo[key], verl_default), key
        else:
            assert demo[key] == verl_default, key


PLUS_KEYS = (
    "trainer.seed=1",
    "trainer.fault.nan_at_step=3",
    "trainer.fault.exit_code=3",
    "reward.reward_kwargs.max_resp_len=20",
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=-1.0",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=/tmp/m.jsonl",
)


def test_plus_keys_need_a_plus_in_both(verl_compose: Callable[[list[str]], Any]) -> None:
    from hydra.errors import ConfigCompositionException

    base = verl_compose([])
    for override in PLUS_KEYS:
        key = override.partition("=")[0]
        parent, _, leaf = key.rpartition(".")
        node = _select(base, parent)
        assert not (isinstance(node, dict) and leaf in node), f"{key} is in verl's tree: it must not need '+'"
        with pytest.raises(OverrideError, match=f"Could not override '{key}'"):
            compose([override])
    with pytest.raises(ConfigCompositionException) as verl_error:
        verl_compose([PLUS_KEYS[0]])
    with pytest.raises(OverrideError) as demo_error:
        compose([PLUS_KEYS[0]])
    assert str(demo_error.value).splitlines()[:2] == str(verl_error.value).splitlines()[:2]
    for prefix in ("+", "++"):
        verl_compose([prefix + override for override in PLUS_KEYS])
        compose([prefix + override for override in PLUS_KEYS])


def test_append_to_an_existing_key_fails_in_both(verl_compose: Callable[[list[str]], Any]) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as verl_error:
        verl_compose(["+trainer.save_freq=3"])
    with pytest.raises(OverrideError) as demo_error:
        compose(["+trainer.save_freq=3"])
    assert str(demo_error.value).strip() == str(verl_error.value).strip()


def test_scenario_command_lines_compose_in_verl(verl_compose: Callable[[list[str]], Any], tmp_path: Path) -> None:
    """Every key any scenario (or the rescue) uses, with its prefix, composes in verl - in one call."""
    files = scenarios.RunFiles(tmp_path)
    rescue = scenarios.get("seed_settings").with_extra(*scenarios.rescue_overrides(tmp_path / "global_step_5", 50))
    first_use: dict[str, str] = {}
    for scenario in [*scenarios.SCENARIOS.values(), rescue]:
        for override in scenario.arguments(files):
            first_use.setdefault(override.partition("=")[0], override)
    cfg = verl_compose(list(first_use.values()))
    assert _select(cfg, "trainer.fault.exit_code") == 3


@pytest.mark.parametrize(
    "override",
    [
        "a=1",
        "a=1e-6",
        "a=5e-5",
        "a=.5",
        "a=1_000",
        "a=true",
        "a=False",
        "a=null",
        "a=abc",
        "a=1e-6x",
        "a='5'",
        "a=[console,file]",
        'a=["console","file"]',
        'a=\'["console","file"]\'',
        "a=[1, 2.5, null]",
        "a={x: 1}",
        "a=/ckpt/global_step_5/",
        "a=",
    ],
)
def test_values_parse_like_hydras_grammar(verl_dir: Path, override: str) -> None:
    if importlib.util.find_spec("hydra") is None:
        missing("hydra-core is not installed (contract tests need: pip install hydra-core)")
    parser = importlib.import_module("hydra.core.override_parser.overrides_parser").OverridesParser.create()
    expected = parser.parse_override(override).value()
    value = parse_override(override).value
    assert value == expected and type(value) is type(expected)


def test_accepted_keys_snapshot() -> None:
    """The accepted plain keys, so a change to the interface shows up in review."""
    keys = set(flatten(SCHEMA))
    assert {
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.checkpoint.load_contents",
        "actor_rollout_ref.rollout.temperature",
        "algorithm.norm_adv_by_std_in_grpo",
        "trainer.resume_from_path",
        "trainer.max_actor_ckpt_to_keep",
    } <= keys
    assert json.loads(json.dumps(sorted(keys))) == sorted(keys)
