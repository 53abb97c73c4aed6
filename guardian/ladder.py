"""The remediation ladder (guardian.yaml ``remediation``): per incident kind, the rungs tried in order, each a
list of changes to verl keys with reason and source. ``patch.plan_patch`` applies a rung to a launch command.

Changes apply to the run's *effective* config, and a relapse's next rung compounds on the previous one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from guardian import verl_keys
from guardian.verl_keys import ACTOR, ROLLOUT, validate

LR = ACTOR + "optim.lr"
LOAD_CONTENTS = ACTOR + "checkpoint.load_contents"
ENT, CLIP_HIGH, CLIP_GRAD, TEMP = (
    ACTOR + "entropy_coeff",
    ACTOR + "clip_ratio_high",
    ACTOR + "optim.clip_grad",
    ROLLOUT + "temperature",
)
KL_ON, KL_COEF = ACTOR + "use_kl_loss", ACTOR + "kl_loss_coef"
MAX_RESPONSE = "data.max_response_length"
OVERLONG_ON, OVERLONG_FACTOR = verl_keys.OVERLONG + "enable", verl_keys.OVERLONG + "penalty_factor"
KL_IN_REWARD, KL_REWARD_COEF = "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef"
INCIDENT_KINDS = (
    "entropy_collapse", "egr_collapse", "entropy_explosion", "kl_drift", "logprob_decline", "reward_collapse",
    "length_collapse", "length_explosion", "truncation", "grad_spike", "non_finite",
)  # fmt: skip
Value = bool | int | float | str | list[str] | None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class Change(_Model):
    """One key change; exactly one of set / multiply / at_least / at_most."""

    key: str = Field(description="verl key, dotted, without '+' (a key of guardian.verl_keys that rungs may set).")
    set: Value = Field(None, description="Set the key to this value.")
    multiply: float | None = Field(None, gt=0, description="Multiply the run's current effective value.")
    at_least: float | None = Field(None, description="Raise the current value to at least this.")
    at_most: float | None = Field(None, description="Lower the current value to at most this.")
    when: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Apply only when these keys' current values (after this rung's earlier changes) equal these.",
    )

    @model_validator(mode="after")
    def _one_operation(self) -> Change:
        ops = [op for op in ("set", "multiply", "at_least", "at_most") if op in self.model_fields_set]
        if len(ops) != 1:
            raise ValueError(f"{self.key}: give exactly one of set, multiply, at_least, at_most (got {ops or 'none'})")
        spec = verl_keys.spec_for(self.key)
        if spec is None or not spec.patchable:
            why = "unknown key" if spec is None else "managed by the guardian itself (resume, logging, paths)"
            raise ValueError(f"{self.key}: {why}; rungs may set: {', '.join(sorted(_patchable()))}")
        if ops[0] == "set":
            validate(self.key, self.set)
        elif spec.kind not in ("float", "int"):
            raise ValueError(f"{self.key} is {spec.kind}: only 'set' applies")
        elif ops[0] != "multiply":
            validate(self.key, self.at_least if ops[0] == "at_least" else self.at_most)
        for key in self.when:
            if verl_keys.spec_for(key) is None:
                raise ValueError(f"when: {key} is not a key the guardian knows")
        return self

    def describe(self) -> str:
        op = next(op for op in ("set", "multiply", "at_least", "at_most") if op in self.model_fields_set)
        return f"{self.key} {op} {getattr(self, op)!r}"


class Rung(_Model):
    """One step of a ladder: what it changes, why, and how far back it rolls."""

    name: str = Field(min_length=1, description="Short name, recorded on the incident.")
    why: str = Field(min_length=1, description="What it changes and why, with the source of each number.")
    changes: tuple[Change, ...] = Field((), description="Key changes, applied in order to the effective config.")
    rollback_extra_checkpoints: int = Field(0, ge=0, description="Skip this many more healthy checkpoints back.")
    reset_optimizer: bool | None = Field(
        None, description="Resume with load_contents=[model]: None = when the LR changes, true = always, false = never."
    )

    @model_validator(mode="after")
    def _lr_needs_reset(self) -> Rung:
        if self.reset_optimizer is False and any(c.key == LR for c in self.changes):
            raise ValueError(f"{self.name}: changes the LR with reset_optimizer=false; verl would ignore the new LR")
        return self


def _patchable() -> list[str]:
    return [k for k, s in verl_keys.VERL_KEYS.items() if s.patchable]


def _c(key: str, op: str, value: Value, **when: bool) -> Change:
    """A change; ``when`` names the KL switches (use_kl_loss=..., use_kl_in_reward=...)."""
    names = {"use_kl_loss": KL_ON, "use_kl_in_reward": KL_IN_REWARD}
    return _if({names[k]: v for k, v in when.items()}, key, op, value)


def _if(when: Mapping[str, bool], key: str, op: str, value: Value) -> Change:
    """A change applied only while the given keys hold these values."""
    return Change.model_validate({"key": key, op: value, "when": dict(when)})


def _kl_on(coef: float) -> list[Change]:
    """KL to the reference at >= coef: the loss term (adds the ref model), or the in-reward one if the run uses it."""
    off = {"use_kl_loss": False, "use_kl_in_reward": False}
    return [
        _c(KL_COEF, "at_least", coef, use_kl_in_reward=False),
        _c(KL_ON, "set", True, **off),
        _c(KL_REWARD_COEF, "at_least", coef, use_kl_in_reward=True),
    ]


def _kl_up(factor: float, floor: float) -> list[Change]:
    """Multiply whichever KL coefficient the run uses (decided from its effective config), to at least ``floor``;
    none: turn it on at ``floor``."""
    off = {"use_kl_loss": False, "use_kl_in_reward": False}
    return [
        _c(KL_COEF, "multiply", factor, use_kl_loss=True),
        _c(KL_COEF, "at_least", floor, use_kl_loss=True),
        _c(KL_REWARD_COEF, "multiply", factor, use_kl_in_reward=True),
        _c(KL_REWARD_COEF, "at_least", floor, use_kl_in_reward=True),
        _c(KL_COEF, "at_least", floor, **off),
        _c(KL_ON, "set", True, **off),
    ]


def _rung(name: str, why: str, changes: Sequence[Change], **kw: object) -> Rung:
    return Rung.model_validate({"name": name, "why": why, "changes": list(changes), **kw})


_BACK = "Roll back one more healthy checkpoint (PaLM/Megatron: restart >= 1 checkpoint before the spike)."
_LR_HALF = _c(LR, "multiply", 0.5)
_CALM = (
    _rung("calm-1", "LR × 0.5 and KL to the reference >= 0.01 (seed tutorial §7.3 rescue: kl 0.01).",
          [_LR_HALF, *_kl_on(0.01)]),
    _rung("calm-2", "LR × 0.5 again (0.25 of the original); KL coefficient × 2 (a run without KL: on at 0.02), §3.9.",
          [_LR_HALF, *_kl_up(2, 0.02)]),
    _rung("calm-3", "LR × 0.5 again. " + _BACK, [_LR_HALF], rollback_extra_checkpoints=1),
)  # fmt: skip
_SPIKE = (
    _rung("spike-1", _BACK + " LR × 0.5 with fresh optimizer state (the moments carry the spike).",
          [_LR_HALF], rollback_extra_checkpoints=1),
    _rung("spike-2", _BACK + " LR × 0.5; grad clip <= 0.5 (verl default 1.0; §3.9 'clip grads').",
          [_LR_HALF, _c(CLIP_GRAD, "at_most", 0.5)], rollback_extra_checkpoints=1),
    _rung("spike-3", _BACK + " LR × 0.5.", [_LR_HALF], rollback_extra_checkpoints=1),
)  # fmt: skip
_CAP = _c(MAX_RESPONSE, "multiply", 1.5)
_SIGN = _if({OVERLONG_ON: True}, OVERLONG_FACTOR, "at_least", 0.0)
_CAP_WHY = (
    "data.max_response_length × 1.5 (verl: a clip_ratio above 0.1 means truncating too much; the rollout's "
    "response_length follows it unless the command sets it); it needs more GPU memory per batch - lower "
    "ppo_micro_batch_size_per_gpu if the relaunch runs out. A DAPO overlong penalty_factor below 0 (it "
    "rewards length) becomes 0. Overlong shaping itself (reward.reward_manager.name=dapo with "
    "reward.reward_kwargs.overlong_buffer_cfg, DAPO: a 4096 buffer of 20480) changes the reward and replaces "
    "a custom reward manager, so it is left to your own ladder."
)
_TRUNCATION = (
    _rung("truncation-1", _CAP_WHY, [_CAP, _SIGN]),
    _rung(
        "truncation-2",
        "data.max_response_length × 1.5 again; entropy bonus off and clip_ratio_high <= 0.2 "
        "(exploration pressure grows responses: verl#1066).",
        [_CAP, _c(ENT, "set", 0.0), _c(CLIP_HIGH, "at_most", 0.2)],
    ),
    _rung("truncation-3", "LR × 0.5. " + _BACK, [_LR_HALF], rollback_extra_checkpoints=1),
)
_LENGTH = (
    _rung("length-1", "What grows responses, undone: entropy bonus off and clip_ratio_high <= 0.2 (verl#1066); a "
          "DAPO overlong penalty_factor below 0 (it rewards length) becomes 0.",
          [_c(ENT, "set", 0.0), _c(CLIP_HIGH, "at_most", 0.2), _SIGN]),
    _rung("length-2", "LR × 0.5; grad clip <= 0.5 (§3.9 'clip grads').", [_LR_HALF, _c(CLIP_GRAD, "at_most", 0.5)]),
    _rung("length-3", "LR × 0.5. " + _BACK, [_LR_HALF], rollback_extra_checkpoints=1),
)  # fmt: skip
DEFAULT_LADDERS: Mapping[str, tuple[Rung, ...]] = {
    "entropy_collapse": (
        _rung("entropy-1",
              "Undo what spends entropy, keep the LR and the optimizer state: temperature >= 1.0 (Skywork-OR1: 0.6 "
              "collapses entropy fast; DAPO runs at 1.0); entropy_coeff >= 0.003 (Skywork-OR1 keeps it in [0, "
              "0.005]; a negative coefficient - entropy as a penalty - becomes a bonus); clip_ratio_high >= 0.28 "
              "(DAPO clip-higher lets low-probability tokens grow).",
              [_c(TEMP, "at_least", 1.0), _c(ENT, "at_least", 0.003), _c(CLIP_HIGH, "at_least", 0.28)]),
        _rung("entropy-2",
              "LR × 0.5 (the seed tutorial's rescue cuts an LR set too high); entropy_coeff >= 0.005 (Skywork-OR1 "
              "cap); KL >= 0.01 with use_kl_loss=true (seed; adds the reference model).",
              [_LR_HALF, _c(ENT, "at_least", 0.005), *_kl_on(0.01)]),
        _rung("entropy-3",
              "LR × 0.5 again (0.25 of the original); temperature >= 1.2 (ProRL); KL coefficient × 2; fresh "
              "optimizer state (ProRL resets it).",
              [_LR_HALF, _c(TEMP, "at_least", 1.2), *_kl_up(2, 0.02)], reset_optimizer=True),
    ),
    "egr_collapse": (
        _rung("egr-1",
              "Groups with identical rewards give no gradient: temperature >= 1.0 (Skywork-OR1, DAPO), LR × 0.5, "
              "entropy_coeff >= 0.003 (Skywork cap 0.005), clip_ratio_high >= 0.28 (DAPO). Raising rollout.n or "
              "filter_groups (DAPO) costs compute, so it is left to you.",
              [_c(TEMP, "at_least", 1.0), _LR_HALF, _c(ENT, "at_least", 0.003), _c(CLIP_HIGH, "at_least", 0.28)]),
        _rung("egr-2", "Temperature × 1.1 (POLARIS: small steps, it has a collapse zone); LR × 0.5; entropy_coeff "
              ">= 0.005 (Skywork cap).", [_c(TEMP, "multiply", 1.1), _LR_HALF, _c(ENT, "at_least", 0.005)]),
        _rung("egr-3", "Temperature × 1.1 (toward ProRL's 1.2); LR × 0.5; KL >= 0.01 (seed).",
              [_c(TEMP, "multiply", 1.1), _LR_HALF, *_kl_on(0.01)]),
    ),
    "entropy_explosion": (
        _rung("explosion-1", "LR × 0.5; entropy_coeff = 0 (verl#781: the bonus drives the blow-up); clip_ratio_high "
              "<= 0.2 (undo clip-higher) - anchors §3.9.",
              [_LR_HALF, _c(ENT, "set", 0.0), _c(CLIP_HIGH, "at_most", 0.2)]),
        _rung("explosion-2", "LR × 0.5; grad clip <= 0.5 (§3.9 'clip grads'); temperature <= 1.0.",
              [_LR_HALF, _c(CLIP_GRAD, "at_most", 0.5), _c(TEMP, "at_most", 1.0)]),
        _rung("explosion-3", "LR × 0.5. " + _BACK, [_LR_HALF], rollback_extra_checkpoints=1),
    ),
    "kl_drift": (
        _rung("kl-1", "KL coefficient × 5 and at least 0.01 (seed) - kl_loss_coef, or algorithm.kl_ctrl.kl_coef when "
              "the run puts KL in the reward; a run without KL gets use_kl_loss=true at 0.01 - and LR × 0.2 (a KL "
              "blow-up is an update too large for the reference to hold).",
              [*_kl_up(5, 0.01), _c(LR, "multiply", 0.2)]),
        _rung("kl-2", "KL coefficient × 2 (a run without KL: on at 0.02); LR × 0.5 (seed: stronger KL against drift).",
              [*_kl_up(2, 0.02), _LR_HALF]),
        _rung("kl-3", "LR × 0.5 with fresh optimizer state. " + _BACK, [_LR_HALF],
              rollback_extra_checkpoints=1, reset_optimizer=True),
    ),
    "logprob_decline": _CALM,
    "reward_collapse": _CALM,
    "length_collapse": _CALM,
    "length_explosion": _LENGTH,
    "truncation": _TRUNCATION,
    "grad_spike": _SPIKE,
    "non_finite": _SPIKE,
}  # fmt: skip


class RemediationConfig(_Model):
    """guardian.yaml ``remediation``: rollback margin and one ladder per incident kind."""

    margin_steps: int = Field(0, ge=0, description="Rollback target step <= incident onset - this margin.")
    ladders: dict[str, tuple[Rung, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_LADDERS),
        description="Rungs per incident kind (check name), tried in order on relapse. Kinds left out keep the "
        "defaults; [] = no automatic remediation (alert, then give up).",
    )

    @field_validator("ladders", mode="after")
    @classmethod
    def _known_kinds(cls, ladders: dict[str, tuple[Rung, ...]]) -> dict[str, tuple[Rung, ...]]:
        unknown = sorted(set(ladders) - set(INCIDENT_KINDS))
        if unknown:
            raise ValueError(f"unknown incident kind(s) {unknown}; known: {', '.join(INCIDENT_KINDS)}")
        return {**DEFAULT_LADDERS, **ladders}

    def rung(self, kind: str, index: int) -> Rung | None:
        """Rung ``index`` (0 = first intervention) for ``kind``; None when the ladder is spent."""
        ladder = self.ladders.get(kind, ())
        return ladder[index] if 0 <= index < len(ladder) else None
