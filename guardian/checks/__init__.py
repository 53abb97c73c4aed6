"""Health checks: pure functions from a run's history to findings, and the named rule sets.

``build_checks(config)`` returns the chosen rule set's configured checks; ``evaluate`` runs them and, for the
default rules, weighs each finding with the decision policy (``policy.py``). An unknown rule set fails naming the
known ones. Reading metrics and acting on findings live elsewhere (sources, rescue).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from guardian.checks.base import Check, CheckContext
from guardian.checks.drift import kl_drift, logprob_decline
from guardian.checks.egr import egr_collapse
from guardian.checks.entropy import entropy_collapse, entropy_explosion
from guardian.checks.length import length_collapse, length_explosion, truncation
from guardian.checks.policy import apply, read_progress
from guardian.checks.reward import reward_collapse
from guardian.checks.seed import seed_egr, seed_entropy, seed_kl, seed_lld
from guardian.checks.spikes import grad_spike, non_finite
from guardian.checks.stall import stall
from guardian.config import CheckBase, ChecksConfig
from guardian.core import Finding, Severity

CheckFn = Callable[[CheckContext], Finding]

RULE_SETS = ("default", "seed")


def _after_warmup(name: str, fn: CheckFn, warmup_steps: int) -> CheckFn:
    """``fn``, answering UNKNOWN until the run has logged ``warmup_steps`` steps."""
    if warmup_steps == 0:
        return fn

    def guarded(ctx: CheckContext) -> Finding:
        logged = len(ctx.history.steps)
        if logged < warmup_steps:
            return Finding(name, Severity.UNKNOWN, ctx.history.last_step, f"warming up ({logged}/{warmup_steps} steps)")
        return fn(ctx)

    return guarded


def default_checks(c: ChecksConfig) -> list[Check]:
    candidates: list[tuple[CheckBase, str, CheckFn]] = [
        (c.non_finite, "non_finite", partial(non_finite, cfg=c.non_finite)),
        (
            c.entropy_collapse,
            "entropy_collapse",
            partial(entropy_collapse, cfg=c.entropy_collapse, egr_cfg=c.egr_collapse),
        ),
        (
            c.entropy_explosion,
            "entropy_explosion",
            partial(entropy_explosion, cfg=c.entropy_explosion),
        ),
        (c.egr_collapse, "egr_collapse", partial(egr_collapse, cfg=c.egr_collapse)),
        (c.kl_drift, "kl_drift", partial(kl_drift, cfg=c.kl_drift)),
        (c.logprob_decline, "logprob_decline", partial(logprob_decline, cfg=c.logprob_decline)),
        (c.reward_collapse, "reward_collapse", partial(reward_collapse, cfg=c.reward_collapse)),
        (c.length, "length_collapse", partial(length_collapse, cfg=c.length)),
        (c.length, "length_explosion", partial(length_explosion, cfg=c.length)),
        (c.length, "truncation", partial(truncation, cfg=c.length)),
        (c.grad_spike, "grad_spike", partial(grad_spike, cfg=c.grad_spike)),
        (c.stall, "stall", partial(stall, cfg=c.stall)),
    ]
    return [Check(name, _after_warmup(name, fn, cfg.warmup_steps)) for cfg, name, fn in candidates if cfg.enabled]


def seed_checks() -> list[Check]:
    return [
        Check("seed_entropy_collapse", seed_entropy),
        Check("seed_adv_collapse", seed_egr),
        Check("seed_kl_drift", seed_kl),
        Check("seed_lld_risk", seed_lld),
    ]


@dataclass(frozen=True)
class RuleSet:
    """The checks of one rule set, and the settings of the policy that weighs them (None: the seed rules,
    whose findings stand as they are)."""

    checks: list[Check]
    config: ChecksConfig | None = None

    def __iter__(self) -> Iterator[Check]:
        return iter(self.checks)


def build_checks(c: ChecksConfig, rules: str | None = None) -> RuleSet:
    chosen = rules or c.rules
    if chosen == "default":
        return RuleSet(default_checks(c), c)
    if chosen == "seed":
        return RuleSet(seed_checks())
    raise ValueError(f"unknown rule set {chosen!r}; known: {', '.join(RULE_SETS)}")


def evaluate(ctx: CheckContext, rules: RuleSet) -> list[Finding]:
    findings = [check.evaluate(ctx) for check in rules]
    if rules.config is None:
        return findings
    c = rules.config
    return apply(findings, read_progress(ctx.history, c.policy, c.reward_collapse, ctx.baseline))


__all__ = ["RULE_SETS", "Check", "CheckContext", "RuleSet", "build_checks", "evaluate"]
