"""The demo trainer's configuration: verl 0.9.1's key names and defaults, the demo's typed view.

``BASE`` is the part of verl's config tree the demo accepts with ``key=value``; ``DEMO_DEFAULTS`` lists where the
demo departs from verl's defaults (verl's value beside it); ``INERT`` keys are accepted with no effect. Keys verl's
YAML lacks need ``+`` (struct mode): ``+trainer.seed``, ``+trainer.fault.*``, ``+reward.reward_kwargs.*`` and
``+ray_kwargs.ray_init.runtime_env.env_vars.*`` (applied to the environment); other ``+`` keys warn and are ignored.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from guardian.demo.overrides import Tree, apply_overrides, flatten, lookup, parse_override

SUPPORTED_LOGGERS = ("console", "file")
# accepted by verl's Tracking; the demo has no such backend and ignores them with a warning line
IGNORED_LOGGERS = ("wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "clearml", "trackio", "rl_insight")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
KL_TYPES = ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs")
FAULT_KEYS = (
    "nan_at_step",
    "hang_at_step",
    "crash_at_step",
    "exit_code",
    "slow_steps",
    "slow_save_s",
    "slow_validation_s",
    "transient",
)

# key -> (demo default, verl 0.9.1 default): where the demo departs from verl's default, and why
DEMO_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "data.train_batch_size": (16, 1024),  # 48 prompts in the toy dataset
    "data.max_response_length": (16, 512),  # codes are at most 6 letters
    "actor_rollout_ref.actor.ppo_mini_batch_size": (4, 256),  # 4 updates per step
    "actor_rollout_ref.rollout.n": (16, 1),  # GRPO needs groups
    "algorithm.adv_estimator": ("grpo", "gae"),  # the only estimator the demo implements
}

BASE: Tree = {
    "data": {
        "train_batch_size": 16,
        "max_response_length": 16,
        "seed": None,
        "shuffle": True,
    },
    "actor_rollout_ref": {
        "actor": {
            "optim": {
                "lr": 1e-6,
                "clip_grad": 1.0,
                "lr_warmup_steps": -1,
                "lr_warmup_steps_ratio": 0.0,
                "weight_decay": 0.01,
                "betas": [0.9, 0.999],
                "lr_scheduler_type": "constant",
            },
            "use_kl_loss": False,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
            "entropy_coeff": 0,
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "ppo_mini_batch_size": 4,
            "ppo_epochs": 1,
            "checkpoint": {"save_contents": ["model", "optimizer", "extra"], "load_contents": "${.save_contents}"},
        },
        "rollout": {"n": 16, "temperature": 1.0, "seed": 42},
    },
    "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True},
    "reward": {
        "reward_manager": {"name": "naive"},
        "custom_reward_function": {"path": None, "name": "compute_score"},
    },
    "trainer": {
        "total_epochs": 30,
        "total_training_steps": None,
        "project_name": "verl_examples",
        "experiment_name": "gsm8k",
        "logger": ["console", "wandb"],
        "rollout_data_dir": None,
        "save_freq": -1,
        "test_freq": -1,
        "val_before_train": True,
        "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "resume_mode": "auto",
        "resume_from_path": None,
        "max_actor_ckpt_to_keep": None,
    },
}

INERT: Tree = {
    "data": {"train_files": "~/data/rlhf/gsm8k/train.parquet", "val_files": "~/data/rlhf/gsm8k/test.parquet"}
    | {"max_prompt_length": 512, "prompt_key": "prompt", "reward_fn_key": "data_source"},
    "actor_rollout_ref": {
        "model": {"path": "~/models/deepseek-llm-7b-chat"},
        "actor": {"ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": False, "strategy": "fsdp"},
        "rollout": {
            "name": "???",
            "log_prob_micro_batch_size_per_gpu": None,
            "tensor_model_parallel_size": 2,
            "gpu_memory_utilization": 0.5,
            "calculate_log_probs": True,
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": None},
    },
    "algorithm": {"use_kl_in_reward": False},
    "trainer": {
        "nnodes": 1,
        "n_gpus_per_node": 8,
        "critic_warmup": 0,
        "balance_batch": True,
        "use_v1": True,
        "device": "cuda",
        "log_val_generations": 0,
        "validation_data_dir": None,
        "del_local_ckpt_after_load": False,
        "default_hdfs_dir": None,
    },
}


def _merge(a: Tree, b: Tree) -> Tree:
    out = copy.deepcopy(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


SCHEMA: Tree = _merge(BASE, INERT)


def accepted_keys() -> list[str]:
    """Every dotted key a plain override may name (each exists in verl's tree)."""
    return sorted(flatten(SCHEMA))


class ConfigError(ValueError):
    """A value the demo cannot run with; the message names the key."""


@dataclass(frozen=True, slots=True)
class Composed:
    """The composed tree (with ``+`` keys) and the warnings to print before training."""

    tree: Tree
    warnings: list[str]


def compose(argv: list[str]) -> Composed:
    """Apply command-line overrides to ``SCHEMA`` and resolve the demo's two interpolations."""
    tree = apply_overrides(SCHEMA, [parse_override(arg) for arg in argv])
    warnings: list[str] = []
    ckpt = tree["actor_rollout_ref"]["actor"]["checkpoint"]
    if ckpt["load_contents"] == "${.save_contents}":
        ckpt["load_contents"] = copy.deepcopy(ckpt["save_contents"])
    trainer = tree["trainer"]
    if trainer["default_local_dir"] == BASE["trainer"]["default_local_dir"]:
        trainer["default_local_dir"] = f"checkpoints/{trainer['project_name']}/{trainer['experiment_name']}"
    known_plus = (
        "trainer.seed",
        "trainer.fault.",
        "reward.reward_kwargs.",
        "ray_kwargs.ray_init.runtime_env.env_vars.",
    )
    for key in flatten(tree):
        if lookup(SCHEMA, key)[0] or key.startswith(known_plus):
            continue
        warnings.append(f"WARN: the demo trainer ignores '{key}' (not used on CPU)")
    for key in flatten(tree.get("trainer", {}).get("fault", {}) or {}):
        if key not in FAULT_KEYS:
            raise ConfigError(f"unknown fault '+trainer.fault.{key}'; known: {', '.join(FAULT_KEYS)}")
    return Composed(tree=tree, warnings=warnings)


def get(tree: Tree, key: str, default: Any = None) -> Any:
    present, value = lookup(tree, key)
    return value if present else default


def number(tree: Tree, key: str, *, integer: bool = False, allow_none: bool = False) -> Any:
    """The value at ``key`` checked to be a number (an int when ``integer``), or None when allowed."""
    value = get(tree, key)
    if value is None and allow_none:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{key} must be {kind}, got {value!r}")
    return value


def flag(tree: Tree, key: str) -> bool:
    value = get(tree, key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def text(tree: Tree, key: str, *, allow_none: bool = False) -> Any:
    value = get(tree, key)
    if value is None and allow_none:
        return None
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return str(value)


def choice(tree: Tree, key: str, allowed: tuple[str, ...]) -> str:
    value = text(tree, key)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not supported by the demo trainer; use one of: {', '.join(allowed)}")
    return str(value)


def names(tree: Tree, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A list of names (``[model,optimizer]``); a bare string counts as one name, as in verl."""
    value = get(tree, key)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{key} must be a list of names, got {value!r}")
    unknown = [i for i in items if i not in allowed]
    if unknown:
        raise ConfigError(f"{key}: {', '.join(unknown)} not supported; use some of: {', '.join(allowed)}")
    return tuple(items)
