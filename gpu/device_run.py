"""Run scenarios side by side under ``guardian run`` (enforce mode), watch them from outside, judge, keep the evidence.

    python -m gpu.device_run --trainer verl --tiny /tmp/tiny --scenarios collapse,collapse-kill \\
        --work /tmp/harness --out "$OUT/harness"

For each scenario: ``<work>/<name>/`` holds its guardian.yaml, the guardian's home (``.guardian``: store, logs, every
attempt's metrics, console output, rollout dumps) and the checkpoints (``ckpt``). ``collapse-kill`` SIGKILLs its
guardian once the patched trainer is launched and starts the same ``guardian run`` again, which must re-attach. The
sampler (``gpu.observe``) records processes, GPU memory, the guardian's CPU and RSS, step arrival times and checkpoint
manifests. At the end (or at ``--deadline-s``, which stops everything still running) the driver asks each guardian's
store for its incidents and checkpoints, copies the evidence (not the checkpoint weights) into ``<out>/<name>/``, and
writes ``<out>/verdict.json``: the assertions of ``gpu.verdict`` and the measurements. Exit 0 only if every assertion
holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu import verdict
from gpu.observe import Sampler, attempt_processes, checkpoint_manifest
from gpu.scenarios import (
    KILL_AFTER_EVENT,
    KILL_DELAY_S,
    NO_MULTICAST,
    Scenario,
    TrainerSetup,
    guardian_yaml,
    recipe_command,
    recipe_env,
    scenarios,
    twin_scenarios,
)
from gpu.scenarios import trainer_command as build_trainer_command

STOP_GRACE_S = 30.0


@dataclass
class Launch:
    scenario: Scenario
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    returncodes: list[int] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.folder / ".guardian"

    @property
    def guardian_log(self) -> Path:
        return self.home / "runs" / self.scenario.run_id / "guardian.log"


def guardian_argv(python: str, scenario: Scenario, trainer: list[str]) -> list[str]:
    return [
        python,
        "-m",
        "guardian",
        "run",
        "--config",
        "guardian.yaml",
        "--no-live",
        "--mode",
        "enforce",
        "--run-id",
        scenario.run_id,
        "--",
        *trainer,
    ]


def start(launch: Launch, setup: TrainerSetup, env: dict[str, str]) -> None:
    s, folder = launch.scenario, launch.folder
    if s.recipe:
        argv = recipe_command(setup, s, folder)
        run_env = {**env, **recipe_env(setup, folder), "GUARDIAN_HOME": str(launch.home)}
        (folder / "argv.json").write_text(json.dumps(argv, indent=1))
        with (folder / "guardian.out").open("ab") as out:
            launch.process = subprocess.Popen(argv, cwd=folder, env=run_env, stdout=out, stderr=subprocess.STDOUT)
        return
    trainer = build_trainer_command(setup, s, folder)
    if s.guarded:
        argv = guardian_argv(setup.python, s, trainer)
        run_env = {**env, "GUARDIAN_HOME": str(launch.home)}
    else:
        metrics = folder / "unguarded" / "metrics.jsonl"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        argv = [*trainer, f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics}"]
        run_env = {**env, "VERL_FILE_LOGGER_PATH": str(metrics)}
    (folder / "argv.json").write_text(json.dumps(argv, indent=1))
    with (folder / ("guardian.out" if s.guarded else "trainer.out")).open("ab") as out:  # the child keeps its copy
        launch.process = subprocess.Popen(argv, cwd=folder, env=run_env, stdout=out, stderr=subprocess.STDOUT)


def guardian_pid(launch: Launch) -> int | None:
    """The live guardian's pid: the launched process itself, or for the recipe the ``guardian run`` that run.sh
    started (found by its run id on the command line)."""
    s, process = launch.scenario, launch.process
    if not s.guarded or process is None or process.poll() is not None:
        return None
    if not s.recipe:
        return process.pid
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"guardian" in argv and b"run" in argv and s.run_id.encode() in argv:
            return int(proc.name)
    return None


def kill_and_reattach(launch: Launch, setup: TrainerSetup, env: dict[str, str], stop: threading.Event) -> None:
    """SIGKILL the guardian once the patched trainer is launched, then start the same command again."""
    while not stop.is_set():
        try:
            if KILL_AFTER_EVENT in launch.guardian_log.read_text(errors="replace"):
                break
        except OSError:
            pass
        if launch.process is not None and launch.process.poll() is not None:
            return  # the guardian ended before the relaunch: the verdict will say so
        time.sleep(0.5)
    else:
        return
    time.sleep(KILL_DELAY_S)
    assert launch.process is not None
    launch.process.send_signal(signal.SIGKILL)
    launch.returncodes.append(launch.process.wait())
    start(launch, setup, env)


def profile(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """Sample the guardian ``pid`` with py-spy (when on PATH) into ``out`` (folded stacks, one line per stack and
    its count) until it exits; None, said on stderr, when py-spy is not there."""
    spy = shutil.which("py-spy")
    if spy is None:
        print("gpu.device_run: --profile: py-spy is not on PATH; no profile taken", file=sys.stderr)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "--pid", str(pid), "--rate", "100", "--nonblocking", "--format", "raw", "-o", str(out)]
    with out.with_suffix(".log").open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def stop_everything(launches: Sequence[Launch]) -> None:
    """The deadline passed: stop guardians the way a user would (SIGINT), then whatever is left of the trainers."""
    for launch in launches:
        if launch.process is not None and launch.process.poll() is None:
            launch.process.send_signal(signal.SIGINT)
    deadline = time.time() + STOP_GRACE_S
    for launch in launches:
        if launch.process is not None:
            try:
                launch.process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                launch.process.kill()
    for path, procs in attempt_processes().items():
        if any(path.startswith(str(launch.folder)) for launch in launches):
            for pid in procs["pids"]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def store_reports(launch: Launch, python: str, env: dict[str, str]) -> dict[str, Any]:
    """Ask the guardian's own store what it recorded (the same commands a user types)."""

    def cli(*args: str) -> Any:
        out = subprocess.run(
            [python, "-m", "guardian", *args],
            cwd=launch.folder,
            env={**env, "GUARDIAN_HOME": str(launch.home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            return {"error": f"guardian {' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}"}
        return json.loads(out.stdout)

    listed = cli("incidents", "list", "--run", launch.scenario.run_id, "--json", "--config", "guardian.yaml")
    incidents = listed if isinstance(listed, list) else []
    shown = [cli("incidents", "show", str(i["id"]), "--json", "--config", "guardian.yaml") for i in incidents]
    checkpoints = cli("checkpoints", launch.scenario.run_id, "--json", "--config", "guardian.yaml")
    return {"incidents": listed, "shown": shown, "checkpoints": checkpoints}


def keep_evidence(launch: Launch, out: Path) -> None:
    """Everything but the checkpoint weights: logs, metrics, console, rollout dumps, commands, the store."""
    dest = out / launch.scenario.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("argv.json", "guardian.yaml", "guardian.out", "trainer.out"):
        if (launch.folder / name).exists():
            shutil.copy2(launch.folder / name, dest / name)
    # the recipe's own logs (retrieval server) and its index manifest beside the guardian's evidence
    recipe_out = launch.folder / "out"
    for source in (launch.home / "runs", launch.folder / "unguarded", recipe_out / "logs", recipe_out / "rollouts"):
        if source.exists():
            shutil.copytree(source, dest / source.name, dirs_exist_ok=True)
    if (launch.folder / "index" / "manifest.json").exists():
        shutil.copy2(launch.folder / "index" / "manifest.json", dest / "index-manifest.json")
    quarantined = {
        str(folder.relative_to(launch.folder / "ckpt")): checkpoint_manifest(folder)
        for folder in sorted((launch.folder / "ckpt").glob(".guardian-quarantine/*/global_step_*"))
    }
    (dest / "quarantine.json").write_text(json.dumps(quarantined, indent=1))
    db = launch.home / "guardian.db"
    if db.exists():
        shutil.copy2(db, dest / "guardian.db")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpu.device_run", description=__doc__.split("\n")[0])
    p.add_argument("--trainer", choices=("verl", "cpu"), required=True)
    p.add_argument("--tiny", type=Path, help="gpu.tiny output folder (verl)")
    p.add_argument(
        "--scenarios",
        required=True,
        help="comma-separated: collapse, collapse-kill, healthy, unguarded, search, search-8gpu; "
        "'twins' (or empty) for the twins of --settings alone",
    )
    p.add_argument("--settings", default="", help="comma-separated gpu.scenarios.SETTINGS to run as twins")
    twin = p.add_mutually_exclusive_group()
    for mode in ("both", "guarded", "unguarded"):
        twin.add_argument(f"--{mode}", dest="twin_mode", action="store_const", const=mode, help=f"twins: {mode}")
    p.set_defaults(twin_mode="both")
    p.add_argument("--steps", type=int, default=40, help="training steps of every twin")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--collapse-steps", type=int, default=28)
    p.add_argument("--healthy-steps", type=int, default=24)
    p.add_argument("--search-steps", type=int, default=6)
    p.add_argument("--search-tiny", type=Path, help="gpu.tiny --task search output folder (search)")
    p.add_argument("--search-corpus", type=Path, help="wiki-18 style corpus for the search scenario's index")
    p.add_argument("--search-shape", type=Path, help="gpu.tiny --task search --shape qwen2.5-7b output (search-8gpu)")
    p.add_argument("--shape-steps", type=int, default=24, help="training steps of search-8gpu")
    p.add_argument(
        "--gpus", type=int, help="GPUs of every scenario: trainer.n_gpus_per_node (default 1; 8 for search-8gpu)"
    )
    p.add_argument("--deadline-s", type=float, default=520.0, help="stop everything still running after this")
    p.add_argument("--extra", action="append", default=[], help="key=value added to every trainer command")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--profile", action="store_true", help="sample every guardian with py-spy into <out>/<scenario>/")
    args = p.parse_args(argv)

    known = scenarios(
        args.trainer,
        collapse_steps=args.collapse_steps,
        healthy_steps=args.healthy_steps,
        search_steps=args.search_steps,
        gpus=args.gpus,
        shape_steps=args.shape_steps,
    )
    names = [n for n in args.scenarios.split(",") if n and n != "twins"]
    chosen = [known[n] for n in names if n in known]
    unknown = [n for n in names if n not in known]
    try:
        twins = twin_scenarios(
            args.trainer,
            [n for n in args.settings.split(",") if n],
            steps=args.steps,
            mode=args.twin_mode,
            gpus=args.gpus,
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    chosen += twins.values()
    if unknown or not chosen:
        print(f"gpu.device_run: unknown scenarios {unknown}; choose from {sorted(known)} or twins", file=sys.stderr)
        return 2
    extra = dict(kv.split("=", 1) for kv in args.extra)
    setup = TrainerSetup(
        kind=args.trainer,
        python=sys.executable,
        tiny=args.tiny,
        extra=extra,
        search_tiny=args.search_tiny,
        search_corpus=args.search_corpus,
        search_shape=args.search_shape,
    )
    # NVLink multicast stays off in everything started from here, whatever the caller's environment
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **NO_MULTICAST}
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    launches = []
    for s in chosen:
        folder = (args.work / s.name).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "guardian.yaml").write_text(guardian_yaml(folder / ".guardian", args.trainer))
        launches.append(Launch(s, folder))

    stop = threading.Event()
    samples_path = args.out / "samples.jsonl"
    begun = time.time()
    with samples_path.open("w") as samples:
        sampler = Sampler(samples, {launch.scenario.name: launch.folder for launch in launches})
        threads = []
        for launch in launches:
            start(launch, setup, env)
            if launch.scenario.kill_guardian:
                t = threading.Thread(target=kill_and_reattach, args=(launch, setup, env, stop), daemon=True)
                t.start()
                threads.append(t)
        timed_out = False
        profilers: dict[int, subprocess.Popen[bytes] | None] = {}
        while True:
            for launch in launches:
                pid = guardian_pid(launch)
                if pid is not None:
                    sampler.guardians[launch.scenario.name] = pid
                    if args.profile and pid not in profilers:
                        profilers[pid] = profile(pid, args.out / launch.scenario.name / f"guardian-profile-{pid}.txt")
                else:
                    sampler.guardians.pop(launch.scenario.name, None)
            sampler.sample()
            killer_busy = any(t.is_alive() for t in threads)
            if all(x.process is not None and x.process.poll() is not None for x in launches) and not killer_busy:
                break
            if time.time() - begun > args.deadline_s:
                timed_out = True
                stop.set()
                stop_everything(launches)
                break
            time.sleep(args.sample_s)
        for launch in launches:
            if launch.process is not None:
                launch.returncodes.append(launch.process.wait())
        sampler.sample()
        for spy in profilers.values():  # each ends with its guardian
            if spy is not None:
                try:
                    spy.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    spy.send_signal(signal.SIGINT)

    results = {}
    for launch in launches:
        reports = store_reports(launch, sys.executable, env) if launch.scenario.guarded else {}
        (launch.folder / "store.json").write_text(json.dumps(reports, indent=1, default=str))
        keep_evidence(launch, args.out)
        shutil.copy2(launch.folder / "store.json", args.out / launch.scenario.name / "store.json")
        results[launch.scenario.name] = {"returncodes": launch.returncodes}
    judged = verdict.judge(args.out, {x.scenario.name: x.scenario for x in launches}, results, timed_out=timed_out)
    judged["gpus"] = {x.scenario.name: x.scenario.gpus for x in launches}
    (args.out / "verdict.json").write_text(json.dumps(judged, indent=1, default=str))
    print(verdict.render(judged))
    return 0 if judged["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
