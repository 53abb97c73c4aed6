"""``guardian replay``: the checks over a finished metrics log, as if live."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from guardian.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNHEALTHY,
    SEVERITY_STYLE,
    AddCommand,
    log,
    print_json,
    resolved_config,
)
from guardian.logs import event
from guardian.replay import ReplayResult, replay_file


def register(add: AddCommand) -> None:
    p = add("replay", "Run the checks over a finished metrics log as if live; exit 3 if unhealthy.")
    p.add_argument("trace", help="verl file-logger JSONL ({'step':N,'data':{...}} per line)")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir with {step}.jsonl dumps (for EGR)")
    p.add_argument("--rules", choices=("default", "seed"), help="rule set (default: from config)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    config = resolved_config(args)
    path = Path(args.trace)
    if not path.is_file():
        log.error(event("error", {"message": f"trace file {path} does not exist"}))
        return EXIT_ERROR
    rollouts = Path(args.rollouts) if args.rollouts else None
    result = replay_file(path, config.checks, rules=args.rules, rollouts=rollouts)
    for bad in result.bad_lines[:20]:
        log.warning(event("bad_line", {"detail": str(bad)}))
    if args.json:
        print_json(result.to_json())
    else:
        print_timeline(result, Console())
    return EXIT_OK if result.healthy else EXIT_UNHEALTHY


def print_timeline(result: ReplayResult, console: Console) -> None:
    console.print(f"[bold]{result.run}[/]: {result.steps} steps, signals: {', '.join(result.signals) or 'none'}")
    if result.bad_lines:
        console.print(f"[yellow]{len(result.bad_lines)} unreadable line(s) skipped[/]")
    for t in result.transitions:
        f = t.finding
        style = SEVERITY_STYLE[f.severity.label]
        onset = f" (onset ~{f.onset_step})" if f.onset_step is not None and f.onset_step != f.step else ""
        console.print(
            f"  step {f.step:>6}  [{style}]{f.severity.label:8}[/] {f.check:18} {t.change.value:9} {f.message}{onset}"
        )
    first = result.first_critical
    verdict = f"[bold red]UNHEALTHY[/] from step {first.step} ({first.check})" if first else "[green]HEALTHY[/]"
    console.print(f"verdict: {verdict}")
