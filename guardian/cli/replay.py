"""``guardian replay``: the checks over a finished metrics log (or a captured stdout log), as if live."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from guardian.cli.common import SEVERITY_STYLE, AddCommand, dir_problem, file_problem, log, print_json, resolved_config
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_TOO_LITTLE, EXIT_UNHEALTHY, EXIT_USAGE
from guardian.incidents.replay import ReplayResult, replay_trace
from guardian.logs import event
from guardian.sources.sniff import TraceKind, TraceShape

SHOWN_PROBLEMS = 20  # bad lines and rollout problems logged one by one; the rest are counted
JSONL_HINT = "verl's file-logger JSONL: the file VERL_FILE_LOGGER_PATH names, with 'file' in trainer.logger"


def register(add: AddCommand) -> None:
    p = add(
        "replay",
        "Run the checks over a finished metrics log as if live; exit 3 if unhealthy, 4 if too little to judge, "
        "2 if no step could be read.",
    )
    p.add_argument("trace", nargs="?", help="verl file-logger JSONL ({'step':N,'data':{...}} per line)")
    p.add_argument("--console", metavar="FILE", help="a captured stdout log, read as verl console 'step:N - k:v' lines")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir with {step}.jsonl dumps (for EGR)")
    p.add_argument("--rules", choices=("default", "seed"), help="rule set (default: from config)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    if (args.trace is None) == (args.console is None):
        log.error(event("usage", {"message": "give a metrics JSONL (guardian replay TRACE) or --console FILE"}))
        return EXIT_USAGE
    config = resolved_config(args, store=False)
    path = Path(args.trace or args.console)
    problem = file_problem(path, "console log" if args.console else "trace file")
    if problem is None and args.rollouts is not None:
        problem = dir_problem(Path(args.rollouts), "--rollouts")
    if problem is not None:
        log.error(event("error", {"message": problem}))
        return EXIT_ERROR
    rollouts = Path(args.rollouts) if args.rollouts else None
    result = replay_trace(
        path, config.checks, console=bool(args.console), rules=args.rules, rollouts=rollouts, sources=config.sources
    )
    _log_problems(path, result)
    if not result.steps:
        found = result.shape.describe() if result.shape else "nothing"
        text = result.shape is not None and result.shape.kind not in (TraceKind.EMPTY, TraceKind.BINARY)
        first_bad = str(result.bad_lines[0]) if result.bad_lines and text else None
        fix = _no_steps_fix(result.shape, console=result.console)
        log.error(event("no_steps", {"file": path, "found": found, "first_bad_line": first_bad, "fix": fix}))
        return EXIT_USAGE
    if result.console and not args.console:
        log.info(event("console_detected", {"file": path, "steps": result.steps}))
    if args.json:
        print_json(result.to_json())
    else:
        print_timeline(result, Console())
    if not result.healthy:
        return EXIT_UNHEALTHY
    return EXIT_TOO_LITTLE if result.too_little else EXIT_OK


def _no_steps_fix(shape: TraceShape | None, *, console: bool) -> str:
    """What to do about a file that gave no step, by what it looked like."""
    if console and shape is not None and shape.kind is TraceKind.METRICS_JSONL:
        return "this is a file-logger JSONL: replay it without --console"
    if shape is not None and shape.kind is TraceKind.METRICS_JSONL:
        return "no line is a readable metrics record (see first_bad_line); " + JSONL_HINT
    return f"replay reads {JSONL_HINT}; for a captured stdout log use --console FILE"


def _log_problems(path: Path, result: ReplayResult) -> None:
    for bad in result.bad_lines[:SHOWN_PROBLEMS]:
        log.warning(event("bad_line", {"detail": str(bad)}))
    for problem in result.rollout_problems[:SHOWN_PROBLEMS]:
        log.warning(event("rollout_problem", {"detail": problem}))
    if result.bad_lines:
        log.warning(event("bad_lines", {"file": path, "count": len(result.bad_lines), "steps": result.steps}))


def print_timeline(result: ReplayResult, console: Console) -> None:
    read_as = " (read as console lines)" if result.console else ""
    console.print(
        f"[bold]{escape(result.run)}[/]{read_as}: {result.steps} steps, signals: {', '.join(result.signals) or 'none'}"
    )
    if result.bad_lines:
        console.print(f"[yellow]{len(result.bad_lines)} unreadable line(s) skipped[/]")
    if result.rollout_problems:
        console.print(f"[yellow]{len(result.rollout_problems)} unreadable rollout dump line(s) skipped[/]")
    for t in result.transitions:
        f = t.finding
        style = SEVERITY_STYLE[f.severity.label]
        onset = f" (onset ~{f.onset_step})" if f.onset_step is not None and f.onset_step != f.step else ""
        console.print(
            f"  step {f.step!s:>6}  [{style}]{f.severity.label:8}[/] {f.check:18} {t.change.value:9} "
            f"{escape(f.message)}{onset}"
        )
    first = result.first_critical
    if first is not None:
        verdict = f"[bold red]UNHEALTHY[/] from step {first.step} ({first.check})"
    elif result.too_little:
        verdict = f"[yellow]NOT ENOUGH DATA[/] ({escape(result.too_little)}): no verdict of health"
    else:
        verdict = "[green]HEALTHY[/]"
    console.print(f"verdict: {verdict}")
