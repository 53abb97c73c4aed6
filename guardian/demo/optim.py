"""AdamW, gradient clipping and verl's constant-with-warmup LR schedule, with torch's semantics.

``AdamW``'s state dict keeps the param groups' ``lr``, so loading it brings the checkpoint's LR back, the trap verl
users meet when they patch ``optim.lr`` and resume. ``ConstantWarmup`` is ``lr = base_lr * min(1, step / warmup)``.
``LR_GAIN`` multiplies every update so verl's learning rates keep their meaning on a toy policy.
Why: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
LR_GAIN = 3.0e3


@dataclass
class ParamGroup:
    lr: float
    initial_lr: float
    betas: tuple[float, float]
    weight_decay: float
    eps: float = 1e-8


class AdamW:
    """One param group over named numpy arrays, updated in place."""

    def __init__(self, params: dict[str, Array], lr: float, betas: tuple[float, float], weight_decay: float) -> None:
        self.params = params
        self.group = ParamGroup(lr=lr, initial_lr=lr, betas=betas, weight_decay=weight_decay)
        self.step_count = 0
        self.exp_avg = {name: np.zeros_like(value) for name, value in params.items()}
        self.exp_avg_sq = {name: np.zeros_like(value) for name, value in params.items()}

    def step(self, grads: dict[str, Array]) -> None:
        g = self.group
        self.step_count += 1
        beta1, beta2 = g.betas
        bias1 = 1.0 - beta1**self.step_count
        bias2 = 1.0 - beta2**self.step_count
        step_size = g.lr * LR_GAIN / bias1
        for name, param in self.params.items():
            grad = grads[name]
            param *= 1.0 - g.lr * LR_GAIN * g.weight_decay
            m = self.exp_avg[name]
            v = self.exp_avg_sq[name]
            m *= beta1
            m += (1.0 - beta1) * grad
            v *= beta2
            v += (1.0 - beta2) * grad * grad
            param -= step_size * m / (np.sqrt(v / bias2) + g.eps)

    def state_dict(self) -> dict[str, Array]:
        """Flat arrays (for a numpy archive): moments, the step count and the group hyper-parameters."""
        g = self.group
        state: dict[str, Array] = {
            "step": np.array(float(self.step_count)),
            "group": np.array([g.lr, g.initial_lr, g.betas[0], g.betas[1], g.weight_decay, g.eps]),
        }
        for name in self.params:
            state[f"exp_avg.{name}"] = self.exp_avg[name]
            state[f"exp_avg_sq.{name}"] = self.exp_avg_sq[name]
        return state

    def load_state_dict(self, state: dict[str, Array]) -> None:
        lr, initial_lr, beta1, beta2, weight_decay, eps = (float(x) for x in state["group"])
        self.group = ParamGroup(lr, initial_lr, (beta1, beta2), weight_decay, eps)
        self.step_count = int(state["step"])
        for name in self.params:
            self.exp_avg[name] = np.array(state[f"exp_avg.{name}"], dtype=np.float64)
            self.exp_avg_sq[name] = np.array(state[f"exp_avg_sq.{name}"], dtype=np.float64)


def clip_grad_norm(grads: dict[str, Array], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_``: scale in place when the total norm exceeds ``max_norm``.

    Returns the norm *before* clipping (what verl logs as ``actor/grad_norm``); a non-finite norm
    leaves the gradients alone - the caller skips the update, as verl does.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        total = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    if math.isfinite(total):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads.values():
                g *= coef
    return total


class ConstantWarmup:
    """``LambdaLR`` with verl's constant-with-warmup lambda; stepping it sets the optimizer's LR."""

    def __init__(self, optimizer: AdamW, warmup_steps: int) -> None:
        self.optimizer = optimizer
        self.warmup_steps = warmup_steps
        self.base_lr = optimizer.group.initial_lr
        self.last_epoch = 0
        optimizer.group.lr = self.base_lr * self.factor(0)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return float(step) / float(max(1, self.warmup_steps))
        return 1.0

    def step(self) -> float:
        """Advance one training step; returns the new LR (``get_last_lr()[0]``)."""
        self.last_epoch += 1
        self.optimizer.group.lr = self.base_lr * self.factor(self.last_epoch)
        return self.optimizer.group.lr

    def state_dict(self) -> dict[str, float]:
        """Like ``LambdaLR.state_dict``: base LR and step count; the lambda (warmup) is not saved."""
        return {"base_lr": self.base_lr, "last_epoch": float(self.last_epoch)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.base_lr = float(state["base_lr"])
        self.last_epoch = int(state["last_epoch"])
