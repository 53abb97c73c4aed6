"""``guardian demo`` on embedded defaults: a real collapsing verl run, streamed as if live.

The bundled trace (``data/aopd-2.jsonl``, a public verl 0.5 GRPO run whose responses collapse from
~900 tokens to ~9 around step 35) is written line by line, the way verl's file logger writes, into a
metrics file under the guardian home, while the guard loop tails it in observe mode: findings,
incidents and checkpoint verdicts go to the SQLite store, alerts to the log. The closed loop on a
live CPU trainer replaces this once ``guardian.demo`` (the tiny verl-compatible trainer) lands.
"""

from __future__ import annotations

import threading
import time
from importlib.resources import files
from pathlib import Path

import orjson
from rich.console import Console

from guardian.config import GuardianConfig
from guardian.daemon import Guardian
from guardian.logs import event, get_logger
from guardian.sources.jsonl import MetricsFile
from guardian.store import Store

log = get_logger("demo")
TRACE = "aopd-2.jsonl"
LINES_PER_SECOND = 60.0


def stream_lines(source: bytes, target: Path, stop: threading.Event, pace: float) -> None:
    """Write ``source`` to ``target`` line by line like verl's unbuffered file logger, each line in
    two writes so the reader also meets half-written lines."""
    with target.open("wb", buffering=0) as out:
        for line in source.splitlines(keepends=True):
            if stop.is_set():
                return
            half = len(line) // 2
            out.write(line[:half])
            out.write(line[half:])
            time.sleep(pace)


def run_demo(config: GuardianConfig, *, json_output: bool) -> int:
    trace = files("guardian.data").joinpath(TRACE).read_bytes()
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    attempt_dir = config.home.resolve() / "runs" / run_id / "attempt-1"
    attempt_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = attempt_dir / "metrics.jsonl"
    metrics_path.touch()
    console = Console(stderr=json_output)
    console.print(f"[bold]guardian demo[/]: streaming a real verl run ({TRACE}) into {metrics_path}")
    stop = threading.Event()
    writer = threading.Thread(
        target=stream_lines, args=(trace, metrics_path, stop, 1.0 / LINES_PER_SECOND), daemon=True
    )
    with Store.open(config.database_url()) as store:
        store.ensure_run(
            run_id,
            name="demo: bundled collapsing verl run",
            metrics_path=str(metrics_path),
            rollouts_dir="",
            checkpoints_dir=None,
            mode="observe",
            now=time.time(),
        )
        guardian = Guardian(
            config=config, store=store, run_id=run_id, metrics=MetricsFile(metrics_path), clock=time.time
        )
        writer.start()
        while writer.is_alive():
            guardian.tick()
            time.sleep(0.05)
        guardian.tick()
        incidents = store.list_incidents(run_id)
        details = [store.get_incident(i.id) for i in incidents]
        log.info(event("demo_done", {"run": run_id, "steps": len(guardian.history.steps), "db": store.url}))
        if json_output:
            import sys

            document = {
                "run": run_id,
                "steps": len(guardian.history.steps),
                "incidents": [d.to_json() for d in details if d is not None],
                "store": store.url,
            }
            sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
            return 0
        console.print(f"\n[bold]{len(guardian.history.steps)} steps guarded[/], {len(incidents)} incident(s):")
        for i in reversed(incidents):
            console.print(
                f"  #{i.id} [bold red]{i.check}[/] at step {i.opened_step} (estimated onset {i.onset_step}): "
                f"{i.message}"
            )
        console.print(f"\nhistory: {store.url}")
        console.print("next: [cyan]guardian incidents list[/], [cyan]guardian incidents show ID[/]")
    return 0
