"""The training dashboard: the guardian's verdicts on top, the signals it judges below.

An overview row (healthy? moving? has the guardian stepped in?), then one row per family of signals; incidents and
interventions arrive as annotations on every panel. Metric names come from ``guardian.keys`` only; the tests check
that every panel reads exported metrics and every exported metric is on some panel.
"""

from __future__ import annotations

from typing import Final

from guardian import keys
from guardian.core import Severity
from guardian.dashboards.dashboard import ANNOTATION_TAG, dashboard
from guardian.dashboards.panels import (
    Json,
    layout,
    selector,
    stat,
    state_timeline,
    target,
    timeseries,
    value_mappings,
)

UID: Final = "guardian-training"

NATS: Final = "suffix: nats"  # Grafana has no entropy unit; a custom suffix keeps the axis honest
TOKENS: Final = "suffix: tokens"

# The check-status numbers are ``Severity`` values; the words and colours follow the CLI's.
SEVERITY_COLORS: Final = {
    Severity.UNKNOWN: "#8e8e8e",
    Severity.OK: "green",
    Severity.WARN: "yellow",
    Severity.CRITICAL: "red",
}


def _overview() -> list[Json]:
    return [*_health(), *_progress(), *_guardian()]


def _health() -> list[Json]:
    """The checks' verdicts and the open incidents, per run and check."""
    run_check = "{{run_id}} {{check}}"
    return [
        state_timeline(
            "Health checks",
            "Each check's latest verdict per run: unknown (not enough data yet), ok, warn or critical. "
            "A critical band is what the guardian acts on in enforce mode; the red annotations mark the "
            "incident it opened.",
            [target(f"max by (run_id, check) ({selector(keys.PROM_CHECK_STATUS)})", run_check)],
            value_mappings({s.value: (s.label, color) for s, color in SEVERITY_COLORS.items()}),
            height=9,
        ),
        state_timeline(
            "Open incidents",
            "Per check, the worst severity of its open incidents, from detection until the incident closes "
            "(resolved, dismissed or given up): none, warn or critical. This is what the health alerts "
            "read; unlike the check status it does not ease while the guardian is still rescuing the run.",
            [target(f"max by (run_id, check) ({selector(keys.PROM_OPEN_INCIDENT_SEVERITY)})", run_check)],
            value_mappings(
                {
                    Severity.OK.value: ("none", SEVERITY_COLORS[Severity.OK]),
                    Severity.WARN.value: ("warn", SEVERITY_COLORS[Severity.WARN]),
                    Severity.CRITICAL.value: ("critical", SEVERITY_COLORS[Severity.CRITICAL]),
                }
            ),
            height=9,
        ),
    ]


def _progress() -> list[Json]:
    """Where the run is: its step, incidents in range, step rate and the age of its last step."""
    return [
        stat(
            "Current step",
            "Last training step of the run's active timeline (it goes back after a rollback).",
            "none",
            [target(selector(keys.PROM_STEP))],
            width=3,
            height=7,
        ),
        stat(
            "Incidents in range",
            "Incidents the guardian opened during the selected time range, all checks (rounded: increase() "
            "extrapolates to the range edges).",
            "none",
            [target(f"round(sum by (run_id) (increase({selector(keys.PROM_INCIDENTS)}[$__range])))", instant=True)],
            width=3,
            height=7,
            red_from=1,
        ),
        timeseries(
            "Step rate",
            "Training steps per hour, averaged over at least 10 minutes (RL steps take minutes, so a "
            "shorter window shows spikes and zeros). deriv() rather than rate(): the step is a gauge that "
            "goes back on a rollback, which rate() would read as a counter reset and show as a huge spike; "
            "here a rollback shows as a short dip below zero.",
            "suffix: steps/h",
            [target(f"deriv({selector(keys.PROM_STEP)}[$__rate_interval]) * 3600")],
            width=9,
            height=7,
            min_interval="10m",
        ),
        timeseries(
            "Last step age",
            "Seconds since the last step's first metrics line arrived. A saw-tooth is normal; a line that "
            "keeps climbing is a stalled run (the stall check turns critical).",
            "s",
            [target(selector(keys.PROM_LAST_STEP_AGE))],
            width=9,
            height=7,
        ),
    ]


def _guardian() -> list[Json]:
    """What the guardian did and how it fares: interventions, notifications, its store, pins, tick time."""
    return [
        timeseries(
            "Interventions",
            "Interventions finished so far, by final state (resolved, relapsed, gave_up), and 1 while one is "
            "under way. Counted from the guardian's store, so a restart of the guardian keeps the count.",
            "none",
            [
                target(selector(keys.PROM_INTERVENTIONS), "{{run_id}} {{state}}"),
                target(selector(keys.PROM_INTERVENTION_IN_PROGRESS), "{{run_id}} in progress"),
            ],
            width=12,
            height=7,
            stepped=True,
        ),
        timeseries(
            "Notifications",
            "Guardian events per notifier or Grafana sink, by result: sent; suppressed (too old, or the "
            "same alert already sent); failing (being retried); dropped (retries used up: the alert never "
            "arrived). Counts from the guardian's store.",
            "none",
            [target(selector(keys.PROM_NOTIFICATIONS), "{{run_id}} {{sink}} {{result}}")],
            width=12,
            height=7,
            stepped=True,
        ),
        timeseries(
            "Incident store",
            "1 while the store refuses writes (locked, disk full, damaged): the guardian keeps judging and can stop "
            "a collapsing trainer from memory, a rescue holds after its stop until the store is back. Pending: the "
            "guard loop's work waiting to be written; dropped: work lost because the queue was full (its steps are "
            "read again from the metrics files by a restarted guardian).",
            "none",
            [
                target(selector(keys.PROM_STORE_DEGRADED), "{{run_id}} degraded"),
                target(selector(keys.PROM_STORE_PENDING_WRITES), "{{run_id}} pending"),
                target(selector(keys.PROM_STORE_DROPPED_WRITES), "{{run_id}} dropped"),
            ],
            width=12,
            height=7,
            stepped=True,
        ),
        stat(
            "Pinned checkpoints",
            "Healthy checkpoints the guardian keeps pinned under .guardian-pinned/ (hard links), out of reach of "
            "verl's retention (trainer.max_actor_ckpt_to_keep): what a rollback can land on once verl deleted the "
            "originals. 0 in observe mode, or before any checkpoint was healthy around its step.",
            "none",
            [target(selector(keys.PROM_PINNED_CHECKPOINTS))],
            width=6,
            height=7,
        ),
        stat(
            "Pinned bytes added",
            "Bytes the pins added on disk when made: 0 for hard links, the checkpoint's size for a copy (hard links "
            "refused). A hard-linked pin keeps its files once verl deletes the original: `guardian checkpoints RUN` "
            "shows what each pin holds now.",
            "bytes",
            [target(selector(keys.PROM_PINNED_BYTES))],
            width=6,
            height=7,
        ),
        timeseries(
            "Guardian tick duration",
            "How long each guard-loop tick of the run took: reading its sources, judging, acting, storing. Far below "
            "the poll interval when the guardian keeps up; a tick holding a stop or a pin copy runs long for that "
            "run only (with guardian fleet every run ticks in its own thread).",
            "s",
            [target(selector(keys.PROM_TICK_DURATION))],
            width=12,
            height=7,
        ),
    ]


def _reward() -> list[Json]:
    return [
        timeseries(
            "Mean reward",
            "Mean score (or reward) of the batch (verl critic/score/mean). Flat while entropy falls is the "
            "entropy-collapse pattern.",
            "none",
            [target(selector(keys.PROM_REWARD_MEAN))],
        ),
        timeseries(
            "Reward per dimension",
            "Mean of each extra field the reward function returns besides the score (e.g. correctness, "
            "format). Shows data only when the reward function returns a dict of extra fields and verl "
            "dumps them (trainer.rollout_data_dir); otherwise this panel stays empty.",
            "none",
            [target(selector(keys.PROM_REWARD_COMPONENT), "{{run_id}} {{component}}")],
        ),
        timeseries(
            "Effective group ratio",
            "Share of GRPO groups whose rewards differ (non-zero variance): only those give an advantage. "
            "Near 0 means nearly every group is all-right or all-wrong and the gradient carries no signal.",
            "percentunit",
            [target(selector(keys.PROM_EFFECTIVE_GROUP_RATIO))],
            min_value=0,
            max_value=1,
        ),
    ]


def _policy() -> list[Json]:
    return [
        timeseries(
            "Policy entropy",
            "Mean per-token entropy of the policy on its sampled responses, in nats. A steep fall while "
            "reward stalls is entropy collapse.",
            NATS,
            [target(selector(keys.PROM_POLICY_ENTROPY))],
        ),
        timeseries(
            "KL to reference",
            "KL divergence of the policy from the reference model (kl loss or in-reward penalty). Several-fold "
            "growth within a few steps without reward gains is KL drift.",
            "none",
            [target(selector(keys.PROM_KL_TO_REFERENCE))],
        ),
        timeseries(
            "Mean log-prob",
            "Mean per-token log-probability of the sampled responses under the policy, in nats (<= 0). A "
            "steady decline is likelihood displacement: the policy trusts its own samples less and less.",
            NATS,
            [target(selector(keys.PROM_MEAN_LOG_PROB))],
        ),
    ]


def _optimisation() -> list[Json]:
    return [
        timeseries(
            "Grad norm",
            "Actor gradient norm (log scale: spikes of orders of magnitude precede NaNs).",
            "none",
            [target(selector(keys.PROM_GRAD_NORM))],
            log_scale=True,
        ),
        timeseries(
            "Learning rate",
            "Actor learning rate; a patch by the guardian (e.g. a lower LR after a rollback) shows as a step.",
            "sci",
            [target(selector(keys.PROM_LEARNING_RATE))],
        ),
        timeseries(
            "Step time",
            "Trainer's wall time per step (verl timing_s/step). Growth usually tracks response length.",
            "s",
            [target(selector(keys.PROM_STEP_TIME))],
        ),
    ]


def _rollouts() -> list[Json]:
    return [
        timeseries(
            "Response length",
            "Mean response length in tokens. A collapse to very short answers, or a climb to the length "
            "limit (truncation), both precede reward hacking or collapse.",
            TOKENS,
            [target(selector(keys.PROM_RESPONSE_LENGTH))],
            width=12,
        ),
        timeseries(
            "Searches per trajectory",
            "Mean tool calls (searches) per trajectory of the agent loop. Falling to zero means the policy "
            "stopped using the tool.",
            "short",
            [target(selector(keys.PROM_TOOL_CALLS))],
            width=12,
        ),
    ]


def training_dashboard() -> Json:
    """The training-health dashboard as Grafana JSON (classic v1 model)."""
    sections = [
        ("Guardian overview", _overview()),
        ("Reward", _reward()),
        ("Policy", _policy()),
        ("Optimisation", _optimisation()),
        ("Rollouts", _rollouts()),
    ]
    return dashboard(
        UID,
        "verl guardian: training health",
        "Health verdicts of the verl guardian and the training signals it judges, per run. "
        f"Annotations tagged '{ANNOTATION_TAG}' mark incidents and the guardian's interventions.",
        ["verl", "rl"],
        layout(sections),
    )
