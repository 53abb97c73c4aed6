"""Judge a harness run from its evidence alone (pure: reads the kept files, returns assertions and measurements).

The collapse step is defined outside the guardian, from the trainer's own metrics: the first step whose
``actor/entropy`` is below half the mean of the run's first three steps. Detection is the step at which the
guardian opened the incident. Everything else is read from what the guardian wrote (guardian.log, its store's
``incidents show --json``, each attempt's files) and from what the sampler saw from outside (``samples.jsonl``).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpu import twins
from gpu.scenarios import LR_KEY, Scenario
from guardian.sources.jsonl import read_all
from recipe.agent.protocol import INVALID_SEARCH_NOTE, OBSERVATION_CLOSE, OBSERVATION_OPEN
from recipe.prompt import SEARCH_CLOSE

DETECTION_LIMIT_STEPS = 6
COLLAPSE_FRACTION = 0.5
GPU_RELEASE_LIMIT_S = 30.0
"""every GPU's memory held by a stopped attempt must be back to 0 within this of the stop's first signal (the
harness's stop escalation is 20 s of SIGINT, then 10 s of SIGTERM, then SIGKILL)"""
_EVENT = re.compile(r"^(\S+ \S+) (\w+) (\S+) event=(\S+)(.*)$")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_SERVED = re.compile(r"search-server: served (.*)$", re.MULTILINE)
_DUP = re.compile(r"\.dup[1-9][0-9]*$")  # a quarantined folder whose name was taken (checkpoints.quarantine)


@dataclass(frozen=True)
class LogEvent:
    at: float
    level: str
    name: str
    fields: dict[str, str]


def parse_log(text: str) -> list[LogEvent]:
    events = []
    for line in text.splitlines():
        m = _EVENT.match(line)
        if not m:
            continue
        try:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        fields = {k: v[1:-1] if v.startswith('"') else v for k, v in _FIELD.findall(m.group(5))}
        events.append(LogEvent(at, m.group(2), m.group(4), fields))
    return events


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """verl's file logger, read by the guardian's own reader; several lines of one step are merged."""
    steps: dict[int, dict[str, Any]] = {}
    if path.exists():
        for record in read_all(path)[0]:
            steps.setdefault(record.step, {}).update(record.data)
    return steps


def collapse_step(metrics: Mapping[int, Mapping[str, Any]]) -> int | None:
    entropy = [(s, float(m["actor/entropy"])) for s, m in sorted(metrics.items()) if "actor/entropy" in m]
    if len(entropy) < 4:
        return None
    baseline = statistics.fmean(e for _, e in entropy[:3])
    return next((s for s, e in entropy if e < COLLAPSE_FRACTION * baseline), None)


def last_value(argv: Sequence[str], key: str) -> str | None:
    """The text of the last override of ``key`` in a launch command (``+``/``++`` forms included). Read token by
    token, not through Hydra's grammar: recorded evidence masks machine paths (``<tiny>/...``), which Hydra refuses."""
    texts = [token.partition("=")[2] for token in argv if "=" in token and token.partition("=")[0].lstrip("+") == key]
    return texts[-1] if texts else None


def _check(checks: list[dict[str, Any]], name: str, passed: bool, detail: str) -> None:
    checks.append({"name": name, "passed": bool(passed), "detail": detail})


def _samples(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def guardian_usage(samples: list[dict[str, Any]], scenario: str, *, since: float = 0.0) -> dict[str, float] | None:
    """Mean CPU share of one core (%) and peak RSS (MB) of the scenario's guardian process(es), from ``since``."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for row in samples:
        if row["kind"] == "guardian" and row["scenario"] == scenario and row["t"] >= since:
            by_pid.setdefault(row["pid"], []).append(row)
    cpu = wall = 0.0
    rss = 0.0
    for rows in by_pid.values():
        if len(rows) >= 2:
            cpu += rows[-1]["cpu_s"] - rows[0]["cpu_s"]
            wall += rows[-1]["t"] - rows[0]["t"]
        rss = max([rss, *(r["rss_mb"] for r in rows)])
    if wall <= 0:
        return None
    return {"cpu_percent": round(100 * cpu / wall, 2), "rss_mb_peak": round(rss, 1), "seconds": round(wall, 1)}


def _attempt_dir(out: Path, s: Scenario, number: int) -> Path:
    return out / s.name / "runs" / s.run_id / f"attempt-{number}"


def _first_seen(samples: list[dict[str, Any]], path_suffix: str, after_step: int) -> float | None:
    times = [
        r["t"] for r in samples if r["kind"] == "step" and r["file"].endswith(path_suffix) and r["step"] > after_step
    ]
    return min(times) if times else None


@dataclass(frozen=True)
class Stop:
    """One guardian stop of attempt ``attempt``: its first signal, the stop line, and the next attempt's launch."""

    attempt: int
    signal_at: float
    stop: LogEvent | None
    relaunch_at: float | None


def stops(events: Sequence[LogEvent]) -> list[Stop]:
    """Every attempt the guardian signalled, matched by the process group it launched (``attempt_launched pid``)."""
    launched = [e for e in events if e.name == "attempt_launched" and e.fields.get("attempt", "").isdigit()]
    attempt_of = {e.fields.get("pid"): int(e.fields["attempt"]) for e in launched}
    found: dict[int, Stop] = {}
    for e in events:
        if e.name not in ("trainer_signal", "trainer_stop") or e.fields.get("pgid") not in attempt_of:
            continue
        number = attempt_of[e.fields["pgid"]]
        if e.name == "trainer_stop" and e.fields.get("result") != "gone":
            continue  # "already_gone": the trainer ended by itself
        earlier = found.get(number)
        if earlier is None:
            nxt = next((x.at for x in launched if int(x.fields["attempt"]) == number + 1), None)
            found[number] = Stop(number, e.at, e if e.name == "trainer_stop" else None, nxt)
        elif e.name == "trainer_stop" and earlier.stop is None:
            found[number] = Stop(number, earlier.signal_at, e, earlier.relaunch_at)
    return [found[k] for k in sorted(found)]


def gpu_count(samples: Sequence[Mapping[str, Any]]) -> int:
    """How many GPUs nvidia-smi listed (0 without GPU samples)."""
    return max((len(r.get("used_mib") or []) for r in samples if r["kind"] == "gpu"), default=0)


def attempt_pids(samples: Sequence[Mapping[str, Any]], run_id: str, attempt: int) -> set[int]:
    """Every pid the sampler saw carrying the attempt's metrics path."""
    tail = f"/{run_id}/attempt-{attempt}/"
    return {
        pid
        for row in samples
        if row["kind"] == "procs"
        for path, procs in row["attempts"].items()
        if tail in path
        for pid in procs["pids"]
    }


def held_per_gpu(
    samples: Sequence[Mapping[str, Any]], pids: set[int]
) -> list[tuple[float, dict[int, float], dict[int, set[int]]]]:
    """Per GPU sample: (time, MiB held by ``pids`` per GPU index, which of ``pids`` are listed per GPU). Samples from
    before GPUs were named by index (one GPU) count as GPU 0."""
    rows = []
    for r in samples:
        if r["kind"] != "gpu":
            continue
        n = max(1, len(r.get("used_mib") or []))
        mib = dict.fromkeys(range(n), 0.0)
        listed: dict[int, set[int]] = {g: set() for g in range(n)}
        for app in r.get("apps", []):
            if app["pid"] in pids:
                g = int(app.get("gpu", 0))
                mib[g] = mib.get(g, 0.0) + float(app["mib"])
                listed.setdefault(g, set()).add(app["pid"])
        rows.append((float(r["t"]), mib, listed))
    return rows


def gpu_release(samples: Sequence[Mapping[str, Any]], pids: set[int], stop: Stop) -> dict[str, Any]:
    """What one stopped attempt held on each GPU before its first signal, when each GPU was free of it, and what it
    still held (or which of its processes were still listed) once the next attempt launched."""
    rows = held_per_gpu(samples, pids)
    gpus = sorted({g for _, mib, _ in rows for g in mib})
    before = {g: max((mib[g] for t, mib, _ in rows if t <= stop.signal_at and g in mib), default=0.0) for g in gpus}
    holders = {
        g: max((len(listed.get(g, ())) for t, _, listed in rows if t <= stop.signal_at), default=0) for g in gpus
    }
    released: dict[int, float | None] = {}
    for g in gpus:
        free = next(
            (t for t, mib, listed in rows if t > stop.signal_at and mib.get(g, 0) == 0 and not listed.get(g)), None
        )
        released[g] = None if free is None else round(free - stop.signal_at, 1)
    after = [(t, mib, listed) for t, mib, listed in rows if stop.relaunch_at is not None and t >= stop.relaunch_at]
    held_after = {g: max((mib.get(g, 0.0) for _, mib, _ in after), default=0.0) for g in gpus}
    survivors = sorted({pid for _, _, listed in after for pids_on in listed.values() for pid in pids_on})
    return {
        "gpus": gpus,
        "mib_before": before,
        "holders_before": holders,
        "released_s": released,
        "mib_after_relaunch": held_after,
        "survivors_on_gpu": survivors,
    }


def _step_time(metrics: Mapping[int, Mapping[str, Any]]) -> float | None:
    times = [float(m["timing_s/step"]) for s, m in sorted(metrics.items()) if s >= 3 and "timing_s/step" in m]
    return statistics.median(times) if times else None


def judge_guarded(out: Path, s: Scenario, result: Mapping[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []
    measures: dict[str, Any] = {}
    run_dir = out / s.name / "runs" / s.run_id
    log_path = run_dir / "guardian.log"
    events = parse_log(log_path.read_text(errors="replace")) if log_path.exists() else []
    store = json.loads((out / s.name / "store.json").read_text()) if (out / s.name / "store.json").exists() else {}
    shown = [x for x in store.get("shown", []) if isinstance(x, dict) and "interventions" in x]
    interventions = [iv for inc in shown for iv in inc["interventions"]]
    attempts = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("attempt-*") if p.name.split("-")[1].isdigit())
    measures["attempts"] = len(attempts)
    measures["interventions"] = len(interventions)
    returncodes = list(result.get("returncodes", []))
    measures["returncodes"] = returncodes
    usage = guardian_usage(samples, s.name)
    if usage:
        measures["guardian"] = usage
    first_step = min((r["t"] for r in samples if r["kind"] == "step" and r["scenario"] == s.name), default=None)
    guarding = guardian_usage(samples, s.name, since=first_step) if first_step is not None else None
    if guarding:
        measures["guardian_while_steps_arrive"] = guarding  # without the start-up (imports, store migration)

    # exactly one trainer at any time, seen from outside
    mine = f"/{s.run_id}/attempt-"  # the sampler saw the device's paths: match the attempt's tail
    worst = 0
    for row in samples:
        if row["kind"] == "procs":
            drivers = sum(len(v["drivers"]) for k, v in row["attempts"].items() if mine in k)
            worst = max(worst, drivers)
    _check(checks, "one_trainer_at_a_time", worst == 1, f"at most {worst} trainer process(es) alive at once")

    if not s.expect_intervention:
        _check(checks, "no_intervention", not interventions, f"{len(interventions)} intervention(s)")
        _check(checks, "guardian_exit_0", returncodes[-1:] == [0], f"guardian exit codes {returncodes}")
        final = read_metrics(_attempt_dir(out, s, attempts[-1]) / "metrics.jsonl") if attempts else {}
        last = max(final, default=0)
        _check(checks, "reached_total_steps", last >= s.total_steps, f"last step {last} of {s.total_steps}")
        measures["step_time_s"] = _step_time(final)
        return {"checks": checks, "measures": measures}

    first = read_metrics(_attempt_dir(out, s, 1) / "metrics.jsonl")
    collapse = collapse_step(first)
    measures["collapse_step"] = collapse
    opened = next((e for e in events if e.name == "incident_opened"), None)
    detect = int(opened.fields["step"]) if opened else None
    measures["detection_step"] = detect
    _check(
        checks,
        "detected_within_6_steps",
        detect is not None and collapse is not None and detect - collapse <= DETECTION_LIMIT_STEPS,
        f"collapse (entropy < {COLLAPSE_FRACTION:.0%} of its start) at step {collapse}, "
        f"incident opened at step {detect}",
    )
    if opened is not None and collapse is not None:
        seen = _first_seen(samples, "attempt-1/metrics.jsonl", collapse - 1)
        measures["detection_delay_steps"] = None if detect is None else detect - collapse
        measures["detection_delay_s"] = None if seen is None else round(opened.at - seen, 1)

    iv = interventions[0] if interventions else None
    target = iv.get("target_step") if iv else None
    measures["rollback_step"] = target
    if detect is not None and target is not None:
        measures["steps_lost"] = detect - target
    stop = next((e for e in events if e.name == "trainer_stop" and e.fields.get("result") == "gone"), None)
    measures["stop_s"] = float(stop.fields["seconds"]) if stop and "seconds" in stop.fields else None
    _check(checks, "trainer_stopped", stop is not None, f"trainer_stop: {stop.fields if stop else 'none logged'}")

    relaunch = next(
        (e for e in events if e.name == "attempt_launched" and e.fields.get("attempt") == "2"), None
    )  # the patched trainer
    if relaunch is not None:
        attempt1 = str(_attempt_dir(out, s, 1))
        tail = f"/{s.run_id}/attempt-1/"
        alive_after = [
            row["t"]
            for row in samples
            if row["kind"] == "procs"
            and row["t"] >= relaunch.at
            and any(tail in k and v["pids"] for k, v in row["attempts"].items())
        ]
        _check(
            checks,
            "attempt_1_processes_gone_before_relaunch",
            not alive_after,
            f"{len(alive_after)} sample(s) saw a process of {attempt1} after attempt 2 launched",
        )
        stopped = stops(events)
        releases = [(st, gpu_release(samples, attempt_pids(samples, s.run_id, st.attempt), st)) for st in stopped]
        measures["stops"] = [
            {
                "attempt": st.attempt,
                "stop_s": float(st.stop.fields["seconds"]) if st.stop and "seconds" in st.stop.fields else None,
                "signals": st.stop.fields.get("signals") if st.stop else None,
                **{k: v for k, v in rel.items() if k != "gpus"},
            }
            for st, rel in releases
        ]
        first_release = releases[0][1] if releases else None
        seen_gpus = gpu_count(samples)
        if first_release is not None and seen_gpus:
            measures["gpu_mib_held_by_attempt_1"] = sum(first_release["mib_before"].values())
            freed = list(first_release["released_s"].values())
            if freed and all(x is not None for x in freed):
                measures["gpu_freed_s_after_stop_signal"] = max(freed)
        if not seen_gpus or not releases:
            why = "no GPU samples (no nvidia-smi here): not measured" if not seen_gpus else "no stop logged"
            for name in ("every_gpu_held_by_the_attempt", "gpu_memory_released", "every_gpu_released_within_30s"):
                _check(checks, name, False, why)
        else:
            expected = range(s.gpus)
            unused = [(st.attempt, g) for st, rel in releases for g in expected if rel["mib_before"].get(g, 0.0) <= 0]
            spread = "; ".join(
                f"attempt {st.attempt}: "
                + ", ".join(
                    f"GPU {g} {rel['mib_before'].get(g, 0.0):.0f} MiB in {rel['holders_before'].get(g, 0)} process(es)"
                    for g in expected
                )
                for st, rel in releases
            )
            _check(
                checks,
                "every_gpu_held_by_the_attempt",
                not unused and seen_gpus >= s.gpus,
                f"{s.gpus} GPU(s) expected, {seen_gpus} listed; before its stop {spread}"
                + (f"; nothing held on (attempt, GPU) {unused}" if unused else ""),
            )
            held = [
                (st.attempt, g, mib) for st, rel in releases for g, mib in rel["mib_after_relaunch"].items() if mib > 0
            ]
            survivors = [(st.attempt, rel["survivors_on_gpu"]) for st, rel in releases if rel["survivors_on_gpu"]]
            unrelaunched = [st.attempt for st in stopped if st.relaunch_at is None]
            _check(
                checks,
                "gpu_memory_released",
                not held and not survivors and not unrelaunched,
                f"after the next attempt launched, a stopped attempt's processes held {held or 'nothing'} "
                f"(attempt, GPU, MiB) and were listed on a GPU: {survivors or 'none'} "
                f"(nvidia-smi --query-compute-apps, per pid and GPU)"
                + (f"; no relaunch after the stop of attempt(s) {unrelaunched}" if unrelaunched else ""),
            )
            late = [
                (st.attempt, g, sec)
                for st, rel in releases
                for g, sec in rel["released_s"].items()
                if sec is None or sec > GPU_RELEASE_LIMIT_S
            ]
            times = "; ".join(
                f"attempt {st.attempt}: " + ", ".join(f"GPU {g} {sec} s" for g, sec in rel["released_s"].items())
                for st, rel in releases
            )
            _check(
                checks,
                "every_gpu_released_within_30s",
                not late,
                f"freed after the stop's first signal: {times}" + (f"; late or never: {late}" if late else ""),
            )
        resumed_first = _first_seen(samples, "attempt-2/metrics.jsonl", target or 0)
        if opened is not None and resumed_first is not None:
            measures["detection_to_resumed_first_step_s"] = round(resumed_first - opened.at, 1)

    quarantine = out / s.name / "quarantine.json"
    manifests = json.loads(quarantine.read_text()) if quarantine.exists() else {}
    # every save the trainer made of each folder name: a step saved again after a rollback and quarantined by a later
    # intervention lies beside the first as global_step_N.dupK
    seen: dict[str, list[dict[str, int]]] = {}
    for row in samples:
        if row["kind"] == "ckpt" and row["scenario"] == s.name:
            seen.setdefault(Path(row["folder"]).name, []).append(row["files"])
    broken = [name for name, files in manifests.items() if files not in seen.get(_DUP.sub("", Path(name).name), [])]
    _check(
        checks,
        "quarantined_checkpoints_intact",
        bool(manifests) and not broken,
        f"{len(manifests)} quarantined folder(s); differing from what the trainer wrote: {broken or 'none'}",
    )

    if iv is not None and len(attempts) >= 2:
        expected = last_value(iv.get("plan", {}).get("argv", []), LR_KEY)
        second = read_metrics(_attempt_dir(out, s, 2) / "metrics.jsonl")
        trained = [m for step, m in sorted(second.items()) if "actor/lr" in m]
        got = trained[0]["actor/lr"] if trained else None
        ok = (
            expected is not None
            and got is not None
            and abs(float(got) - float(expected)) <= 1e-9 + 1e-6 * abs(float(expected))
        )
        changed = any(d.get("key") == LR_KEY for d in iv.get("plan", {}).get("diff", []))
        measures["resumed_lr"], measures["lr_patched"] = got, changed
        how = "patched" if changed else "not changed by this rung: the run's own"
        detail = f"{LR_KEY}={expected} in the relaunch ({how}); attempt 2 logs actor/lr={got}"
        _check(checks, "resumed_lr_is_the_patched_lr", ok, detail)
    else:
        _check(checks, "resumed_lr_is_the_patched_lr", False, "no resumed attempt")

    final_state = iv.get("state") if iv else None
    measures["outcome"] = final_state
    resolved = [e for e in events if e.name == "incident_resolved"]
    _check(
        checks,
        "outcome_verified_resolved_once",
        final_state == "RESOLVED" and len(resolved) == 1,
        f"intervention state {final_state}; incident_resolved logged {len(resolved)} time(s)",
    )
    _check(
        checks,
        "one_relaunch_per_intervention",
        len(attempts) == len(interventions) + 1,
        f"{len(attempts)} attempts for {len(interventions)} intervention(s)",
    )
    if s.kill_guardian:
        attached = [e for e in events if e.name == "run_attached"]
        _check(
            checks,
            "killed_guardian_reattached",
            returncodes[:1] == [-9] and returncodes[-1:] == [0] and len(attached) == 1,
            f"guardian exit codes {returncodes}; run_attached logged {len(attached)} time(s)",
        )
        states = [ev["state"] for ev in (iv or {}).get("events", [])]
        twice = [x for x in ("STOPPING", "ROLLED_BACK", "PATCHED", "RESUMING") if states.count(x) > 1]
        _check(checks, "no_state_committed_twice", not twice, f"states {states}")
    else:
        _check(checks, "guardian_exit_0", returncodes[-1:] == [0], f"guardian exit codes {returncodes}")
    return {"checks": checks, "measures": measures}


def rollout_searches(dump_dir: Path) -> dict[str, Any]:
    """What the search agent did, read from verl's rollout dumps. An executed search is a ``</search>`` followed by
    the environment's observation (``recipe.agent.protocol``'s layout: passages from ``Doc 1`` on, or an empty block
    when nothing matched); a random model also writes ``<result>`` tags of its own, which are not counted."""
    rows = []
    for path in sorted(dump_dir.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    executed = SEARCH_CLOSE + OBSERVATION_OPEN
    outputs = [str(row.get("output", "")) for row in rows]
    passages = [text.count(executed + "Doc 1 ") for text in outputs]
    empties = [text.count(executed + OBSERVATION_CLOSE) for text in outputs]
    with_passages, empty = sum(passages), sum(empties)
    scores = [float(row["score"]) for row in rows if isinstance(row.get("score"), int | float)]
    return {
        "trajectories": len(rows),
        "with_search": sum(p + e > 0 for p, e in zip(passages, empties, strict=True)),
        "searches": with_passages + empty,
        "searches_with_passages": with_passages,
        "invalid_turn_notes": sum(text.count(INVALID_SEARCH_NOTE) for text in outputs),
        "mean_score": statistics.fmean(scores) if scores else None,
        "max_score": max(scores, default=None),
    }


def judge_recipe(out: Path, s: Scenario, result: Mapping[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The recipe's one command ran training to the end under an observing guardian, and its rollouts really
    searched: tool calls in the dumps, passages returned by the retrieval server."""
    checks: list[dict[str, Any]] = []
    codes = list(result.get("returncodes", []))
    run_dir = out / s.name / "runs" / s.run_id
    metrics = read_metrics(run_dir / "attempt-1" / "metrics.jsonl")
    last = max(metrics, default=0)
    _check(checks, "run_sh_exit_0", codes[-1:] == [0], f"recipe/run.sh exit codes {codes}")
    _check(checks, "reached_total_steps", last >= s.total_steps, f"last step {last} of {s.total_steps}")
    dumps = next((p for p in sorted((out / s.name).glob("rollouts/**/")) if any(p.glob("*.jsonl"))), None)
    searched = rollout_searches(dumps) if dumps is not None else {"trajectories": 0}
    _check(
        checks,
        "rollouts_searched",
        searched.get("searches_with_passages", 0) > 0,
        f"{searched.get('searches', 0)} searches executed in {searched['trajectories']} trajectories, "
        f"{searched.get('searches_with_passages', 0)} answered with passages",
    )
    server_log = out / s.name / "logs" / "retrieval_server.log"
    summary = _SERVED.search(server_log.read_text(errors="replace")) if server_log.exists() else None
    served = {k: float(v) for k, v in _FIELD.findall(summary.group(1))} if summary else {}
    _check(
        checks,
        "retrieval_server_answered",
        served.get("queries", 0) >= searched.get("searches", 0) > 0,
        f"the server's summary line: {summary.group(1) if summary else 'missing'}",
    )
    store = json.loads((out / s.name / "store.json").read_text()) if (out / s.name / "store.json").exists() else {}
    incidents = store.get("incidents", []) if isinstance(store.get("incidents"), list) else []
    measures: dict[str, Any] = {
        "step_time_s": _step_time(metrics),
        "rollouts": searched,
        "num_turns_mean": [metrics[k].get("num_turns/mean") for k in sorted(metrics)],
        "response_length_mean": [metrics[k].get("response_length/mean") for k in sorted(metrics)],
        "guardian_incidents": [{k: i.get(k) for k in ("id", "check", "severity", "state")} for i in incidents],
        "retrieval_server": served,
        "returncodes": codes,
    }
    measures.update(throughput(metrics))
    usage = guardian_usage(samples, s.name)
    if usage:
        measures["guardian"] = usage
    first_step = min((r["t"] for r in samples if r["kind"] == "step" and r["scenario"] == s.name), default=None)
    guarding = guardian_usage(samples, s.name, since=first_step) if first_step is not None else None
    if guarding:
        measures["guardian_while_steps_arrive"] = guarding
    if s.gpus > 1:
        rows = held_per_gpu(samples, attempt_pids(samples, s.run_id, 1))
        peak = {g: max((mib.get(g, 0.0) for _, mib, _ in rows), default=0.0) for g in range(s.gpus)}
        holders = {g: max((len(listed.get(g, ())) for _, _, listed in rows), default=0) for g in range(s.gpus)}
        measures["gpu_mib_peak"], measures["gpu_holders"] = peak, holders
        unused = [g for g, mib in peak.items() if mib <= 0]
        _check(
            checks,
            "every_gpu_held_by_the_attempt",
            bool(rows) and not unused and gpu_count(samples) >= s.gpus,
            f"{s.gpus} GPU(s) expected, {gpu_count(samples)} listed; peak MiB per GPU {peak}, processes {holders}"
            + (f"; nothing held on GPU(s) {unused}" if unused else ""),
        )
    return {"checks": checks, "measures": measures}


def throughput(metrics: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Step time and tokens/s from verl's own perf keys (steps from 3 on: the first steps carry warm-up):
    ``perf/total_num_tokens`` (prompt + response tokens of the step's batch) over ``timing_s/step``, verl's
    ``perf/throughput`` (the same per trainer GPU), and the medians of generation, weight sync and actor update."""

    def median(key: str, value: Any = None) -> float | None:
        got = [
            float(v)
            for step, m in sorted(metrics.items())
            if step >= 3 and (v := (value(m) if value else m.get(key))) is not None
        ]
        return round(statistics.median(got), 3) if got else None

    def ratio(m: Mapping[str, Any], top: str, bottom: str) -> float | None:
        a, b = m.get(top), m.get(bottom)
        return float(a) / float(b) if a is not None and b else None

    return {
        "steps_seen": len(metrics),
        "step_time_s_median": median("timing_s/step"),
        "gen_s_median": median("timing_s/gen"),
        "update_weights_s_median": median("timing_s/update_weights"),
        "update_actor_s_median": median("timing_s/update_actor"),
        "tokens_per_s_median": median("", lambda m: ratio(m, "perf/total_num_tokens", "timing_s/step")),
        "tokens_per_s_per_gpu_median": median("perf/throughput"),
    }


def judge_unguarded(out: Path, s: Scenario, result: Mapping[str, Any]) -> dict[str, Any]:
    metrics = read_metrics(out / s.name / "unguarded" / "metrics.jsonl")
    last = max(metrics, default=0)
    checks: list[dict[str, Any]] = []
    codes = list(result.get("returncodes", []))
    _check(checks, "trainer_exit_0", codes[-1:] == [0], f"exit codes {codes}")
    _check(checks, "reached_total_steps", last >= s.total_steps, f"last step {last} of {s.total_steps}")
    return {"checks": checks, "measures": {"step_time_s": _step_time(metrics), "returncodes": codes}}


def twin_metrics(out: Path, s: Scenario) -> list[dict[int, dict[str, Any]]]:
    """A twin's metrics: the bare trainer's one file, or each attempt's under the guardian, in attempt order."""
    if not s.guarded:
        return [read_metrics(out / s.name / "unguarded" / "metrics.jsonl")]
    run_dir = out / s.name / "runs" / s.run_id
    numbers = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("attempt-*") if p.name.split("-")[1].isdigit())
    return [read_metrics(_attempt_dir(out, s, n) / "metrics.jsonl") for n in numbers]


def judge_twin(out: Path, s: Scenario, result: Mapping[str, Any]) -> dict[str, Any]:
    """A twin ran its steps (the report, ``twins.twin_row``, says what it did); the control's guarded twin must not
    have been touched."""
    checks: list[dict[str, Any]] = []
    codes = list(result.get("returncodes", []))
    attempts = twin_metrics(out, s)
    run = twins.branch(attempts)
    last = twins.figures(run).steps
    _check(checks, "reached_total_steps", last >= s.total_steps, f"last step {last} of {s.total_steps}")
    measures: dict[str, Any] = {"returncodes": codes, "step_time_s": _step_time(attempts[-1]) if attempts else None}
    if s.guarded:
        store_path = out / s.name / "store.json"
        store = json.loads(store_path.read_text()) if store_path.exists() else {}
        outcome = twins.guardian_outcome(store)
        measures.update(outcome)
        if s.setting == twins.CONTROL:
            _check(
                checks,
                "no_intervention_on_the_control",
                not outcome["interventions"],
                f"{outcome['interventions']} intervention(s)",
            )
    else:
        _check(checks, "trainer_exit_0", codes[-1:] == [0], f"exit codes {codes}")
    return {"checks": checks, "measures": measures}


def twin_report(out: Path, chosen: Mapping[str, Scenario], judged: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per setting: both twins' figures, the guardian's detection, steps lost and outcome, the unguarded twin's
    label against the control's unguarded twin (its guarded twin when it ran alone)."""
    by_setting: dict[str, dict[bool, Scenario]] = {}
    for s in chosen.values():
        if s.setting:
            by_setting.setdefault(s.setting, {})[s.guarded] = s
    control_pair = by_setting.get(twins.CONTROL, {})
    control_s = control_pair.get(False) or control_pair.get(True)
    control = twins.branch(twin_metrics(out, control_s)) if control_s else None
    rows = []
    for name, pair in by_setting.items():
        bare, guarded = pair.get(False), pair.get(True)
        store: dict[str, Any] = {}
        findings: list[dict[str, Any]] = []
        if guarded is not None:
            if (out / guarded.name / "store.json").exists():
                store = json.loads((out / guarded.name / "store.json").read_text())
            log = out / guarded.name / "runs" / guarded.run_id / "guardian.log"
            if log.exists():
                findings = twins.first_findings(parse_log(log.read_text(errors="replace")))
        times = {
            "unguarded": judged[bare.name]["measures"].get("step_time_s") if bare else None,
            "guarded": judged[guarded.name]["measures"].get("step_time_s") if guarded else None,
        }
        rows.append(
            twins.twin_row(
                name,
                (bare or guarded).overrides,  # type: ignore[union-attr]
                twins.branch(twin_metrics(out, bare)) if bare else None,
                twin_metrics(out, guarded) if guarded else None,
                store,
                control,
                times,
                findings,
            )
        )
    return rows


def judge(
    out: Path,
    scenarios: Mapping[str, Scenario],
    results: Mapping[str, Mapping[str, Any]],
    *,
    timed_out: bool,
    samples_path: Path | None = None,
) -> dict[str, Any]:
    """Every scenario's checks and measures; ``samples_path`` defaults to ``<out>/samples.jsonl``."""
    samples = _samples(samples_path or out / "samples.jsonl")
    judged: dict[str, Any] = {}
    for name, s in scenarios.items():
        result = results.get(name, {})
        if s.setting:
            judged[name] = judge_twin(out, s, result)
        elif s.recipe:
            judged[name] = judge_recipe(out, s, result, samples)
        elif s.guarded:
            judged[name] = judge_guarded(out, s, result, samples)
        else:
            judged[name] = judge_unguarded(out, s, result)
    overhead = None
    if "healthy" in judged and "unguarded" in judged:
        on, off = judged["healthy"]["measures"].get("step_time_s"), judged["unguarded"]["measures"].get("step_time_s")
        if on and off:
            overhead = {"guarded_s": on, "unguarded_s": off, "overhead_percent": round(100 * (on - off) / off, 1)}
    passed = not timed_out and all(c["passed"] for v in judged.values() for c in v["checks"])
    report = {"passed": passed, "timed_out": timed_out, "scenarios": judged, "step_time_overhead": overhead}
    if any(s.setting for s in scenarios.values()):
        report["twins"] = twin_report(out, scenarios, judged)
    return report


def render(judged: Mapping[str, Any]) -> str:
    lines = [
        f"harness: {'PASSED' if judged['passed'] else 'FAILED'}" + (" (deadline hit)" if judged["timed_out"] else "")
    ]
    for name, v in judged["scenarios"].items():
        lines.append(f"  {name}:")
        for c in v["checks"]:
            lines.append(f"    [{'ok' if c['passed'] else 'FAIL'}] {c['name']}: {c['detail']}")
        lines.append(f"    measures: {json.dumps(v['measures'], default=str)}")
    if judged.get("step_time_overhead"):
        lines.append(f"  step time, guardian on vs off: {judged['step_time_overhead']}")
    if judged.get("twins"):
        lines.append(twins.render(judged["twins"]))
    return "\n".join(lines)
