"""``guardian.yaml``: the schema, its defaults, loading and environment overrides.

Every field has a default and a description; ``guardian config --example`` prints the documented
file (docs/guardian.example.yaml is that output). Unknown keys and bad values fail at start with the
dotted path of the field and its line (``format_validation_error``); the value under an unknown key is never shown (a
secret under a misspelt key: ``url:`` for ``url_env:``), nor any value but a mistyped choice, number or flag. The file
is read with ``guardian.yamlio.load_yaml``: a key given twice is refused. Secrets and the database URL can come from
the environment instead of the file (see ``ENV_OVERRIDES``), so the file can be committed.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from guardian.ladder import RemediationConfig
from guardian.redact import printable
from guardian.regular_files import open_regular
from guardian.yamlio import Loaded, YamlError, load_yaml

# defaults the store and the guard loops start from when no configuration is given (store/engine.py,
# store/writebehind.py, outage.py import them; nothing here imports the store)
BUSY_TIMEOUT_S = 5.0
STATEMENT_TIMEOUT_S = 30.0
MAX_PENDING_WRITES = 10_000
STORE_WAIT_S = 600.0
# a store's first open migrates in one write transaction: another guardian's (or fleet run's) open waits this long
MIGRATION_WAIT_S = 120.0
TICK_FAILURE_LIMIT = 5
OUTAGE_LIMIT_S = 900.0
STORE_REFRESH_S = 5.0
STORE_REREAD_S = 15.0  # store.reread_s: how late the guard loop may see another process's change
# keys kept per metrics line besides the exact keys the checks read (verl logs ~150-300; sources/jsonl.py)
MAX_KEYS_PER_STEP = 5_000
# the longest line a source keeps: a metrics line of 5,000 keys of ~100 bytes each with room to spare (verl's are
# ~15 kB). Parsing a JSON line takes ~10x its length in memory, so this bounds a parse at a few tens of MB.
MAX_LINE_BYTES = 4 << 20
RAY_REQUEST_TIMEOUT_S = 10.0  # one call to a Ray cluster's Jobs API or State API (rescue/ray_jobs.py imports it)
MAX_CONFIG_BYTES = 1 << 20  # a guardian.yaml is a few KiB; a larger file is the wrong file


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file and the field."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @cached_property
    def cache_key(self) -> str:
        """The settings as text: a key for results derived with them (a string caches its hash; hashing
        the model itself walks every field on every lookup)."""
        return repr(self)


class CheckBase(_Section):
    enabled: bool = Field(True, description="Run this check.")
    warmup_steps: int = Field(0, ge=0, description="Steps the run must have logged before this check judges.")
    for_steps: int = Field(3, ge=1, description="Hysteresis: the condition must hold this many steps in a row.")


class EntropyCollapseConfig(CheckBase):
    """The shapes of a falling entropy curve (checks/entropy.py); whether the run learns is the policy's call."""

    for_steps: int = Field(2, ge=1, description="Hysteresis: the condition must hold this many steps in a row.")
    warn_ratio: float = Field(0.3, gt=0, lt=1, description="Below this × the early level: a warning.")
    critical_ratio: float = Field(
        0.15, gt=0, lt=1, description="Below this × the early level and still falling: a collapse."
    )
    fast_drop: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="A fast collapse: entropy fell to this fraction of its value within fast_window_steps.",
    )
    fast_window_steps: int = Field(10, ge=2, description="The window of a fast collapse, in steps.")
    fast_ratio: float = Field(0.5, gt=0, le=1, description="A fast collapse ends below this × the early level.")
    still_falling: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="Entropy that lost less than this share over twice fast_window_steps is steady, not falling.",
    )
    dead_ratio: float = Field(
        0.05, gt=0, lt=1, description="Below this × the early level the policy is deterministic (dead)."
    )
    dead_window_steps: int = Field(
        10, ge=1, description="Dead within this many steps of being at fast_ratio × the early level: a hard failure."
    )
    onset_ratio: float = Field(
        0.6,
        gt=0,
        lt=1,
        description="A collapse's onset: the first step of the run-up below this × the early level (for a fast "
        "fall, at most fast_window_steps before it began).",
    )


class EntropyExplosionConfig(CheckBase):
    for_steps: int = Field(2, ge=1, description="Hysteresis: the condition must hold this many steps in a row.")
    warn_ratio: float = Field(1.6, gt=1, description="Warn when entropy (raw and smoothed) > this × baseline.")
    warn_min_entropy: float = Field(0.05, ge=0, description="Ignore rises while entropy is below this (nats/token).")
    min_entropy: float = Field(
        1.0,
        ge=0,
        description="A failure shape needs entropy (nats/token) of at least this: a rise from a very low baseline "
        "(0.13 -> 0.67) is exploration coming back, not gibberish.",
    )
    onset_ratio: float = Field(
        1.25,
        gt=1,
        description="When it fires, the onset is the first step of the run-up where entropy (raw and smoothed) is "
        "past this × baseline.",
    )


class EgrCollapseConfig(CheckBase):
    warn_below: float = Field(0.4, ge=0, le=1, description="Warn when the effective group ratio is below this.")
    critical_below: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Critical when the effective group ratio is below this and the groups are not saturated.",
    )
    relative_to_baseline: float = Field(
        0.5, gt=0, le=1, description="Critical also needs EGR < this × the run's baseline EGR."
    )
    saturation_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="All-one (or all-zero) group share above which low EGR means easy (hard) data.",
    )


class KlDriftConfig(CheckBase):
    window_steps: int = Field(10, ge=2, description="KL growth is measured over this many steps.")
    warn_growth: float = Field(2.0, gt=1, description="Warn when smoothed KL grew this much within the window.")
    critical_growth: float = Field(
        2.0, gt=1, description="KL running away: this growth within the window (the policy weighs the reward)."
    )
    floor: float = Field(0.1, gt=0, description="Per-token KL below this is never drift (KL starts at 0 by design).")
    onset_growth: float = Field(
        1.5,
        gt=1,
        description="When it fires, the onset is the first step of the run-up where KL's growth within the window "
        "is past this.",
    )


class LogprobDeclineConfig(CheckBase):
    warn_rise: float = Field(0.4, gt=0, description="Warn when mean -log pi rose by this fraction of baseline.")
    critical_rise: float = Field(1.0, gt=0, description="Critical when mean -log pi rose by this fraction.")
    floor: float = Field(0.05, gt=0, description="Baseline floor (nats/token).")
    onset_rise: float = Field(
        0.2,
        gt=0,
        description="When it fires, the onset is the first step of the run-up where mean -log pi is past this "
        "rise (a fraction of baseline).",
    )


class RewardCollapseConfig(CheckBase):
    """The reward's trend (checks/trend.py): judged against the run's own noise and pace, never a fixed
    window or a fixed share of the score range alone. Every check that asks "is the run still learning?"
    reads these settings."""

    level_steps: int = Field(5, ge=2, description="A reward level is the mean of this many steps.")
    noise_steps: int = Field(40, ge=6, description="Noise = robust scatter of the last this-many step-to-step changes.")
    window_min_steps: int = Field(5, ge=2, description="The shortest window (in steps) over which the trend is judged.")
    window_max_steps: int = Field(
        20,
        ge=2,
        description="The longest window (in steps) over which the trend is judged; within these bounds the window is "
        "what the run's own pace needs to clear its noise.",
    )
    improve_z: float = Field(
        2.0, gt=0, description="Improving needs the level to rise by this many sigmas over the window."
    )
    improve_pace_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Improving also needs a rise of at least this share of what the run's pace so far would give.",
    )
    drop_z: float = Field(3.0, gt=0, description="Falling needs the level to be this many sigmas below its best.")
    warn_drop: float = Field(
        0.05, ge=0, description="Falling also needs a drop of at least this fraction of the reward scale (a warning)."
    )
    critical_loss: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Critical when falling and the run lost this share of its gains since the start (or fell below its "
        "starting level).",
    )
    critical_drop: float = Field(
        0.1, ge=0, description="A critical fall is also at least this fraction of the reward scale."
    )
    saturation_margin: float = Field(
        0.1, ge=0, lt=1, description="Reward within this fraction of scale from its maximum = saturated."
    )
    convergence_margin: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="A plateau within this fraction of scale below the best sample's score is convergence: low "
        "entropy or alike groups there get advice, not a rollback (a rollback cannot buy much below the ceiling).",
    )
    recovery_tolerance: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="After a rescue, a validation score within this fraction of its level at the rollback point is "
        "back, while its noise is not known yet (fewer than six scores; later: within improve_z × its noise).",
    )

    @model_validator(mode="after")
    def _window_order(self) -> RewardCollapseConfig:
        if self.window_min_steps > self.window_max_steps:
            raise ValueError(
                f"window_min_steps ({self.window_min_steps}) exceeds window_max_steps ({self.window_max_steps})"
            )
        return self


class LengthConfig(CheckBase):
    collapse_warn_ratio: float = Field(0.5, gt=0, lt=1, description="Warn when mean length < this × baseline.")
    collapse_critical_ratio: float = Field(0.2, gt=0, lt=1, description="Critical below this × baseline.")
    collapse_onset_ratio: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="When a collapse fires, its onset is the first step of the run-up where mean length is past "
        "(below) this × baseline.",
    )
    explosion_warn_ratio: float = Field(2.0, gt=1, description="Warn when mean length > this × baseline.")
    explosion_critical_ratio: float = Field(3.0, gt=1, description="Critical above this × baseline if fast.")
    explosion_fast_growth: float = Field(
        1.8, gt=1, description="A critical explosion also grew by this factor within fast_window_steps."
    )
    explosion_onset_ratio: float = Field(
        1.3,
        gt=1,
        description="When an explosion fires, its onset is the first step of the run-up where mean length is past "
        "(above) this × baseline.",
    )
    fast_window_steps: int = Field(10, ge=1, description="Window for the growth-rate condition.")
    truncation_warn: float = Field(0.1, ge=0, le=1, description="Warn when truncated-response share > this.")
    truncation_critical: float = Field(
        0.9,
        ge=0,
        le=1,
        description="A truncated-response share above this is a failure shape when it is also truncation_rise above "
        "its baseline.",
    )
    truncation_rise: float = Field(
        0.2, ge=0, le=1, description="A failure shape also needs the truncated share this far above its baseline."
    )
    max_response_length: int | None = Field(
        None,
        ge=1,
        description="The response length cap (verl's data.max_response_length); inferred from response_length/max "
        "when unset.",
    )


class GradSpikeConfig(CheckBase):
    for_steps: int = Field(2, ge=1, description="Critical when grad norm >= warn_ratio this many steps in a row.")
    window: int = Field(20, ge=3, description="Reference: median grad norm of this many previous steps.")
    warn_ratio: float = Field(5.0, gt=1, description="Warn when grad norm > this × the reference.")


class NonFiniteConfig(CheckBase):
    for_steps: int = Field(2, ge=1, description="Critical when non-finite values persist this many steps.")


class StallConfig(CheckBase):
    warn_factor: float = Field(3.0, gt=1, description="Warn after this × the typical step time without a step.")
    critical_factor: float = Field(5.0, gt=1, description="Critical after this × the typical step time.")
    min_seconds: float = Field(60.0, gt=0, description="Never call a stall before this many seconds.")
    startup_seconds: float = Field(3600.0, gt=0, description="Critical when no step arrives this long after start.")
    startup_learned_factor: float = Field(
        3.0,
        ge=1,
        description="A relaunch (a restart or a rollback: it also loads a checkpoint) may take this × the first "
        "launch's time from start to its first step before it counts as stalled; never less than startup_seconds "
        "here, nor than intervention.startup_seconds for the rescue's resume deadline.",
    )
    save_seconds: float = Field(
        900.0,
        gt=0,
        description="A step that saves a checkpoint (trainer.save_freq, the last step, or a new global_step_N/ "
        "folder seen growing) may stay silent this much longer than any other step; the silence counts from "
        "the last time the guardian saw that folder grow.",
    )
    validation_seconds: float = Field(
        3600.0,
        gt=0,
        description="A step that validates (trainer.test_freq, the last step, or a validation dump "
        "{trainer.validation_data_dir}/N.jsonl seen growing) may stay silent this much longer than any other "
        "step; verl writes nothing while it validates, so make it cover the whole validation set.",
    )


class PolicyConfig(_Section):
    """How the run's outcome is read for the decision policy (checks/policy.py)."""

    start_points: int = Field(3, ge=1, description="The run's start is the median of its first this-many rewards.")
    sharp_drop: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A reward below the start by this fraction of its scale is a fall no noise explains.",
    )
    sharp_fall_points: int = Field(2, ge=1, description="This many newest rewards in a row below sharp_drop: falling.")
    sharp_fall_points_hard: int = Field(
        3,
        ge=1,
        description="This many newest rewards in a row below sharp_drop: collapsed below the start (acts alone).",
    )
    outcome_points: int = Field(
        2, ge=1, description="Hysteresis: the most lenient outcome of this many newest steps is the one weighed."
    )
    min_steps_to_judge: int = Field(
        10, ge=1, description="A finished run with fewer steps is 'not enough data', never healthy."
    )
    holding_margin: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="A reward within this fraction of its scale below its best (or of the top of the scale) "
        "holds near its best: a lone signal there is advice, not a rollback.",
    )


class BaselineConfig(_Section):
    warmup_steps: int = Field(0, ge=0, description="Steps skipped before the baseline window starts.")
    steps: int = Field(5, ge=1, description="Steps whose median is a signal's baseline (its healthy level).")
    smooth_steps: int = Field(3, ge=1, description="Median window used to smooth a signal before judging it.")


class ChecksConfig(_Section):
    rules: Literal["default", "seed"] = Field(
        "default", description="Rule set: 'default' (calibrated) or 'seed' (the tutorial's naive rules)."
    )
    baseline: BaselineConfig = BaselineConfig()
    policy: PolicyConfig = PolicyConfig()
    entropy_collapse: EntropyCollapseConfig = EntropyCollapseConfig()
    entropy_explosion: EntropyExplosionConfig = EntropyExplosionConfig()
    egr_collapse: EgrCollapseConfig = EgrCollapseConfig()
    kl_drift: KlDriftConfig = KlDriftConfig()
    logprob_decline: LogprobDeclineConfig = LogprobDeclineConfig()
    reward_collapse: RewardCollapseConfig = RewardCollapseConfig()
    length: LengthConfig = LengthConfig()
    grad_spike: GradSpikeConfig = GradSpikeConfig()
    non_finite: NonFiniteConfig = NonFiniteConfig()
    stall: StallConfig = StallConfig()


class SourcesConfig(_Section):
    poll_interval_s: float = Field(0.25, gt=0, description="Seconds between polls of the run's files.")
    idle_poll_max_s: float = Field(
        2.0,
        gt=0,
        description="Longest wait between polls while nothing changes: the wait doubles from poll_interval_s on "
        "each quiet poll and drops back as soon as a line arrives or an intervention needs the guardian to act.",
    )
    train_batch_size: int | None = Field(
        None,
        ge=1,
        description="The run's data.train_batch_size, which lets EGR be estimated from DAPO eviction counts.",
    )
    max_keys_per_step: int = Field(
        MAX_KEYS_PER_STEP,
        ge=1,
        description="A metrics line with more keys keeps the exact keys the checks read plus this many others, "
        "val-core/ keys first (with a warning; verl logs ~150-300).",
    )
    max_line_bytes: int = Field(
        MAX_LINE_BYTES,
        ge=1024,
        description="A longer metrics line is skipped as unreadable, never held in memory whole.",
    )
    ray_job_logs: Literal["auto", "always", "never"] = Field(
        "auto",
        description="guardian run --ray-address: mirror each job's logs (the Jobs API) into <run>/attempt-N/job.log "
        "and read verl's console lines from it when the metrics file is on a node this machine cannot see. auto = "
        "once the logs show a step line while the metrics file does not exist here; always = from the start; "
        "never = neither mirror nor read them.",
    )
    ray_job_logs_poll_s: float = Field(
        1.0,
        gt=0,
        description="Seconds between reads of a running job's logs for the mirror; each read fetches the whole log "
        "(Ray 2.60's Jobs API has no offset), so a long log costs the dashboard more per read.",
    )
    forwarding_grace_s: float = Field(
        10.0,
        gt=0,
        description="guardian run: once the trainer's output shows a step line, its metrics file must hold a line "
        'within this many seconds, else one error says the launch (a script not ending in "$@") dropped the '
        "guardian's arguments.",
    )


class StoreConfig(_Section):
    busy_timeout_s: float = Field(
        BUSY_TIMEOUT_S,
        gt=0,
        description="Wait this long for another connection's lock before a write counts as refused (SQLite's busy "
        "timeout, PostgreSQL's lock_timeout).",
    )
    statement_timeout_s: float = Field(
        STATEMENT_TIMEOUT_S,
        gt=0,
        description="PostgreSQL: a round trip to the server (a statement, a commit, the pool's check) that gets no "
        "answer within this long fails as an outage and its connection is closed - a server that is hung (its "
        "process stopped, the machine paused) or cut off then holds up a tick this long, not for ever. Above "
        "busy_timeout_s, so that a wait for a lock fails as a lock timeout first. Migrations are not bounded.",
    )
    max_pending_writes: int = Field(
        MAX_PENDING_WRITES,
        ge=1,
        description="While the store refuses writes, keep up to this many units of the guard loop's work (a tick's "
        "writes each) in memory; beyond it new ones are dropped and counted (their steps stay in the metrics files).",
    )
    outage_wait_s: float = Field(
        STORE_WAIT_S,
        gt=0,
        description="A rescue holds after its stop while the store refuses writes; past this long with no trainer "
        "running the guardian gives up in one line (exit 1; guardian run --attach resumes).",
    )
    reread_s: float = Field(
        STORE_REREAD_S,
        gt=0,
        description="What the guard loop read from the store (incidents, interventions, checkpoint verdicts, the "
        "events to notify) is read again after its own writes, else this often: how soon it sees what another "
        "process changed (guardian incidents close).",
    )

    @model_validator(mode="after")
    def _statement_outlasts_lock_wait(self) -> StoreConfig:
        if self.statement_timeout_s <= self.busy_timeout_s:
            raise ValueError(
                f"statement_timeout_s ({self.statement_timeout_s:g}) must be above busy_timeout_s "
                f"({self.busy_timeout_s:g}): a statement may wait that long for a lock before the server answers"
            )
        return self


class InterventionConfig(_Section):
    budget: int = Field(3, ge=0, description="Remediation interventions per run before giving up (exit 93).")
    restart_budget: int = Field(3, ge=0, description="Restarts after a crash or a stall per run before giving up.")
    probation_steps: int = Field(
        20, ge=1, description="Healthy steps after the rollback point before an intervention counts as resolved."
    )
    probation_max_factor: float = Field(
        2.0,
        ge=1,
        description="A probation that has not proven the fix after probation_steps goes on up to this × "
        "probation_steps, then ends short of proof (relapsed while the trouble persists, else unresolved).",
    )
    startup_seconds: float = Field(
        900.0,
        gt=0,
        description="A relaunched trainer must log its first new step within this (+ resume_deadline_steps).",
    )
    resume_deadline_steps: float = Field(
        5.0,
        gt=0,
        description="A relaunched trainer must log its first new step within startup_seconds + this many typical "
        "step times.",
    )
    stop_sigint_s: float = Field(60.0, ge=0, description="Stop: wait this long after SIGINT to the process group.")
    stop_sigterm_s: float = Field(30.0, ge=0, description="Stop: wait this long after SIGTERM, before SIGKILL.")
    stop_sigkill_s: float = Field(
        10.0, ge=0, description="Stop: wait this long after SIGKILL, before reporting a failed stop."
    )
    ray_survivor_grace_s: float = Field(
        10.0,
        ge=0,
        description="Ray jobs: after a job is stopped, wait up to this long for its non-detached actors to die with "
        "the driver before the ones left alive count as survivors (detached ones never die by themselves).",
    )


class RayConfig(_Section):
    """A trainer submitted to a Ray cluster as Ray Jobs (guardian/rescue/ray_jobs.py, docs/multi-node.md)."""

    address: str | None = Field(
        None,
        description="The cluster's dashboard (Jobs API) address, http://HEAD:8265: guardian run submits each new run's "
        "attempts there as Ray jobs instead of local process groups. guardian run --ray-address wins over it; a run "
        "re-attached keeps the address it started with (a local run stays local); a fleet run's own ray_address wins "
        "over its config's. null = local process groups.",
    )
    request_timeout_s: float = Field(
        RAY_REQUEST_TIMEOUT_S,
        gt=0,
        description="Longest wait for one call to the dashboard (submit, stop, job info, job logs, the State API's "
        "survivor reads) to connect, and then for each next part of its answer; past it the call fails as an outage: "
        "the tick still judges the metrics, the rescue waits for the dashboard (outage_limit_s), and the dashboard "
        "is not asked again for this long. Ray's own client waits for the kernel's TCP timeout (minutes).",
    )


class CheckpointsConfig(_Section):
    """Healthy checkpoints the guardian pins (hard links under ``<ckpt>/.guardian-pinned/``) so that verl's
    retention (``trainer.max_actor_ckpt_to_keep``) cannot delete every rollback target (checkpoints/pinning.py)."""

    pin_keep: int = Field(
        3,
        ge=0,
        description="Keep this many of the newest healthy checkpoints pinned; a pin is released once this many newer "
        "healthy ones are pinned (0: pin nothing). guardian run pins in advise and enforce mode, never in observe.",
    )
    healthy_window_steps: int = Field(
        5,
        ge=0,
        description="A checkpoint is pinned once the steps up to this many after it are judged and no warn or "
        "critical finding stood at any step from this many before it to this many after it (and no incident is "
        "open); keep it below save_freq x max_actor_ckpt_to_keep, or verl deletes checkpoints before they qualify.",
    )
    copy_min_free_gib: float = Field(
        20.0,
        ge=0,
        description="Where hard links are refused (another filesystem, EPERM) a pin is a copy: refused when it would "
        "leave less than this many GiB free on the checkpoint filesystem (event=pin_copy_refused).",
    )

    @property
    def copy_min_free_bytes(self) -> int:
        return round(self.copy_min_free_gib * (1 << 30))


class RolloutsConfig(_Section):
    """The rollout dumps ``guardian run`` has verl write into each attempt's own folder (tens of MB a step at 7B):
    past a byte cap the oldest are removed (actions/dump_retention.py). The evidence never is: the recent window,
    the steps around every incident, abandoned and quarantined branches; nor a dump folder the command names."""

    keep_gib: float | None = Field(
        10.0,
        ge=0,
        description="Keep a run's own rollout dumps under this many GiB: past it the oldest dumps not kept for a "
        "reason below are removed (event=rollouts_pruned). null: never remove any.",
    )
    keep_recent_steps: int = Field(
        100,
        ge=1,
        description="The dumps of the newest this-many steps (never fewer than checklist.review_steps) are always "
        "kept: the checks' windows and a re-attached guardian read them, and an incident's earliest steps (its "
        "rollback point, its onset) are found only when it opens - make it longer than that lag (up to "
        "trainer.save_freq), or those dumps may be gone by then.",
    )
    keep_around_incident_steps: int = Field(
        20,
        ge=0,
        description="The dumps this many steps either side of an incident's onset, detection, rollback point and "
        "closing, and of every step where a warning or worse stood, are always kept, so an incident's report still "
        "shows them (never fewer than report.context_steps).",
    )
    prune_every_steps: int = Field(
        10, ge=1, description="Look for dumps to remove once every this-many new steps (after the tick's work)."
    )

    @property
    def keep_bytes(self) -> int | None:
        return None if self.keep_gib is None else round(self.keep_gib * (1 << 30))


class ExporterConfig(_Section):
    enabled: bool = Field(False, description="Serve Prometheus metrics at http://host:port/metrics while guarding.")
    host: str = Field("127.0.0.1", description="Address to listen on (never all interfaces unless allow_public).")
    port: int = Field(9464, ge=0, le=65535, description="Port (0 = any free port).")
    allow_public: bool = Field(
        False,
        description="Allow listening beyond loopback: every interface in any spelling (0.0.0.0, ::, 0, 0x0, "
        "::ffff:0.0.0.0) or a host name resolving to a non-loopback address.",
    )
    linger_s: float = Field(
        75.0,
        ge=0,
        description="When the guardian stops (run ended, or a first Ctrl-C / SIGTERM), keep serving guardian_up=0 "
        "and the final counters this long so Prometheus scrapes them; more than your scrape interval.",
    )
    store_refresh_s: float = Field(
        STORE_REFRESH_S,
        gt=0,
        description="A tick that saw nothing move (no step, no finding, no rescue state) re-reads what the store holds "
        "for the snapshot (incidents, interventions, notifications, pins) only this often; its live state (step, "
        "signals, checks) is fresh every tick. The store reads are the cost of a quiet run, times the runs of a fleet.",
    )


LevelName = Literal["info", "warning", "critical"]
RESERVED_SINK_NAMES = frozenset({"log", "wandb", "grafana"})  # the built-in sinks' names in the deliveries table


class WebhookConfig(_Section):
    name: str = Field("webhook", pattern=r"^[a-z0-9_-]{1,32}$", description="Name in logs and metrics.")
    url_env: str | None = Field(
        None, description="Environment variable holding the URL (a Slack webhook URL is a secret: never in this file)."
    )
    url_file: Path | None = Field(None, description="File holding the URL (alternative to url_env).")
    min_level: LevelName = Field("warning", description="Send events at this level and above.")
    timeout_s: float = Field(5.0, gt=0, description="HTTP timeout per request.")

    @field_validator("url_env")
    @classmethod
    def _an_env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must name an environment variable (letters, digits and _), the one holding the URL; the value given "
                "is not shown (it may be the URL itself)"
            )
        return value

    @model_validator(mode="after")
    def _one_url_source(self) -> WebhookConfig:
        if (self.url_env is None) == (self.url_file is None):
            raise ValueError("give exactly one of url_env and url_file (the URL itself stays out of guardian.yaml)")
        return self


class WandbConfig(_Section):
    enabled: bool = Field(False, description="Mirror alerts with wandb.alert (needs verl-guardian[wandb]).")
    project: str | None = Field(
        None,
        description="W&B project; default: the command's trainer.project_name (guardian run), else verl-guardian.",
    )
    entity: str | None = Field(None, description="W&B entity (team); default: your default entity.")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="The wandb.init mode; default: wandb's."
    )
    min_level: LevelName = Field("warning", description="Send events at this level and above.")
    wait_duration_s: float = Field(
        60.0, ge=0, description="The wandb.alert wait_duration: the least gap between alerts with equal titles."
    )


class NotifyConfig(_Section):
    log_level: LevelName = Field(
        "info", description="The log notifier (always on) logs events at this level and above."
    )
    webhooks: tuple[WebhookConfig, ...] = Field((), description="Slack-compatible JSON webhooks.")
    wandb: WandbConfig = WandbConfig()
    cooldown_s: float = Field(
        1800.0, ge=0, description="Per check: a new incident alert within this many seconds of the last is held back."
    )
    max_age_s: float = Field(3600.0, gt=0, description="Events older than this when first seen are not sent.")
    retries: int = Field(
        60,
        ge=0,
        description="Retries of a failed delivery, backoff 1, 2, 4... s up to 60 s (60 retries: about an hour); "
        "a refusal no retry can change (bad token, 4xx) is dropped at once.",
    )
    interval_s: float = Field(1.0, gt=0, description="How often the dispatcher looks for new events.")

    @model_validator(mode="after")
    def _unique_names(self) -> NotifyConfig:
        names = [w.name for w in self.webhooks]
        if len(set(names)) != len(names):
            raise ValueError(f"webhook names must be unique, got {names}")
        taken = sorted(set(names) & RESERVED_SINK_NAMES)
        if taken:
            raise ValueError(f"webhook names {taken} are taken by the built-in sinks {sorted(RESERVED_SINK_NAMES)}")
        return self


class ReportConfig(_Section):
    """guardian report (guardian/report/): how much of a run an incident's report shows."""

    trajectories: int = Field(
        100,
        ge=0,
        description="Highest-reward trajectories from the rollout dumps shown for reward-hacking review (the seed "
        "tutorial reads 100); 0 leaves the section out.",
    )
    context_steps: int = Field(
        20, ge=0, description="An incident's plots span its marked steps (onset ... resume) and this many either side."
    )


class GrafanaConfig(_Section):
    url: str | None = Field(
        None,
        description="Grafana base URL; set it to post incident annotations while guarding (needs "
        "verl-guardian[grafana]).",
    )
    token_file: Path | None = Field(None, description="Service-account token file; default: env GRAFANA_TOKEN.")
    folder: str = Field("verl guardian", description="Folder title for guardian dashboards push (uid verl-guardian).")
    dashboard_uid: str | None = Field(
        None, description="Attach annotations to this dashboard; default: organisation-wide, tagged 'guardian'."
    )
    timeout_s: float = Field(5.0, gt=0, description="HTTP timeout per request.")


class CostConfig(_Section):
    """What compute costs, for the incident history and the report (guardian/review/cost.py): GPU-hours lost
    to each incident, in money, and what the same incidents would have cost rescued by hand."""

    gpu_hour_usd: float = Field(
        12.25, ge=0, description="Price of one GPU-hour in USD (seed tutorial: 8×H100 ≈ $98/hour, so 98/8)."
    )
    manual_detection_lag_steps: int = Field(
        700,
        ge=0,
        description="Steps a person notices a collapse late without the guardian (the seed's manual rescue: ~700): "
        "the floor of what each rolled-back incident would have cost by hand.",
    )


class ChecklistConfig(_Section):
    """``guardian checklist``: is the run ready to launch at scale (guardian/review/checklist.py)? Each item passes,
    warns or fails; a fail exits 3. Levels at the run's end are judged against its baseline (checks.baseline);
    the reward's trend is checks/trend.py's, with checks.reward_collapse."""

    level_steps: int = Field(
        5, ge=1, description="A signal's level at the run's end: the mean of its last this-many steps."
    )
    window_steps: int = Field(
        20, ge=3, description="Entropy's decline rate at the end: the least-squares slope over this many steps."
    )
    entropy_warn_ratio: float = Field(
        0.3, gt=0, lt=1, description="Entropy at the end below this × its baseline: warn (the policy may be narrowing)."
    )
    entropy_fail_ratio: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="Below this × its baseline: fail, unless the reward converged (near the best sample's score).",
    )
    entropy_decline_warn: float = Field(
        0.2,
        gt=0,
        description="Entropy still falling at the end by more than this share of its baseline per 100 steps: warn "
        "(a longer run at this rate collapses).",
    )
    kl_warn: float = Field(0.1, gt=0, description="KL to the reference at the end above this (nats/token): warn.")
    kl_fail: float = Field(
        1.0,
        gt=0,
        description="KL to the reference at the end above this (nats/token): fail (the seed tutorial's broken run "
        "climbed past 1 nat/token).",
    )
    egr_warn: float = Field(0.4, ge=0, le=1, description="Effective group ratio at the end below this: warn.")
    egr_fail: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Effective group ratio at the end below this: fail, unless most groups are all-correct (easy data: "
        "a warning that says so; "
        "checks.egr_collapse.saturation_fraction).",
    )
    length_warn_ratio: float = Field(
        0.5, gt=0, lt=1, description="Mean response length at the end below this × its baseline: warn."
    )
    length_fail_ratio: float = Field(
        0.2, gt=0, lt=1, description="Mean response length at the end below this × its baseline: fail."
    )
    length_growth_warn: float = Field(
        3.0, gt=1, description="Mean response length at the end above this × its baseline: warn."
    )
    truncation_warn: float = Field(
        0.1, ge=0, le=1, description="Share of responses cut at the length cap at the end above this: warn."
    )
    truncation_fail: float = Field(
        0.3, ge=0, le=1, description="Share of responses cut at the length cap at the end above this: fail."
    )
    min_healthy_checkpoints: int = Field(
        1, ge=0, description="Healthy checkpoints (verdict healthy, folder present) the run must keep: fewer fails."
    )
    review_samples: int = Field(5, ge=1, description="Highest-reward rollout samples listed for a person to read.")
    review_steps: int = Field(
        10, ge=1, description="The review samples come from the dumps of the run's last this-many steps."
    )
    review_chars: int = Field(400, ge=40, description="Characters of each sample's prompt and response shown.")
    eval_minimums: dict[str, float] = Field(
        default_factory=dict,
        description="Evaluation name -> the lowest value that passes (e.g. hotpotqa_em: 0.35). A named evaluation "
        "without a recorded result fails; a recorded one without a minimum warns.",
    )

    @model_validator(mode="after")
    def _warn_before_fail(self) -> ChecklistConfig:
        """A level warns before it fails: each pair of thresholds in order."""
        pairs = (
            ("entropy_fail_ratio", "entropy_warn_ratio"),
            ("kl_warn", "kl_fail"),
            ("egr_fail", "egr_warn"),
            ("length_fail_ratio", "length_warn_ratio"),
            ("truncation_warn", "truncation_fail"),
        )
        for low, high in pairs:
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} ({getattr(self, low)}) exceeds {high} ({getattr(self, high)})")
        return self


class GuardianConfig(_Section):
    home: Path = Field(
        Path(".guardian"),
        description="Guardian home: database, run folders. $GUARDIAN_HOME wins over it; relative: to this file's "
        "folder; left out: the nearest .guardian/ in the current folder or above, else $XDG_STATE_HOME/verl-guardian "
        "(~/.local/state/verl-guardian). guardian/home.py has the whole rule.",
    )
    db_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the store; default sqlite:///<home>/guardian.db; PostgreSQL: "
        "postgresql+psycopg://USER:PASSWORD@HOST/DB (needs verl-guardian[postgres]; put the password in the env, "
        "not here). Env: GUARDIAN_DB_URL.",
    )
    mode: Literal["observe", "advise", "enforce"] = Field(
        "enforce",
        description="guardian run: observe = findings only; advise = alert with the exact action; enforce = act. "
        "(watch always observes.)",
    )
    tick_failure_limit: int = Field(
        TICK_FAILURE_LIMIT,
        ge=1,
        description="Ticks of the guard loop failing in a row (the first is logged with its traceback) before the "
        "guardian gives up in one line (exit 1).",
    )
    outage_limit_s: float = Field(
        OUTAGE_LIMIT_S,
        gt=0,
        description="How long ticks may keep failing when every failure is an outage (a Ray cluster's Jobs API, the "
        "network, a server that does not answer: each passes on its own) before the guardian gives up; a streak "
        "with a bug in it ends after tick_failure_limit ticks. A tick keeps reading and judging the metrics while "
        "the trainer's control does not answer.",
    )
    sources: SourcesConfig = SourcesConfig()
    store: StoreConfig = StoreConfig()
    checks: ChecksConfig = ChecksConfig()
    intervention: InterventionConfig = InterventionConfig()
    ray: RayConfig = RayConfig()
    remediation: RemediationConfig = RemediationConfig()
    checkpoints: CheckpointsConfig = CheckpointsConfig()
    rollouts: RolloutsConfig = RolloutsConfig()
    exporter: ExporterConfig = ExporterConfig()
    notify: NotifyConfig = NotifyConfig()
    report: ReportConfig = ReportConfig()
    grafana: GrafanaConfig = GrafanaConfig()
    cost: CostConfig = CostConfig()
    checklist: ChecklistConfig = ChecklistConfig()

    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'guardian.db'}"


# environment variable -> dotted field path
ENV_OVERRIDES: dict[str, str] = {
    "GUARDIAN_HOME": "home",
    "GUARDIAN_DB_URL": "db_url",
    "GUARDIAN_MODE": "mode",
}


def _set_dotted(tree: dict[str, Any], dotted: str, value: str) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # a key that could be a setting's name: shown in messages
_PLAIN_VALUE = re.compile(r"[\w.+\-]{0,40}")  # a value shown beside its error ("got 'enforcee'"); others never are
_SECRET_KEY = re.compile(r"url|token|secret|passw|key|dsn|webhook|auth|cred", re.IGNORECASE)
MAX_ERROR_LINES = 20
# pydantic error types whose input may be shown (a mistyped choice, number or flag)
_VALUE_ERRORS = frozenset(
    {
        "literal_error", "enum", "int_parsing", "int_type", "int_from_float", "float_parsing", "float_type",
        "bool_parsing", "bool_type", "greater_than", "greater_than_equal", "less_than", "less_than_equal",
        "multiple_of", "finite_number",
    }
)  # fmt: skip
NOT_SHOWN = "<a key that is not a setting name>"


def format_validation_error(
    err: ValidationError, origin: str, loaded: Loaded | None = None, model: type[BaseModel] | None = None
) -> str:
    """``invalid configuration in ORIGIN:`` and a line per error: the dotted field (list items as ``[n]``, from 1),
    the reason and the line of the file (``loaded``: where each key stands). A value is shown beside its error only
    when it is a number or a short plain word under a key that is not named like a secret; the value under an
    unknown key never is (a secret written under a misspelt key: ``url:`` for ``url_env:``), and an unknown key is
    named only when it looks like a setting's name, with the settings it may have meant."""
    lines = [f"invalid configuration in {printable(origin)}:"]
    errors = err.errors()
    for e in errors[:MAX_ERROR_LINES]:
        loc = tuple(e["loc"])
        where = dotted(loc) or "(top level)"
        line = loaded.line_of(loc) if loaded is not None else None
        said = [f"line {line}"] if line is not None else []
        if e["type"] == "extra_forbidden":
            hint = _did_you_mean(loc, model or GuardianConfig)
            lines.append(f"  {where}: unknown key{_parenthesis(said)}{hint}")
            continue
        reason = printable(str(e["msg"]), 300)
        said.extend(_shown_input(e["type"], loc, e.get("input")))
        lines.append(f"  {where}: {reason}{_parenthesis(said)}")
    if len(errors) > MAX_ERROR_LINES:
        lines.append(f"  ... and {len(errors) - MAX_ERROR_LINES} more")
    return "\n".join(lines)


def dotted(loc: Sequence[object]) -> str:
    """A pydantic location as the user writes it: ``notify.webhooks[1].url`` (keys that are no name not shown)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part + 1}]"
        else:
            text += "." + (str(part) if _NAME.fullmatch(str(part)) else NOT_SHOWN)
    return text.lstrip(".")


def _parenthesis(parts: Sequence[str]) -> str:
    return f" ({'; '.join(parts)})" if parts else ""


def _shown_input(kind: str, loc: Sequence[object], value: object) -> list[str]:
    """``["got 'enforcee'"]`` when the value may be shown beside its error (see ``format_validation_error``): an error
    of a choice, a number or a flag only (not a section given a string: ``grafana: glsa_...``)."""
    if kind not in _VALUE_ERRORS or any(isinstance(part, str) and _SECRET_KEY.search(part) for part in loc):
        return []
    plain = value is None or isinstance(value, bool | int | float)
    if plain or (isinstance(value, str) and _PLAIN_VALUE.fullmatch(value)):
        return [f"got {value!r}"]
    return []


def _did_you_mean(loc: Sequence[object], model: type[BaseModel]) -> str:
    """``; did you mean url_env or url_file?`` for an unknown key among the fields of the section it was written in
    (fields it begins, then close spellings); empty without a likely one or for a key that is no name."""
    key = loc[-1] if loc else None
    fields = _fields_at(model, loc[:-1])
    if not isinstance(key, str) or not _NAME.fullmatch(key) or not fields:
        return ""
    starting = [name for name in fields if name.startswith(key) or key.startswith(name)]
    close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
    meant = list(dict.fromkeys([*starting, *close]))[:3]
    return f"; did you mean {' or '.join(meant)}?" if meant else ""


def _fields_at(model: type[BaseModel], loc: Sequence[object]) -> list[str]:
    """The field names of the section at ``loc`` under ``model`` (an empty list when it is no section)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return []
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        current = _section_type(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


def _section_type(annotation: object) -> type[BaseModel] | None:
    """The section model an annotation holds (``X``, ``X | None``, ``list[X]``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def not_a_settings_file(loaded: Any, model: type[BaseModel]) -> bool:
    """Whether a mapping read as ``model``'s file is some other file: none of its top-level keys is a setting, and
    it has several, or one that is no name (a file of secrets named by mistake: nothing of it is to be shown)."""
    if not isinstance(loaded, dict) or not loaded:
        return False
    keys = list(loaded)
    if any(key in model.model_fields for key in keys):
        return False
    return len(keys) >= 3 or any(not (isinstance(key, str) and _NAME.fullmatch(key)) for key in keys)


def parse_yaml(text: str, what: str) -> Loaded:
    """``load_yaml`` with its ``YamlError`` as a ``ConfigError`` (the same words)."""
    try:
        return load_yaml(text, what)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> GuardianConfig:
    """Load ``path`` (or the defaults when None), then apply environment overrides."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    origin = "defaults"
    loaded: Loaded | None = None
    if path is not None:
        origin = str(path)
        what = f"config file {printable(path)}"
        text = read_small_text(path, what, limit=MAX_CONFIG_BYTES, expected="a guardian.yaml file")
        loaded = parse_yaml(text, what)
        if loaded.data is not None and not isinstance(loaded.data, dict):
            raise ConfigError(f"{what} must hold a mapping at the top, got {type(loaded.data).__name__}")
        raw = loaded.data or {}
        if not_a_settings_file(raw, GuardianConfig):
            raise ConfigError(
                f"{what} is not a guardian.yaml: none of its {len(raw)} top-level keys is a setting (nothing of it is "
                "shown)"
            )
    for var, dotted_path in ENV_OVERRIDES.items():
        if env.get(var):
            _set_dotted(raw, dotted_path, env[var])
            origin += f" + ${var}"
    try:
        return GuardianConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin, loaded)) from None


def read_small_text(path: Path, what: str, *, limit: int, expected: str) -> str:
    """The UTF-8 text of the small file ``path`` (``what`` names it in messages, ``expected`` says what it should
    be); ``ConfigError`` naming the file when it is a directory, unreadable, larger than ``limit`` bytes (never
    read whole) or not UTF-8."""
    if path.is_dir():
        raise ConfigError(f"{what} is a directory, expected {expected}")
    try:
        with open_regular(path) as handle:  # a FIFO or a device there is refused, never read (or waited on)
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} is larger than {limit >> 20} MiB: not {expected}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def _without_empty(value: Any) -> Any:
    """Nested JSON without null and empty-mapping entries (the example stays readable)."""
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v is not None and v != {}}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def example_yaml() -> str:
    """The documented default configuration, one comment per field."""
    lines = [
        "# guardian.yaml - every field with its default. Env overrides: "
        + ", ".join(f"{k} -> {v}" for k, v in ENV_OVERRIDES.items()),
    ]

    def emit(model: type[BaseModel], instance: BaseModel, indent: int) -> None:
        pad = "  " * indent
        as_json = instance.model_dump(mode="json")
        for name, field in model.model_fields.items():
            value = getattr(instance, name)
            if isinstance(value, BaseModel):
                lines.append(f"{pad}{name}:")
                emit(type(value), value, indent + 1)
                continue
            if field.description:
                lines.append(f"{pad}# {field.description}")
            plain = _without_empty(as_json[name])
            if isinstance(plain, dict | list) and plain:
                block = yaml.safe_dump(plain, default_flow_style=False, sort_keys=False, width=110, allow_unicode=True)
                lines.append(f"{pad}{name}:")
                lines.extend(f"{pad}  {line}" for line in block.rstrip().splitlines())
                continue
            dumped = yaml.safe_dump(plain, default_flow_style=True)
            lines.append(f"{pad}{name}: {dumped.strip().removesuffix('...').strip()}")

    emit(GuardianConfig, GuardianConfig(), 0)
    return "\n".join(lines) + "\n"
