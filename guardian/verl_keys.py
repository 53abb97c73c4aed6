"""The verl 0.9.1 config keys the guardian reads or sets: defaults, value rules, and whether a key needs ``+``.

verl checks no types or ranges (facts §4, §10), so every value the guardian writes is checked here first.
Defaults are verl 0.9.1's (a test compares them with the wheel); ``compose_check`` composes a final override
list with verl's own Hydra tree."""

from __future__ import annotations

import importlib
import importlib.util
import math
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from guardian.hydra_compose import REFUSED
from guardian.hydra_overrides import OverrideSyntaxError, parse

__all__ = [
    "VERL_KEYS",
    "KeySpec",
    "PatchError",
    "compose_check",
    "defaults",
    "needs_plus",
    "spec_for",
    "validate",
    "verl_config_dir",
    "yaml_keys",
]

ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."
ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars."
OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg."
KL_LOSS_TYPES = frozenset({"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"})
CKPT_CONTENTS = frozenset({"model", "optimizer", "extra", "hf_model"})
LOGGERS = frozenset(  # verl/utils/tracking.py Tracking.supported_backend
    {"wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "console", "clearml", "trackio", "file", "rl_insight"}
)
# keys absent from verl's YAML: Hydra refuses a plain ``key=value`` for them (facts §4)
PLUS_KEYS = frozenset(
    {
        "trainer.wandb_proxy",
        "trainer.remove_previous_ckpt_in_save",
        "ray_kwargs.ray_init.address",
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
    }
)
PLUS_PREFIXES = (
    ENV_VARS,
    "reward.reward_kwargs.",
    "reward.custom_reward_function.reward_kwargs.",
    "trainer.rl_insight.",
)

Kind = Literal["float", "int", "bool", "str", "list"]


class PatchError(ValueError):
    """A patch or launch command the guardian refuses; the message names the key, the value and the rule."""


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One key: its type, verl default, allowed range or values, and who may set it."""

    key: str
    kind: Kind
    default: object
    description: str
    in_yaml: bool = True  # False: verl's YAML lacks it, so it is written ``++key=value``
    patchable: bool = True  # False: managed by the guardian itself (resume, logging, paths) or read-only
    nullable: bool = False
    low: float | None = None
    low_open: bool = False  # True: value > low, else value >= low
    high: float | None = None
    choices: frozenset[str] | None = None  # allowed strings, or allowed list items for kind="list"
    extra: Callable[[object], str | None] | None = None  # further rule: returns what is wrong, or None

    def rule(self) -> str:
        """The rule in words, for error messages."""
        kinds = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string"}
        parts = [kinds.get(self.kind, "a list")]
        if self.low is not None and self.high is not None:
            parts.append(f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]")
        elif self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.choices is not None:
            what = "items from" if self.kind == "list" else "one of"
            parts.append(f"{what} {sorted(self.choices)}")
        if self.nullable:
            parts.append("or null")
        return " ".join(parts) + f" (verl 0.9.1 default {self.default!r})"


def _resume_path_rule(value: object) -> str | None:
    text = str(value)
    if "global_step_" not in text or text.endswith("/"):
        return "a path containing 'global_step_' with no trailing slash (verl parses the step from its end)"
    if not text.rsplit("global_step_", 1)[1].isdigit():
        return "a path ending in global_step_<int>"
    return None


def _needs_model(value: object) -> str | None:
    return None if isinstance(value, list) and "model" in value else "a list that includes 'model'"


def _kl_type(value: object) -> str | None:
    return None if str(value).removesuffix("+") in KL_LOSS_TYPES else f"one of {sorted(KL_LOSS_TYPES)}, optionally +"


def _spec(key: str, kind: Kind, default: object, description: str, **kw: Any) -> tuple[str, KeySpec]:
    return key, KeySpec(key, kind, default, description, **kw)


VERL_KEYS: Mapping[str, KeySpec] = dict(
    [
        _spec(ACTOR + "optim.lr", "float", 1e-6, "actor learning rate", low=0, low_open=True),
        _spec(ACTOR + "optim.clip_grad", "float", 1.0, "gradient-norm clip (the one FSDP reads)", low=0, low_open=True),
        _spec(ACTOR + "use_kl_loss", "bool", False, "KL-to-reference loss (adds the ref model)"),
        _spec(ACTOR + "kl_loss_coef", "float", 0.001, "KL loss coefficient", low=0),
        _spec(ACTOR + "kl_loss_type", "str", "low_var_kl", "KL estimator", extra=_kl_type),
        _spec(ACTOR + "entropy_coeff", "float", 0.0, "entropy bonus (loss -= coeff * entropy)", low=0, high=0.1),
        _spec(ACTOR + "clip_ratio_low", "float", 0.2, "PPO clip epsilon low", low=0, low_open=True, high=1),
        _spec(ACTOR + "clip_ratio_high", "float", 0.2, "PPO clip epsilon high", low=0, low_open=True, high=1),
        _spec(
            ACTOR + "checkpoint.load_contents",
            "list",
            ["model", "optimizer", "extra"],
            "what resume loads; [model] = fresh optimizer and LR scheduler",
            choices=CKPT_CONTENTS,
            extra=_needs_model,
            patchable=False,
        ),
        _spec("algorithm.kl_ctrl.kl_coef", "float", 0.001, "in-reward KL coefficient", low=0),
        _spec("algorithm.kl_ctrl.type", "str", "fixed", "KL controller", choices=frozenset({"fixed", "adaptive"})),
        _spec("algorithm.use_kl_in_reward", "bool", False, "KL penalty in the reward (adds the ref model)"),
        _spec(ROLLOUT + "temperature", "float", 1.0, "sampling temperature", low=0, low_open=True, high=2),
        _spec(ROLLOUT + "n", "int", 1, "samples per prompt", low=1),
        _spec("data.max_response_length", "int", 512, "response token budget", low=1),
        _spec("data.train_batch_size", "int", 1024, "prompts per step", low=1, patchable=False),
        _spec("trainer.save_freq", "int", -1, "checkpoint every N steps (-1 never)", low=-1),
        _spec("trainer.test_freq", "int", -1, "validate every N steps (-1 never)", low=-1, patchable=False),
        _spec(
            "trainer.max_actor_ckpt_to_keep",
            "int",
            None,
            "checkpoints verl keeps (null: all)",
            low=1,
            nullable=True,
            patchable=False,
        ),
        _spec(
            "trainer.total_training_steps",
            "int",
            None,
            "last step (null: from the dataset)",
            low=1,
            nullable=True,
            patchable=False,
        ),
        _spec("trainer.validation_data_dir", "str", None, "validation dump dir", nullable=True, patchable=False),
        _spec(
            "trainer.resume_mode",
            "str",
            "auto",
            "how to resume",
            choices=frozenset({"auto", "disable", "resume_path"}),
            patchable=False,
        ),
        _spec(
            "trainer.resume_from_path",
            "str",
            None,
            "checkpoint to resume",
            nullable=True,
            extra=_resume_path_rule,
            patchable=False,
        ),
        _spec(
            "trainer.default_local_dir",
            "str",
            "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
            "checkpoint dir",
            patchable=False,
        ),
        _spec("trainer.project_name", "str", "verl_examples", "project name", patchable=False),
        _spec("trainer.experiment_name", "str", "gsm8k", "experiment name", patchable=False),
        _spec("trainer.logger", "list", ["console", "wandb"], "logging backends", choices=LOGGERS, patchable=False),
        _spec("trainer.rollout_data_dir", "str", None, "rollout dump dir", nullable=True, patchable=False),
        _spec("trainer.wandb_proxy", "str", None, "wandb proxy", nullable=True, in_yaml=False, patchable=False),
        _spec("reward.reward_manager.name", "str", "naive", "reward manager (dapo = overlong shaping)"),
        _spec(
            "reward.reward_kwargs.max_resp_len", "int", None, "DAPO max_resp_len", low=1, nullable=True, in_yaml=False
        ),
        _spec(OVERLONG + "enable", "bool", None, "DAPO overlong penalty on", nullable=True, in_yaml=False),
        _spec(OVERLONG + "len", "int", None, "DAPO overlong buffer (tokens)", low=1, nullable=True, in_yaml=False),
        _spec(OVERLONG + "penalty_factor", "float", None, "DAPO overlong penalty", low=0, nullable=True, in_yaml=False),
        _spec(OVERLONG + "log", "bool", None, "log overlong reward", nullable=True, in_yaml=False),
    ]
)


def needs_plus(key: str) -> bool:
    """True when verl's YAML lacks ``key``, so it must be written ``+key=…`` or ``++key=…``."""
    spec = VERL_KEYS.get(key)
    if spec is not None:
        return not spec.in_yaml
    return key in PLUS_KEYS or key.startswith(PLUS_PREFIXES)


def spec_for(key: str) -> KeySpec | None:
    """The spec of ``key``; Ray env vars (``ray_kwargs.ray_init.runtime_env.env_vars.NAME``) are strings."""
    spec = VERL_KEYS.get(key)
    if spec is None and key.startswith(ENV_VARS) and key[len(ENV_VARS) :].isidentifier():
        spec = KeySpec(key, "str", None, "environment variable of the Ray job", in_yaml=False, patchable=False)
    return spec


def yaml_keys() -> frozenset[str]:
    """Keys present in verl's YAML, written as plain ``key=value``."""
    return frozenset(k for k, s in VERL_KEYS.items() if s.in_yaml)


def defaults() -> dict[str, object]:
    """verl 0.9.1's default of every known key (lists copied)."""
    return {k: list(s.default) if isinstance(s.default, list) else s.default for k, s in VERL_KEYS.items()}


def validate(key: str, value: object) -> object:
    """``value`` normalised (int → float for float keys, tuple → list) or PatchError naming key, value and rule."""
    spec = spec_for(key)
    if spec is None:
        raise PatchError(f"{key}: unknown key; the guardian only sets keys it knows ({', '.join(sorted(VERL_KEYS))})")

    def bad(why: str | None = None) -> PatchError:
        return PatchError(f"{key}={value!r} is invalid: must be {why or spec.rule()}")

    if value is None:
        if spec.nullable:
            return None
        raise bad()
    out: object
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        out = value
    elif spec.kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad()
        if spec.kind == "int" and not float(value).is_integer():
            raise bad()
        out = float(value) if spec.kind == "float" else int(value)
        number = float(value)
        if spec.low is not None and (number <= spec.low if spec.low_open else number < spec.low):
            raise bad()
        if spec.high is not None and number > spec.high:
            raise bad()
    elif spec.kind == "str":
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and spec.choices is None
            and spec.extra is None
        ):
            value = str(value)  # Hydra types `experiment_name=7` as an int; verl formats it as text
        if not isinstance(value, str) or not value:
            raise bad()
        if spec.choices is not None and value not in spec.choices:
            raise bad()
        out = value
    else:
        if isinstance(value, str):  # verl also takes a single name (trainer.logger=console)
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad()
        if spec.choices is not None and not set(value) <= spec.choices:
            raise bad()
        out = list(value)
    if spec.extra is not None and (why := spec.extra(out)) is not None:
        raise bad(why)
    return out


def verl_config_dir() -> Path | None:
    """``verl/trainer/config`` of the installed wheel, found without importing verl (which needs torch)."""
    try:
        found = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    for location in (found.submodule_search_locations or []) if found else []:
        config = Path(location) / "trainer" / "config"
        if (config / "ppo_trainer.yaml").is_file():
            return config
    return None


COMPOSE_TIMEOUT_S = 120.0  # a child interpreter that imports Hydra and composes verl's tree: a few seconds


def compose_check(overrides: Sequence[str], *, config_name: str = "ppo_trainer") -> str:
    """Compose ``overrides`` with verl's Hydra config (struct mode: unknown keys, ``+`` misuse) when verl and
    hydra-core are installed - in a child interpreter (``guardian.hydra_compose``), so that what the compose loads
    does not stay in the guardian's memory; else check them against VERL_KEYS only. Returns what was checked;
    PatchError on failure."""
    config_dir = verl_config_dir()
    if config_dir is None or importlib.util.find_spec("hydra") is None:
        _check_known(overrides)
        return "verl or hydra-core not installed: overrides checked against the guardian's verl 0.9.1 key list only"
    tree = f"verl's Hydra config ({config_dir}/{config_name}.yaml)"
    request = orjson.dumps({"config_dir": str(config_dir), "config_name": config_name, "overrides": list(overrides)})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "guardian.hydra_compose"],
            input=request,
            capture_output=True,
            timeout=COMPOSE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise PatchError(f"composing the overrides with {tree} took over {COMPOSE_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise PatchError(f"could not start {sys.executable} to compose the overrides with {tree}: {exc}") from None
    if done.returncode == 0:
        return f"composed with verl's Hydra config {config_dir}/{config_name}.yaml"
    said = done.stdout.decode("utf-8", errors="replace").strip()
    if done.returncode == REFUSED and said:
        raise PatchError(f"{tree} refuses the overrides: {said}")
    failure = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
    raise PatchError(
        f"the compose check with {tree} failed (exit {done.returncode}): {failure[-1] if failure else 'no output'}"
    )


def _check_known(overrides: Sequence[str]) -> None:
    for text in overrides:
        try:
            override = parse(text)
        except OverrideSyntaxError as exc:
            raise PatchError(str(exc)) from None
        if override.op == "~" or spec_for(override.key) is None:
            continue
        validate(override.key, override.value)
        plus = needs_plus(override.key)
        if plus and override.op == "":
            raise PatchError(f"{text}: {override.key} is not in verl's YAML; write ++{override.key}=…")
        if not plus and override.op == "+":
            raise PatchError(f"{text}: {override.key} already exists in verl's YAML; drop the '+'")
