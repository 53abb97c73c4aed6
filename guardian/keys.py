"""Every metric key the guardian reads, in one place.

A *signal* (entropy, KL, reward …) maps to the verl keys that can carry it, in priority order: the first alias a
step logs wins. Aliases cover verl versions and, last and marked, the other frameworks of the calibration traces.
Sources: ../shared/docs/verl-0.9.1-facts.md §1, §1.8, §5. Modules import these names rather than spell keys."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class Signal(StrEnum):
    """Health signals, named after what they measure, not after a verl key."""

    ENTROPY = "entropy"
    KL = "kl"
    LOG_PPL = "log_ppl"
    REWARD = "reward"
    REWARD_MAX = "reward_max"
    REWARD_MIN = "reward_min"
    LENGTH_MEAN = "length_mean"
    LENGTH_MAX = "length_max"
    LENGTH_CLIP_RATIO = "length_clip_ratio"
    TRUNCATION = "truncation"
    GRAD_NORM = "grad_norm"
    LOSS = "loss"
    LR = "lr"
    PG_CLIPFRAC = "pg_clipfrac"
    STEP_TIME = "step_time"
    EGR = "egr"
    GROUPS_ALL_ZERO = "groups_all_zero"
    GROUPS_ALL_ONE = "groups_all_one"
    GROUP_REWARD_STD = "group_reward_std"
    FILTER_EVICTED = "filter_evicted"
    NUM_TURNS = "num_turns"
    TOOL_CALLS = "tool_calls"
    VAL_SCORE = "val_score"


# Keys the guardian itself adds to a step's record (computed from rollout dumps). The ``guardian/``
# prefix keeps them apart from anything verl writes.
EGR_KEY = "guardian/rollout/effective_group_ratio"
ALL_ZERO_KEY = "guardian/rollout/all_zero_group_fraction"
ALL_ONE_KEY = "guardian/rollout/all_one_group_fraction"
GROUP_STD_KEY = "guardian/rollout/mean_group_reward_std"
GROUPS_KEY = "guardian/rollout/groups"
SAMPLES_KEY = "guardian/rollout/samples"
# mean of each numeric reward-extra field of a dump (a reward function returning a dict, e.g.
# {"score", "correctness", "format"}; verl's V0 trainer dumps them): guardian/rollout/reward/<field>
REWARD_COMPONENT_PREFIX = "guardian/rollout/reward/"
# verl's validation metrics (facts §1.7): ``val-core/{data_source}/{var}/{metric}``; the core variable's
# ``mean@N`` of every data source, averaged, is the run's validation score (Signal.VAL_SCORE, history.py)
VAL_CORE_PREFIX = "val-core/"
VAL_MEAN_MARKER = "/mean@"
# key prefixes the checks read besides the exact keys below (a replay keeps them too)
CHECKED_PREFIXES: tuple[str, ...] = (VAL_CORE_PREFIX,)

# verl keys per signal, newest verl first.
VERL_ALIASES: dict[Signal, tuple[str, ...]] = {
    # old-policy token entropy (0.9.1); older verl logged it as entropy_loss (facts §1.1, traces dstack/verlnb)
    Signal.ENTROPY: ("actor/entropy", "actor/entropy_loss"),
    # KL to the reference: kl loss (use_kl_loss), in-reward penalty (use_kl_in_reward), pre-2025 critic/kl
    Signal.KL: ("actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"),
    # mean -log pi per token of the sampled responses under the old policy (facts §1.4)
    Signal.LOG_PPL: ("rollout_corr/training_log_ppl",),
    Signal.REWARD: ("critic/score/mean", "critic/rewards/mean"),
    Signal.REWARD_MAX: ("critic/score/max", "critic/rewards/max"),
    Signal.REWARD_MIN: ("critic/score/min", "critic/rewards/min"),
    Signal.LENGTH_MEAN: ("response_length/mean",),
    Signal.LENGTH_MAX: ("response_length/max",),
    # V0: truncation rate; V1: fraction at the batch max (facts gotcha 7) - see checks/length.py
    Signal.LENGTH_CLIP_RATIO: ("response_length/clip_ratio",),
    Signal.TRUNCATION: (),
    Signal.GRAD_NORM: ("actor/grad_norm",),
    Signal.LOSS: ("actor/pg_loss", "actor/loss"),
    Signal.LR: ("actor/lr",),
    Signal.PG_CLIPFRAC: ("actor/pg_clipfrac",),
    Signal.STEP_TIME: ("timing_s/step", "perf/time_per_step"),
    Signal.EGR: (EGR_KEY,),
    Signal.GROUPS_ALL_ZERO: (ALL_ZERO_KEY,),
    Signal.GROUPS_ALL_ONE: (ALL_ONE_KEY,),
    Signal.GROUP_REWARD_STD: (GROUP_STD_KEY,),
    # DAPO dynamic sampling (V1, filter_groups.enable): groups evicted for zero variance (facts §1.8)
    Signal.FILTER_EVICTED: ("training/filter_groups/evicted_samples",),
    # turns per trajectory of the agent loop (facts §1.3): 2 for single-turn, +2 per tool call
    Signal.NUM_TURNS: ("num_turns/mean", "training/num_turns/mean"),
    # tool calls per trajectory: only custom agent loops log it; else derived from num_turns (history.py)
    Signal.TOOL_CALLS: ("tool_call_counts/mean",),
    # derived in history.py from every val-core/*/mean@N key of the step
    Signal.VAL_SCORE: (),
}

# Names used by non-verl runs in the calibration traces (AReaL, miles, TinyZero monitor, TRL's GRPOTrainer).
# Lowest priority: a verl key always wins.
OTHER_FRAMEWORK_ALIASES: dict[Signal, tuple[str, ...]] = {
    Signal.ENTROPY: ("entropy", "entropy_mb0"),
    Signal.KL: ("kl", "kl_mb0"),
    Signal.REWARD: ("train reward", "reward", "score"),
    Signal.LENGTH_MEAN: ("resp_len", "seq_len", "completions/mean_length"),
    Signal.LENGTH_MAX: ("completions/max_length",),
    # TRL: the share of completions that hit max_completion_length
    Signal.TRUNCATION: ("trunc", "completions/clipped_ratio"),
    Signal.GRAD_NORM: ("grad_norm",),
}

ALIASES: dict[Signal, tuple[str, ...]] = {
    signal: VERL_ALIASES[signal] + OTHER_FRAMEWORK_ALIASES.get(signal, ()) for signal in Signal
}

# Signals whose non-finite value means the numbers themselves broke (NaN/inf, written as null by verl).
NUMERIC_HEALTH_SIGNALS: tuple[Signal, ...] = (
    Signal.GRAD_NORM,
    Signal.LOSS,
    Signal.ENTROPY,
    Signal.KL,
    Signal.LOG_PPL,
    Signal.REWARD,
)
# Every raw key whose non-finite value the non-finite check reports (all aliases of the signals above
# plus the per-micro-batch twins some forks log).
NON_FINITE_WATCHED_KEYS: frozenset[str] = frozenset(
    key for signal in NUMERIC_HEALTH_SIGNALS for key in ALIASES[signal]
) | frozenset({"entropy_mb1", "kl_mb1"})


def resolve(signal: Signal, data: Mapping[str, float]) -> tuple[str, float] | None:
    """The first alias of ``signal`` present in ``data``, with its value; None when absent."""
    for key in ALIASES[signal]:
        if key in data:
            return key, data[key]
    return None


def is_val_score_key(key: str) -> bool:
    """A validation key that counts toward the run's validation score: val-core/<source>/<var>/mean@N."""
    return key.startswith(VAL_CORE_PREFIX) and VAL_MEAN_MARKER in key


def signals_present(keys: set[str] | frozenset[str]) -> dict[Signal, str]:
    """Which signals a run has, and the key that carries each (for the start-up report)."""
    found: dict[Signal, str] = {}
    for signal in Signal:
        for key in ALIASES[signal]:
            if key in keys:
                found[signal] = key
                break
    val = sorted(k for k in keys if is_val_score_key(k))
    if val:
        found[Signal.VAL_SCORE] = val[0] if len(val) == 1 else f"{VAL_CORE_PREFIX}*{VAL_MEAN_MARKER}* ({len(val)} keys)"
    return found


# Every raw key the checks can read: a replay parses only these (and CHECKED_PREFIXES), the store keeps only these.
CHECKED_KEYS: frozenset[str] = frozenset(k for aliases in ALIASES.values() for k in aliases) | NON_FINITE_WATCHED_KEYS


def is_checked_key(key: str) -> bool:
    """Whether the checks read ``key`` (an exact key, or one under ``CHECKED_PREFIXES``): what the store keeps of a
    metrics line. The report, the review, the checklist and the exporter read back no other key of a metrics line;
    the metrics files stay the record of every key."""
    return key in CHECKED_KEYS or key.startswith(CHECKED_PREFIXES)


def checked_values(data: Mapping[str, float]) -> dict[str, float]:
    """``data`` with only the keys the checks read (``is_checked_key``), in their order."""
    return {key: value for key, value in data.items() if key in CHECKED_KEYS or key.startswith(CHECKED_PREFIXES)}


# ==================================================================================================
# Prometheus exporter (guardian/sinks/prometheus.py): every exported metric and label name.
# Names as they appear in the exposition: prefix guardian_, base units in the name (seconds; ratios
# 0-1; entropy and log-prob in nats), counters end in _total, the metadata series in _info.
# Labels: run_id and experiment on every series; check on the per-check status and incident series;
# state on the intervention counter; component on the reward-component gauge; sink and result on
# the notification counter. Nothing else
# (attempt, mode, version go in guardian_run_info).
# ==================================================================================================
PROM_LABEL_RUN_ID = "run_id"
PROM_LABEL_EXPERIMENT = "experiment"
PROM_LABEL_CHECK = "check"
PROM_LABEL_STATE = "state"
PROM_LABEL_COMPONENT = "component"
PROM_LABEL_SINK = "sink"
PROM_LABEL_RESULT = "result"

PROM_UP = "guardian_up"
PROM_LAST_POLL_SUCCESS = "guardian_last_poll_success"
PROM_LAST_POLL_TIMESTAMP = "guardian_last_poll_timestamp_seconds"
PROM_TICK_DURATION = "guardian_tick_duration_seconds"
PROM_RUN_INFO = "guardian_run_info"
PROM_STEP = "guardian_step"
PROM_LAST_STEP_AGE = "guardian_last_step_age_seconds"
PROM_STEP_TIME = "guardian_step_time_seconds"
PROM_POLICY_ENTROPY = "guardian_policy_entropy_nats"
PROM_KL_TO_REFERENCE = "guardian_kl_to_reference"
PROM_EFFECTIVE_GROUP_RATIO = "guardian_effective_group_ratio"
PROM_MEAN_LOG_PROB = "guardian_mean_log_prob_nats"  # = -Signal.LOG_PPL
PROM_REWARD_MEAN = "guardian_reward_mean"
PROM_RESPONSE_LENGTH = "guardian_response_length_tokens"
PROM_GRAD_NORM = "guardian_grad_norm"
PROM_LEARNING_RATE = "guardian_learning_rate"
PROM_TOOL_CALLS = "guardian_tool_calls_per_trajectory"
PROM_REWARD_COMPONENT = "guardian_reward_component_mean"
PROM_CHECK_STATUS = "guardian_check_status"
PROM_OPEN_INCIDENT_SEVERITY = "guardian_open_incident_severity"
PROM_INCIDENTS = "guardian_incidents_total"
PROM_INTERVENTIONS = "guardian_interventions_total"
PROM_INTERVENTION_IN_PROGRESS = "guardian_intervention_in_progress"
PROM_NOTIFICATIONS = "guardian_notifications_total"
PROM_STORE_DEGRADED = "guardian_store_degraded"
PROM_STORE_PENDING_WRITES = "guardian_store_pending_writes"
PROM_STORE_DROPPED_WRITES = "guardian_store_dropped_writes_total"
PROM_PINNED_CHECKPOINTS = "guardian_pinned_checkpoints"
PROM_PINNED_BYTES = "guardian_pinned_bytes"

# The training signals exported as gauges (latest value of each), one metric per signal.
PROM_SIGNAL_METRICS: dict[Signal, str] = {
    Signal.ENTROPY: PROM_POLICY_ENTROPY,
    Signal.KL: PROM_KL_TO_REFERENCE,
    Signal.EGR: PROM_EFFECTIVE_GROUP_RATIO,
    Signal.LOG_PPL: PROM_MEAN_LOG_PROB,
    Signal.REWARD: PROM_REWARD_MEAN,
    Signal.LENGTH_MEAN: PROM_RESPONSE_LENGTH,
    Signal.GRAD_NORM: PROM_GRAD_NORM,
    Signal.LR: PROM_LEARNING_RATE,
    Signal.STEP_TIME: PROM_STEP_TIME,
    Signal.TOOL_CALLS: PROM_TOOL_CALLS,
}

# Every metric name the exporter can expose (dashboards and alert rules may use only these).
PROM_METRIC_NAMES: frozenset[str] = frozenset(
    {
        PROM_UP,
        PROM_LAST_POLL_SUCCESS,
        PROM_LAST_POLL_TIMESTAMP,
        PROM_TICK_DURATION,
        PROM_RUN_INFO,
        PROM_STEP,
        PROM_LAST_STEP_AGE,
        PROM_CHECK_STATUS,
        PROM_OPEN_INCIDENT_SEVERITY,
        PROM_INCIDENTS,
        PROM_INTERVENTIONS,
        PROM_INTERVENTION_IN_PROGRESS,
        PROM_REWARD_COMPONENT,
        PROM_NOTIFICATIONS,
        PROM_STORE_DEGRADED,
        PROM_STORE_PENDING_WRITES,
        PROM_STORE_DROPPED_WRITES,
        PROM_PINNED_CHECKPOINTS,
        PROM_PINNED_BYTES,
        *PROM_SIGNAL_METRICS.values(),
    }
)
# ================================================================================ end of exporter names
