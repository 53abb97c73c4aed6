"""The patched relaunch command a rung of the remediation ladder (``ladder.py``) produces. Pure: no processes.

Each change is computed against the latest attempt's effective config (command line > ``--config-name`` YAML >
verl's defaults), so a relapse's next rung compounds; every value is validated (``verl_keys.validate``).
When the LR changes, the resume loads the model only (``load_contents=[model]``) and says optimizer state was reset.
A launch script's own arguments are unknown: a ``set`` applies, a change needing the current value is refused.
Why: docs/decisions/0006-lr-patch-resumes-model-only.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardian import verl_keys
from guardian.checkpoints.scan import CheckpointError
from guardian.checkpoints.target import resume_path_for
from guardian.ladder import (
    LOAD_CONTENTS,
    LR,
    Change,
    Rung,
)
from guardian.overrides import (
    EffectiveConfig,
    LaunchCommand,
    UnknownKey,
    parse_command,
    parse_value,
    with_overrides,
)
from guardian.verl_keys import ENV_VARS, PatchError, compose_check, validate


@dataclass(frozen=True, slots=True)
class AttemptFiles:
    """An attempt's argv and where it writes: set ``env`` in the trainer's environment too."""

    argv: tuple[str, ...]
    env: Mapping[str, str]  # VERL_FILE_LOGGER_PATH (absolute; its parent must exist - the caller creates it)
    metrics_path: Path
    rollout_dir: Path
    rollout_dir_is_users: bool  # the user's trainer.rollout_data_dir, kept
    checkpoint_dir: Path  # trainer.default_local_dir, absolute against the launch cwd


@dataclass(frozen=True, slots=True)
class RunFiles:
    """What every attempt gets regardless of patches: its own metrics file and a rollout dump dir."""

    metrics_path: Path
    rollout_dir: Path
    cwd: Path | None = None  # the trainer's launch cwd (relative verl paths resolve against it); None = ours
    user_command: tuple[str, ...] | None = None  # the user's original argv: a rollout_data_dir it sets is kept
    recorded: Mapping[str, Any] | None = None  # the config the current attempt printed (a launch script's values)

    def prepare(self, command: Sequence[str]) -> AttemptFiles:
        return prepare_attempt(
            command,
            metrics_path=self.metrics_path,
            rollout_dir=self.rollout_dir,
            cwd=self.cwd,
            user_command=self.user_command,
        )


def prepare_attempt(
    command: Sequence[str],
    *,
    metrics_path: Path,
    rollout_dir: Path,
    cwd: Path | None = None,
    user_command: Sequence[str] | None = None,
) -> AttemptFiles:
    """Add ``file`` to trainer.logger (keeping the run's loggers), trainer.rollout_data_dir (unless the user set
    one) and ``++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH`` (reaches the TaskRunner
    actor on an existing Ray cluster too, facts §6). Idempotent: preparing a prepared argv changes nothing."""
    base = (cwd or Path.cwd()).resolve()
    cmd = parse_command(command)
    eff = EffectiveConfig.of(cmd, verl_keys.defaults(), base)
    if cmd.script:
        _script_gives(eff, "trainer.logger", "[console,wandb,file]", "your script's loggers plus file")
        _script_gives(eff, "trainer.default_local_dir", "/abs/ckpt", "where the guardian finds the checkpoints")
    loggers = eff.get("trainer.logger")
    loggers = parse_value(loggers) if isinstance(loggers, str) else loggers  # '["console","file"]' as text
    loggers = [loggers] if isinstance(loggers, str) else list(loggers) if isinstance(loggers, list | tuple) else []
    changes: dict[str, object] = {} if "file" in loggers else {"trainer.logger": [*loggers, "file"]}
    users = known(
        eff if user_command is None else EffectiveConfig.of(user_command, verl_keys.defaults(), base),
        "trainer.rollout_data_dir",
    )
    users = None if users is UNKNOWN else users  # a script's own: the guardian's, appended, wins over it
    rollout = base / str(users or rollout_dir)
    if known(eff, "trainer.rollout_data_dir") != (users or str(rollout)):
        changes["trainer.rollout_data_dir"] = users or str(rollout)
    metrics = base / metrics_path
    changes[ENV_VARS + "VERL_FILE_LOGGER_PATH"] = str(metrics)
    ckpt = str(eff.get("trainer.default_local_dir"))
    if "${" in ckpt:
        raise PatchError(
            f"cannot resolve trainer.default_local_dir={ckpt!r}; set it to an absolute path in the command"
        )
    for key, value in changes.items():
        changes[key] = validate(key, value)
    argv = with_overrides(cmd, changes, known_keys=verl_keys.yaml_keys())
    env = {"VERL_FILE_LOGGER_PATH": str(metrics)}
    return AttemptFiles(tuple(argv), env, metrics, rollout, bool(users), base / ckpt)


UNKNOWN = "unknown (set inside the launch script, if at all)"


def known(eff: EffectiveConfig, key: str) -> object:
    """``eff.get(key)``, or ``UNKNOWN`` when a launch script may set the key itself."""
    try:
        return eff.get(key)
    except UnknownKey:
        return UNKNOWN


def _script_gives(eff: EffectiveConfig, key: str, example: str, why: str) -> None:
    """PatchError unless the arguments after a launch script set ``key``, which the guardian must know."""
    if known(eff, key) is UNKNOWN:
        raise PatchError(
            f"{key} is not among the arguments after {eff.command.entry}: the guardian cannot read what the script "
            f"sets itself and must know it ({why}); pass it after the script, e.g. '{key}={example}' (the script "
            'forwards "$@" to the trainer, so that value wins)'
        )


@dataclass(frozen=True, slots=True)
class PatchPlan:
    """A relaunch: the argv (with run files), the config diff (key, before, after), and notes for the incident."""

    argv: tuple[str, ...]
    diff: tuple[tuple[str, object, object], ...]
    notes: tuple[str, ...]
    resume_from: str | None  # None: resume_mode=auto
    files: AttemptFiles
    rung: str | None = None
    optimizer_reset: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "diff": [{"key": k, "before": b, "after": a} for k, b, a in self.diff],
            "notes": list(self.notes),
            "resume_from": self.resume_from,
            "rung": self.rung,
            "optimizer_reset": self.optimizer_reset,
        }


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return list(a) == list(b)
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _apply(change: Change, before: object) -> object:
    if "set" in change.model_fields_set:
        return change.set
    if before is UNKNOWN:
        raise PatchError(
            f"cannot apply {change.describe()}: the run's current {change.key} is unknown (its launch script may set "
            f"it); pass {change.key}=VALUE after the script so the guardian can compute the new value"
        )
    if isinstance(before, bool) or not isinstance(before, int | float):
        raise PatchError(f"cannot apply {change.describe()}: the run's current value is {before!r}, not a number")
    if change.multiply is not None:
        after: float = float(f"{before * change.multiply:.12g}")  # 1e-3 * 0.2 -> 0.0002, not 0.00020000000000000004
    else:
        after = max(before, change.at_least) if change.at_least is not None else min(before, change.at_most or 0.0)
    spec = verl_keys.spec_for(change.key)
    return round(after) if spec is not None and spec.kind == "int" else after


def _resume(resume_from: str) -> str:
    try:
        path = resume_path_for(resume_from)
    except CheckpointError as exc:
        raise PatchError(str(exc)) from exc
    validate("trainer.resume_from_path", path)
    return path


def plan_patch(command: Sequence[str], rung: Rung, *, resume_from: str | None, run_files: RunFiles) -> PatchPlan:
    """Apply ``rung`` to the effective config of ``command``, resume from ``resume_from`` (None: start from
    scratch, ``resume_mode=disable``); validated, not run."""
    cmd = parse_command(command)
    eff = EffectiveConfig.of(cmd, verl_keys.defaults(), run_files.cwd, recorded=run_files.recorded)
    notes, staged = list(eff.notes), dict[str, object]()
    for change in rung.changes:
        current = {k: staged[k] if k in staged else known(eff, k) for k in (*change.when, change.key)}
        for k in change.when:
            if current[k] is UNKNOWN:
                eff.get(k)  # raises UnknownKey, naming the key to pass after the script
        if all(_same(current[k], v) for k, v in change.when.items()):
            staged[change.key] = validate(change.key, _apply(change, current[change.key]))
    changed = {k: v for k, v in staged.items() if not _same(v, known(eff, k))}
    reset = bool(rung.reset_optimizer) or LR in changed
    if reset:
        changed[LOAD_CONTENTS] = ["model"]
        what = "the patched LR takes effect" if LR in changed else "the rung asks for it"
        notes.append(f"optimizer state reset: load_contents=[model] so {what} (LR scheduler and RNG restart too)")
    changed.update(_resume_overrides(resume_from, notes))
    return _finish(cmd, eff, changed, notes, run_files, rung=rung.name, reset=reset)


RESUME_KEYS = frozenset({"trainer.resume_mode", "trainer.resume_from_path"})


def first_effective_rung(command: Sequence[str], rungs: Sequence[Rung], start: int, run_files: RunFiles) -> int:
    """The first rung from ``start`` that changes the run's config (a rung whose changes the run already
    has - "entropy bonus off" on a run without one - would relaunch the same config); the last rung when
    none does."""
    for index in range(start, len(rungs)):
        plan = plan_patch(command, rungs[index], resume_from=None, run_files=run_files)
        if any(key not in RESUME_KEYS for key, _, _ in plan.diff):
            return index
    return max(len(rungs) - 1, start)


def crash_restart_plan(command: Sequence[str], *, resume_from: str | None, run_files: RunFiles) -> PatchPlan:
    """Same config, resumed from ``resume_from`` (None: from scratch, ``resume_mode=disable``)."""
    cmd = parse_command(command)
    eff = EffectiveConfig.of(cmd, verl_keys.defaults(), run_files.cwd, recorded=run_files.recorded)
    notes = list(eff.notes)
    changed = _resume_overrides(resume_from, notes)
    return _finish(cmd, eff, changed, notes, run_files, rung=None, reset=False)


def _resume_overrides(resume_from: str | None, notes: list[str]) -> dict[str, object]:
    if resume_from is None:
        notes.append("no healthy checkpoint to resume from: the run starts again from scratch")
        return {"trainer.resume_mode": "disable"}
    return {"trainer.resume_mode": "resume_path", "trainer.resume_from_path": _resume(resume_from)}


def _finish(
    cmd: LaunchCommand,
    eff: EffectiveConfig,
    changed: dict[str, object],
    notes: list[str],
    run_files: RunFiles,
    *,
    rung: str | None,
    reset: bool,
) -> PatchPlan:
    contents = known(eff, LOAD_CONTENTS)
    if not reset and isinstance(contents, list) and "optimizer" not in contents:
        notes.append(f"the command already sets load_contents={contents}: optimizer state is not restored")
    changed = {k: validate(k, v) for k, v in changed.items()}
    files = run_files.prepare(with_overrides(cmd, changed, known_keys=verl_keys.yaml_keys()))
    notes.append(_compose_note(parse_command(files.argv), {*changed, "trainer.logger", "trainer.rollout_data_dir"}))
    diff = tuple((k, known(eff, k), v) for k, v in changed.items() if not _same(v, known(eff, k)))
    resume = changed.get("trainer.resume_from_path") if changed["trainer.resume_mode"] == "resume_path" else None
    return PatchPlan(files.argv, diff, tuple(notes), None if resume is None else str(resume), files, rung, reset)


def _compose_note(cmd: LaunchCommand, written: set[str]) -> str:
    """Compose the final overrides with verl's Hydra tree: all of them when the run uses verl's own config,
    else only those the guardian wrote (the user's config file may add keys verl's tree lacks)."""
    if cmd.script:
        ours = [o.text() for o in cmd.overrides if o.key in written or o.key.startswith(ENV_VARS)]
        return compose_check(ours) + f" (the guardian's overrides only; {cmd.entry}'s own arguments are not read)"
    if not cmd.is_verl:
        return f"{cmd.entry} is not verl: values checked against the guardian's verl 0.9.1 key list"
    if cmd.config_path is None and cmd.config_dir is None:
        return compose_check(cmd.override_texts(), config_name=cmd.config_name or "ppo_trainer")
    ours = [o.text() for o in cmd.overrides if o.key in written or o.key.startswith(ENV_VARS)]
    return compose_check(ours) + " (the guardian's overrides only; the run's own config file was not composed)"
