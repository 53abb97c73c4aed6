"""The composed configuration as typed settings, checked once at start-up.

Every value the demo uses is checked up front (verl checks little and fails later on a GPU); a bad one exits 1
naming its key. Semantics follow verl (warmup from ``lr_warmup_steps`` or its ratio, ``clip_ratio_low/high``
falling back to ``clip_ratio``, ``load_contents`` defaulting to ``save_contents``), except that the data order is
always seeded (``data.seed``, else ``+trainer.seed``, else the rollout seed) so the demo stays deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guardian.demo.config import (
    CHECKPOINT_CONTENTS,
    IGNORED_LOGGERS,
    KL_TYPES,
    SUPPORTED_LOGGERS,
    ConfigError,
    choice,
    flag,
    get,
    names,
    number,
    text,
)
from guardian.demo.overrides import Tree, flatten
from guardian.demo.policy import LossConfig
from guardian.demo.task import OverlongBuffer

ACTOR = "actor_rollout_ref.actor"


@dataclass(frozen=True, slots=True)
class Faults:
    """``+trainer.fault.*``: failures injected for tests (None = off)."""

    nan_at_step: int | None = None
    hang_at_step: int | None = None
    crash_at_step: int | None = None
    exit_code: int = 1
    slow_steps: float = 0.0
    # seconds each checkpoint save takes, its folder growing all along (a big checkpoint streaming to disk)
    slow_save_s: float = 0.0
    # seconds each validation takes, with nothing written meanwhile (verl's many-turn validation)
    slow_validation_s: float = 0.0
    # a transient fault (a flaky node, a bad batch) strikes once per checkpoint dir: it leaves a marker
    # file there, and a later launch that finds the marker is spared
    transient: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the trainer reads, typed."""

    train_batch_size: int
    max_response_length: int
    data_seed: int
    rollout_seed: int
    lr: float
    clip_grad: float
    warmup_steps: int
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, float]
    loss: LossConfig
    ppo_mini_batch_size: int
    ppo_epochs: int
    save_contents: tuple[str, ...]
    load_contents: tuple[str, ...]
    n: int
    norm_adv_by_std: bool
    overlong: OverlongBuffer | None
    reward_fn_path: str | None
    reward_fn_name: str
    total_epochs: int
    total_training_steps: int | None
    project_name: str
    experiment_name: str
    loggers: tuple[str, ...]
    ignored_loggers: tuple[str, ...]
    rollout_data_dir: str | None
    save_freq: int
    test_freq: int
    val_before_train: bool
    default_local_dir: str
    resume_mode: str
    resume_from_path: Any
    max_actor_ckpt_to_keep: int | None
    faults: Faults = field(default_factory=Faults)
    env_vars: dict[str, str] = field(default_factory=dict)

    def scheduler_warmup(self, total_steps: int) -> int:
        """verl's ``num_warmup_steps``: the explicit count, else the ratio of the total."""
        return self.warmup_steps if self.warmup_steps > 0 else int(self.warmup_ratio * total_steps)


def _positive(value: int, key: str) -> int:
    if value < 1:
        raise ConfigError(f"{key} must be >= 1, got {value}")
    return value


def _overlong(tree: Tree) -> OverlongBuffer | None:
    manager = choice(tree, "reward.reward_manager.name", ("naive", "dapo"))
    cfg = get(tree, "reward.reward_kwargs.overlong_buffer_cfg")
    if manager != "dapo" or not isinstance(cfg, dict) or not cfg.get("enable", False):
        return None
    prefix = "reward.reward_kwargs"
    length = number(tree, f"{prefix}.overlong_buffer_cfg.len", integer=True)
    max_len = number(tree, f"{prefix}.max_resp_len", integer=True)
    if length <= 0 or max_len < length:
        raise ConfigError("overlong_buffer_cfg.len must be > 0 and <= reward.reward_kwargs.max_resp_len (as in verl)")
    factor = float(number(tree, f"{prefix}.overlong_buffer_cfg.penalty_factor"))
    return OverlongBuffer(length=length, penalty_factor=factor, max_resp_len=max_len)


def _faults(tree: Tree) -> Faults:
    def opt(name: str) -> int | None:
        value: int | None = number(tree, f"trainer.fault.{name}", integer=True, allow_none=True)
        return value

    code = opt("exit_code")
    slow = number(tree, "trainer.fault.slow_steps", allow_none=True)
    slow_save = number(tree, "trainer.fault.slow_save_s", allow_none=True)
    slow_validation = number(tree, "trainer.fault.slow_validation_s", allow_none=True)
    return Faults(
        nan_at_step=opt("nan_at_step"),
        hang_at_step=opt("hang_at_step"),
        crash_at_step=opt("crash_at_step"),
        exit_code=1 if code is None else code,
        slow_steps=0.0 if slow is None else float(slow),
        slow_save_s=0.0 if slow_save is None else float(slow_save),
        slow_validation_s=0.0 if slow_validation is None else float(slow_validation),
        transient=tree.get("trainer", {}).get("fault", {}).get("transient") is True,
    )


def _loss(tree: Tree) -> LossConfig:
    clip = float(number(tree, f"{ACTOR}.clip_ratio"))
    low = number(tree, f"{ACTOR}.clip_ratio_low", allow_none=True)
    high = number(tree, f"{ACTOR}.clip_ratio_high", allow_none=True)
    temperature = float(number(tree, "actor_rollout_ref.rollout.temperature"))
    if temperature <= 0:
        raise ConfigError(f"actor_rollout_ref.rollout.temperature must be > 0, got {temperature}")
    clip_c = float(number(tree, f"{ACTOR}.clip_ratio_c"))
    if clip_c <= 1.0:
        raise ConfigError(f"{ACTOR}.clip_ratio_c must be > 1.0 (dual-clip PPO), got {clip_c}")
    return LossConfig(
        clip_ratio_low=clip if low is None else float(low),
        clip_ratio_high=clip if high is None else float(high),
        clip_ratio_c=clip_c,
        entropy_coeff=float(number(tree, f"{ACTOR}.entropy_coeff")),
        use_kl_loss=flag(tree, f"{ACTOR}.use_kl_loss"),
        kl_loss_coef=float(number(tree, f"{ACTOR}.kl_loss_coef")),
        kl_loss_type=choice(tree, f"{ACTOR}.kl_loss_type", KL_TYPES),
        temperature=temperature,
    )


def from_tree(tree: Tree) -> Settings:
    """Typed settings from a composed tree; ``ConfigError`` names the first bad key."""
    choice(tree, "algorithm.adv_estimator", ("grpo",))
    choice(tree, f"{ACTOR}.loss_agg_mode", ("token-mean",))
    choice(tree, f"{ACTOR}.optim.lr_scheduler_type", ("constant",))
    if get(tree, "algorithm.use_kl_in_reward"):
        raise ConfigError("algorithm.use_kl_in_reward=true is not supported by the demo trainer (use use_kl_loss)")
    batch = _positive(number(tree, "data.train_batch_size", integer=True), "data.train_batch_size")
    mini = _positive(number(tree, f"{ACTOR}.ppo_mini_batch_size", integer=True), f"{ACTOR}.ppo_mini_batch_size")
    if batch % mini:
        raise ConfigError(f"data.train_batch_size ({batch}) must be a multiple of ppo_mini_batch_size ({mini})")
    loggers = names(tree, "trainer.logger", SUPPORTED_LOGGERS + IGNORED_LOGGERS)
    seed = number(tree, "trainer.seed", integer=True, allow_none=True)
    rollout_seed = number(tree, "actor_rollout_ref.rollout.seed", integer=True) if seed is None else seed
    data_seed = number(tree, "data.seed", integer=True, allow_none=True)
    betas = get(tree, f"{ACTOR}.optim.betas")
    if not (isinstance(betas, list) and len(betas) == 2 and all(isinstance(b, int | float) for b in betas)):
        raise ConfigError(f"{ACTOR}.optim.betas must be a list of two numbers, got {betas!r}")
    resume_mode = choice(tree, "trainer.resume_mode", ("auto", "disable", "resume_path"))
    env = get(tree, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    return Settings(
        train_batch_size=batch,
        max_response_length=_positive(number(tree, "data.max_response_length", integer=True), "max_response_length"),
        data_seed=rollout_seed if data_seed is None else data_seed,
        rollout_seed=rollout_seed,
        lr=float(number(tree, f"{ACTOR}.optim.lr")),
        clip_grad=float(number(tree, f"{ACTOR}.optim.clip_grad")),
        warmup_steps=number(tree, f"{ACTOR}.optim.lr_warmup_steps", integer=True),
        warmup_ratio=float(number(tree, f"{ACTOR}.optim.lr_warmup_steps_ratio")),
        weight_decay=float(number(tree, f"{ACTOR}.optim.weight_decay")),
        betas=(float(betas[0]), float(betas[1])),
        loss=_loss(tree),
        ppo_mini_batch_size=mini,
        ppo_epochs=_positive(number(tree, f"{ACTOR}.ppo_epochs", integer=True), f"{ACTOR}.ppo_epochs"),
        save_contents=names(tree, f"{ACTOR}.checkpoint.save_contents", CHECKPOINT_CONTENTS),
        load_contents=names(tree, f"{ACTOR}.checkpoint.load_contents", CHECKPOINT_CONTENTS),
        n=_positive(number(tree, "actor_rollout_ref.rollout.n", integer=True), "actor_rollout_ref.rollout.n"),
        norm_adv_by_std=flag(tree, "algorithm.norm_adv_by_std_in_grpo"),
        overlong=_overlong(tree),
        reward_fn_path=text(tree, "reward.custom_reward_function.path", allow_none=True),
        reward_fn_name=text(tree, "reward.custom_reward_function.name"),
        total_epochs=number(tree, "trainer.total_epochs", integer=True),
        total_training_steps=number(tree, "trainer.total_training_steps", integer=True, allow_none=True),
        project_name=text(tree, "trainer.project_name"),
        experiment_name=text(tree, "trainer.experiment_name"),
        loggers=tuple(name for name in loggers if name in SUPPORTED_LOGGERS),
        ignored_loggers=tuple(name for name in loggers if name not in SUPPORTED_LOGGERS),
        rollout_data_dir=text(tree, "trainer.rollout_data_dir", allow_none=True),
        save_freq=number(tree, "trainer.save_freq", integer=True),
        test_freq=number(tree, "trainer.test_freq", integer=True),
        val_before_train=flag(tree, "trainer.val_before_train"),
        default_local_dir=text(tree, "trainer.default_local_dir"),
        resume_mode=resume_mode,
        resume_from_path=get(tree, "trainer.resume_from_path"),
        max_actor_ckpt_to_keep=number(tree, "trainer.max_actor_ckpt_to_keep", integer=True, allow_none=True),
        faults=_faults(tree),
        env_vars={k: str(v) for k, v in flatten(env).items()} if isinstance(env, dict) else {},
    )
