"""Twins: one setting run bare and under the guardian, judged against the sane control (pure, but for ``main``).

A twin call (``bash gpu/device.sh twins --settings sane,lr-high,... --both --steps N``) runs every named setting of
``gpu.scenarios.SETTINGS`` as ``<setting>.unguarded`` (the trainer alone) and/or ``<setting>.guarded`` (``guardian
run --mode enforce``), side by side. This module turns their kept evidence into the per-setting report and labels each
unguarded twin by what it did against the sane control's unguarded twin:

- figures of a run: steps reached, final reward (the mean of the last ``FINAL_STEPS`` steps of ``critic/score/mean``),
  final entropy (the same for ``actor/entropy``), its start (the mean of the first ``FINAL_STEPS`` steps);
- **unhealthy** when, at the steps both reached, its final reward is below the control's by more than
  ``max(REWARD_MARGIN_ABS, REWARD_MARGIN_REL x control)``, or its entropy collapsed (final < ``COLLAPSED`` x start)
  or exploded (final > ``EXPLODED`` x start). The onset is the earliest step of a failing mode: entropy leaving its
  band (below ``BAND_LOW`` x start or above ``BAND_HIGH`` x start), the reward starting to fall (the step after the
  peak of its 3-step mean, when it ends more than the margin below that peak), or the reward falling behind the
  control for good (the first step from which its 3-step mean stays more than the margin below the control's);
- **healthy** when its final reward is within noise of the control's or above it (noise: ``max(NOISE_ABS,
  NOISE_REL x control)``) and its entropy stayed in its band;
- **borderline** otherwise (a reward between noise and the margin below the control, or entropy out of its band
  without collapsing or exploding).

``python -m gpu.twins fixtures HARNESS_DIR OUT_DIR`` writes the unguarded twins' metrics as ``OUT_DIR/<setting>.jsonl``
and ``OUT_DIR/labels.json`` (the shape of ``tests/fixtures/traces/labels.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")
ENTROPY_KEY = "actor/entropy"
FINAL_STEPS = 3
REWARD_MARGIN_ABS = 0.05
REWARD_MARGIN_REL = 0.10
NOISE_ABS = 0.02
NOISE_REL = 0.05
COLLAPSED = 0.10
EXPLODED = 3.0
BAND_LOW = 0.5
BAND_HIGH = 2.0
CONTROL = "sane"
LABELLED_BY = "harness (unguarded twin vs sane control)"
GROUP = "verl-twins (ours)"

Metrics = Mapping[int, Mapping[str, Any]]


def series(metrics: Metrics, key: str, *, upto: int | None = None) -> list[tuple[int, float]]:
    """(step, value) of one key, in step order, up to ``upto``; missing and non-finite values left out."""
    out = []
    for step, data in sorted(metrics.items()):
        if upto is not None and step > upto:
            break
        value = data.get(key)
        if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
            out.append((step, float(value)))
    return out


def reward_key(metrics: Metrics) -> str | None:
    return next((k for k in REWARD_KEYS if series(metrics, k)), None)


def trained_steps(metrics: Metrics) -> list[int]:
    """Steps that trained (validation-only lines, such as a resume's first line, carry no entropy)."""
    return [s for s, _ in series(metrics, ENTROPY_KEY)]


def branch(attempts: Sequence[Metrics]) -> dict[int, dict[str, Any]]:
    """The run as it continued: each later attempt replaces the earlier ones from its first trained step on (a
    resume from step N replaces N+1...; a fresh start replaces everything)."""
    merged: dict[int, dict[str, Any]] = {}
    for attempt in attempts:
        steps = trained_steps(attempt)
        if steps:
            merged = {s: d for s, d in merged.items() if s < steps[0]}
        for s, d in attempt.items():
            merged.setdefault(s, {}).update(d)
    return merged


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass(frozen=True)
class Figures:
    steps: int  # the last trained step
    reward_key: str | None
    reward_start: float | None
    final_reward: float | None
    entropy_start: float | None
    final_entropy: float | None


def figures(metrics: Metrics, *, upto: int | None = None) -> Figures:
    key = reward_key(metrics)
    reward = [v for _, v in series(metrics, key, upto=upto)] if key else []
    entropy = [v for _, v in series(metrics, ENTROPY_KEY, upto=upto)]
    steps = [s for s, _ in series(metrics, ENTROPY_KEY, upto=upto)]
    return Figures(
        steps=max(steps, default=0),
        reward_key=key,
        reward_start=_mean(reward[:FINAL_STEPS]),
        final_reward=_mean(reward[-FINAL_STEPS:]),
        entropy_start=_mean(entropy[:FINAL_STEPS]),
        final_entropy=_mean(entropy[-FINAL_STEPS:]),
    )


def smoothed(points: Sequence[tuple[int, float]], n: int = FINAL_STEPS) -> list[tuple[int, float]]:
    """Trailing n-step mean, from the n-th point on."""
    return [
        (points[i][0], statistics.fmean(v for _, v in points[i - n + 1 : i + 1])) for i in range(n - 1, len(points))
    ]


@dataclass(frozen=True)
class Label:
    label: str  # healthy / unhealthy / borderline
    mode: str  # failing modes joined by "+", "" when healthy
    onset_step: int | None
    horizon: int  # the step both runs reached: where they are compared
    final_reward: float | None
    final_entropy: float | None
    entropy_start: float | None
    control_final_reward: float | None
    reward_margin: float | None
    reward_noise: float | None
    why: str


def label(run: Metrics, control: Metrics) -> Label:
    """What the unguarded twin did, against the control's unguarded twin, at the steps both reached."""
    horizon = min(figures(run).steps, figures(control).steps)
    mine, theirs = figures(run, upto=horizon), figures(control, upto=horizon)
    reasons: list[str] = []
    modes: list[str] = []
    onsets: list[int] = []
    if horizon < 2 * FINAL_STEPS or mine.final_reward is None or theirs.final_reward is None:
        why = f"too little to compare: {horizon} step(s) in common, reward key {mine.reward_key}/{theirs.reward_key}"
        return Label(
            "borderline", "not_enough_data", None, horizon, mine.final_reward, mine.final_entropy,
            mine.entropy_start, theirs.final_reward, None, None, why,
        )  # fmt: skip
    margin = max(REWARD_MARGIN_ABS, REWARD_MARGIN_REL * abs(theirs.final_reward))
    noise = max(NOISE_ABS, NOISE_REL * abs(theirs.final_reward))
    gap = theirs.final_reward - mine.final_reward
    entropy = series(run, ENTROPY_KEY, upto=horizon)
    start, final = mine.entropy_start, mine.final_entropy
    left_band = None
    if start and final is not None:
        left_band = next((s for s, v in entropy if v < BAND_LOW * start or v > BAND_HIGH * start), None)
        if final < COLLAPSED * start:
            modes.append("entropy_collapse")
            reasons.append(f"entropy {start:.3g} -> {final:.3g} (< {COLLAPSED:.0%} of its start)")
        elif final > EXPLODED * start:
            modes.append("entropy_explosion")
            reasons.append(f"entropy {start:.3g} -> {final:.3g} (> {EXPLODED:g}x its start)")
        if modes and left_band is not None:
            onsets.append(left_band)
    if gap > margin:
        modes.append("reward_below_control")
        reasons.append(
            f"final reward {mine.final_reward:.3f} vs the control's {theirs.final_reward:.3f} (margin {margin:.3f})"
        )
        onsets.extend(reward_onsets(run, control, horizon, margin))
    if modes:
        return Label(
            "unhealthy", "+".join(modes), min(onsets) if onsets else None, horizon, mine.final_reward, final, start,
            theirs.final_reward, margin, noise, "; ".join(reasons),
        )  # fmt: skip
    in_band = left_band is None
    if gap <= noise and in_band:
        why = f"final reward {mine.final_reward:.3f} vs the control's {theirs.final_reward:.3f}, entropy in its band"
        return Label(
            "healthy", "", None, horizon, mine.final_reward, final, start, theirs.final_reward, margin, noise, why
        )
    parts = []
    if gap > noise:
        parts.append(f"final reward {mine.final_reward:.3f}, {gap:.3f} below the control's (noise {noise:.3f})")
    if not in_band:
        parts.append(f"entropy left its band at step {left_band} ({start:.3g} -> {final:.3g}) without collapsing")
    mode = "+".join(m for m, on in (("reward_behind_control", gap > noise), ("entropy_out_of_band", not in_band)) if on)
    return Label(
        "borderline", mode, None, horizon, mine.final_reward, final, start, theirs.final_reward, margin, noise,
        "; ".join(parts),
    )  # fmt: skip


def reward_onsets(run: Metrics, control: Metrics, horizon: int, margin: float) -> list[int]:
    """Where the reward started falling (after the peak of its 3-step mean, if it ends more than ``margin`` below
    it) and where it fell behind the control for good (3-step means, more than ``margin`` below)."""
    key_run, key_control = reward_key(run), reward_key(control)
    if key_run is None or key_control is None:
        return []
    mine = smoothed(series(run, key_run, upto=horizon))
    theirs = dict(smoothed(series(control, key_control, upto=horizon)))
    onsets = []
    if mine:
        peak_at, peak = max(mine, key=lambda p: p[1])
        if peak - mine[-1][1] > margin:
            after = [s for s, _ in mine if s > peak_at]
            if after:
                onsets.append(after[0])
    behind = [s for s, v in mine if s in theirs and theirs[s] - v > margin]
    common = [s for s, _ in mine if s in theirs]
    if behind and common and behind[-1] == common[-1]:
        # the first step of the last unbroken stretch behind the control
        first = common[-1]
        for s in reversed(common):
            if s not in behind:
                break
            first = s
        onsets.append(first)
    return onsets


# ------------------------------------------------------------------------------------------------ the report


def _round(x: float | None, n: int = 3) -> float | None:
    return None if x is None else round(x, n)


def twin_row(
    setting: str,
    overrides: Mapping[str, str],
    unguarded: Metrics | None,
    guarded_attempts: Sequence[Metrics] | None,
    guarded_store: Mapping[str, Any] | None,
    control: Metrics | None,
    step_time: Mapping[str, float | None] | None = None,
    findings: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One setting's line: each twin's figures, the guardian's detection, steps lost and outcome, the label."""
    row: dict[str, Any] = {"setting": setting, "overrides": dict(overrides)}
    if unguarded is not None:
        f = figures(unguarded)
        row["unguarded"] = {
            **{k: _round(v) if isinstance(v, float) else v for k, v in asdict(f).items()},
            "step_time_s": (step_time or {}).get("unguarded"),
        }
        if control is not None:
            row["label"] = {
                k: _round(v, 4) if isinstance(v, float) else v for k, v in asdict(label(unguarded, control)).items()
            }
    if guarded_attempts is not None:
        merged = branch(guarded_attempts)
        g = figures(merged)
        row["guarded"] = {
            **{k: _round(v) if isinstance(v, float) else v for k, v in asdict(g).items()},
            "attempts": len(guarded_attempts),
            "step_time_s": (step_time or {}).get("guarded"),
            **guardian_outcome(guarded_store or {}),
            "findings": list(findings),
        }
        if unguarded is not None:
            u = figures(unguarded)
            if g.final_reward is not None and u.final_reward is not None:
                row["guarded_minus_unguarded_reward"] = _round(g.final_reward - u.final_reward)
    return row


def first_findings(events: Sequence[Any]) -> list[dict[str, Any]]:
    """The first ``finding`` the guardian raised of each check and severity (``gpu.verdict.LogEvent``s of its
    guardian.log): warnings included, which open no incident."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if e.name != "finding" or e.fields.get("change") != "raised":
            continue
        key = (e.fields.get("check", "?"), e.fields.get("severity", "?"))
        if key not in seen:
            step = e.fields.get("step", "")
            seen[key] = {"check": key[0], "severity": key[1], "step": int(step) if step.isdigit() else None}
    return sorted(seen.values(), key=lambda f: (f["step"] is None, f["step"] or 0))


def guardian_outcome(store: Mapping[str, Any]) -> dict[str, Any]:
    """Detection step, rollback step, steps lost and the outcome verdict, from the guardian's own store
    (``incidents list --json`` and ``incidents show --json``)."""
    listed = store.get("incidents") if isinstance(store.get("incidents"), list) else []
    shown = [x for x in store.get("shown", []) if isinstance(x, dict)]
    incidents = [
        {k: i.get(k) for k in ("id", "check", "severity", "status", "opened_step", "onset_step")} for i in listed
    ]
    interventions = [iv for inc in shown for iv in inc.get("interventions", [])]
    acted = next((inc for inc in shown if inc.get("interventions")), None)
    first_critical = next((i for i in listed if i.get("severity") == "critical"), None)
    detection = acted.get("opened_step") if acted else (first_critical or {}).get("opened_step")
    iv = interventions[0] if interventions else None
    target = iv.get("target_step") if iv else None
    return {
        "incidents": incidents,
        "interventions": len(interventions),
        "detection_step": detection,
        "detected_by": (acted or first_critical or {}).get("check"),
        "rollback_step": target,
        "steps_lost": detection - target if detection is not None and target is not None else None,
        "outcome": iv.get("state") if iv else None,
        "outcomes": [x.get("state") for x in interventions],
    }


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        f"{'setting':<20} {'label':<11} {'onset':>5} {'steps':>5} {'R unguarded':>11} {'H unguarded':>11} "
        f"{'R guarded':>9} {'H guarded':>9} {'detect':>6} {'lost':>4}  {'outcome':<10}  first finding"
    )
    lines = [head]

    def cell(d: Mapping[str, Any] | None, key: str, fmt: str = ".3f") -> str:
        v = (d or {}).get(key)
        return "-" if v is None else format(v, fmt) if isinstance(v, float) else str(v)

    for r in rows:
        u, g, lab = r.get("unguarded"), r.get("guarded"), r.get("label")
        steps = "/".join(cell(x, "steps") for x in (u, g) if x)
        found = (g or {}).get("findings") or []
        first = f"{found[0]['check']}:{found[0]['severity']}@{found[0]['step']}" if found else "-"
        lines.append(
            f"{r['setting']:<20} {cell(lab, 'label'):<11} {cell(lab, 'onset_step'):>5} {steps:>5} "
            f"{cell(u, 'final_reward'):>11} {cell(u, 'final_entropy'):>11} {cell(g, 'final_reward'):>9} "
            f"{cell(g, 'final_entropy'):>9} {cell(g, 'detection_step'):>6} {cell(g, 'steps_lost'):>4}  "
            f"{cell(g, 'outcome'):<10}  {first}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ fixtures


def read_jsonl(path: Path) -> dict[int, dict[str, Any]]:
    """verl's file logger: one ``{"step": N, "data": {...}}`` a line (several lines of a step merged)."""
    steps: dict[int, dict[str, Any]] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"), dict):
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


def fixture_labels(harness: Path, overrides: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """labels.json entries for every ``<setting>.unguarded/unguarded/metrics.jsonl`` under ``harness``."""
    runs = {
        p.parent.parent.name.removesuffix(".unguarded"): read_jsonl(p)
        for p in sorted(harness.glob("*.unguarded/unguarded/metrics.jsonl"))
    }
    if CONTROL not in runs:
        raise ValueError(f"gpu.twins: no {CONTROL}.unguarded run under {harness}: nothing to label against")
    entries = []
    for name, metrics in runs.items():
        lab = label(metrics, runs[CONTROL])
        entries.append(
            {
                "file": f"{name}.jsonl",
                "label": lab.label,
                "mode": lab.mode or None,
                "onset_step": lab.onset_step,
                "labelled_by": LABELLED_BY,
                "records": len(metrics),
                "group": GROUP,
                "framework": "verl 0.9.1 (main_ppo, V1 trainer, FSDP, hf rollout plugin), one H200",
                "model": "gpu.tiny: 2-layer Qwen2, hidden 128, random init (seed 0); copy-digit task",
                "setting": name,
                "overrides": dict(overrides.get(name, {})),
                "steps": figures(metrics).steps,
                "compared_at_step": lab.horizon,
                "final_reward": _round(lab.final_reward, 4),
                "final_entropy": _round(lab.final_entropy, 4),
                "entropy_start": _round(lab.entropy_start, 4),
                "control_final_reward": _round(lab.control_final_reward, 4),
                "why": lab.why,
            }
        )
    return entries


def arrivals(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario, from the sampler's rows: when its first and last step line appeared (seconds after the first
    sample: the start-up, and the end), how many steps, and the median seconds between step lines."""
    if not samples:
        return {}
    t0 = min(float(r["t"]) for r in samples)
    seen: dict[str, dict[int, float]] = {}
    for r in samples:
        if r.get("kind") == "step":
            seen.setdefault(r["scenario"], {}).setdefault(int(r["step"]), float(r["t"]) - t0)
    out = {}
    for name, steps in sorted(seen.items()):
        times = [steps[k] for k in sorted(steps)]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        out[name] = {
            "first_step_s": round(times[0], 1),
            "last_step_s": round(times[-1], 1),
            "steps": len(times),
            "step_s_median": round(statistics.median(gaps), 2) if gaps else None,
        }
    return out


def write_fixtures(harness: Path, out: Path, overrides: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """The unguarded twins' metrics as ``<setting>.jsonl``, ``labels.json``, and the call's small files in ``call/``:
    the verdict, the machine, every twin's command line and the step arrival times (not the console logs or the
    sampler's rows, and never checkpoint weights)."""
    entries = fixture_labels(harness, overrides)
    out.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        source = harness / f"{entry['setting']}.unguarded" / "unguarded" / "metrics.jsonl"
        (out / entry["file"]).write_bytes(source.read_bytes())
    (out / "labels.json").write_text(json.dumps(entries, indent=1) + "\n")
    call = out / "call"
    call.mkdir(exist_ok=True)
    for name in ("verdict.json", "machine.txt"):
        if (harness / name).exists():
            (call / name).write_bytes((harness / name).read_bytes())
    argv = {p.parent.name: json.loads(p.read_text()) for p in sorted(harness.glob("*/argv.json"))}
    (call / "argv.json").write_text(json.dumps(argv, indent=1) + "\n")
    rows = []
    if (harness / "samples.jsonl").exists():
        for line in (harness / "samples.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    (call / "timing.json").write_text(json.dumps(arrivals(rows), indent=1) + "\n")
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    from gpu.scenarios import SETTINGS

    p = argparse.ArgumentParser(prog="python -m gpu.twins", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    fx = sub.add_parser("fixtures", help="unguarded twins' metrics and labels.json from an unpacked harness folder")
    fx.add_argument("harness", type=Path, help="the unpacked harness/ folder of a twin call")
    fx.add_argument("out", type=Path)
    args = p.parse_args(argv)
    entries = write_fixtures(args.harness, args.out, {name: s.verl for name, s in SETTINGS.items()})
    for e in entries:
        print(f"{e['setting']:<20} {e['label']:<10} onset {e['onset_step']}  {e['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
