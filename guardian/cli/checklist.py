"""``guardian checklist RUN_ID [--eval NAME=VALUE ...]``: is the run ready to launch at scale?

The items are ``guardian.review.checklist``'s; ``--eval`` results are stored with the run (the newest of a name
counts). Exit 0 when nothing fails, 3 when an item fails.
"""

from __future__ import annotations

import argparse
import math
import time

from rich.console import Console
from rich.markup import escape

from guardian.cli.common import AddCommand, log, open_store, print_json, resolved_config
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_UNHEALTHY
from guardian.logs import event
from guardian.review.checklist import Checklist, Item, Mark, judge
from guardian.review.facts import run_facts
from guardian.store.evaluations import EVAL_NAME_MAX

MARK_STYLE = {Mark.PASS: "green", Mark.WARN: "yellow", Mark.FAIL: "bold red"}
RUNS_NAMED = 5  # an unknown run id's error names this many known ones


def evaluation(text: str) -> tuple[str, float]:
    """argparse type: ``NAME=VALUE`` with a finite number (``hotpotqa_em=0.41``)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name or len(name) > EVAL_NAME_MAX or not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with a finite number (hotpotqa_em=0.41), got {text!r}")
    return name, number


def register(add: AddCommand) -> None:
    p = add("checklist", "Launch readiness of a run: health, incidents, checkpoints, samples to read, evaluations.")
    p.add_argument("run", help="the run id (guardian incidents list shows them)")
    p.add_argument(
        "--eval",
        dest="evals",
        action="append",
        type=evaluation,
        default=[],
        metavar="NAME=VALUE",
        help="record an evaluation result with the run (repeatable); checklist.eval_minimums judges it",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checklist)


def cmd_checklist(args: argparse.Namespace) -> int:
    config = resolved_config(args, reads_history=True)
    with open_store(config) as store:
        run = store.get_run(args.run)
        if run is None:
            known = ", ".join(r.id for r in store.list_runs()[:RUNS_NAMED]) or "none"
            log.error(event("error", {"message": f"no run {args.run!r} in {store.url} (newest runs: {known})"}))
            return EXIT_ERROR
        if args.evals:
            latest = store.latest_step(run.id)
            store.record_evaluations(
                run.id, dict(args.evals), step=latest[0] if latest is not None else None, now=time.time()
            )
        checklist = judge(run_facts(store, run, config), config.checks, config.checklist)
    if args.json:
        print_json(checklist.to_json())
    else:
        console = Console(soft_wrap=True)
        for line in checklist_lines(checklist):
            console.print(line)
    return EXIT_UNHEALTHY if checklist.failed else EXIT_OK


# ------------------------------------------------------------------------------------------ the text view (pure)


def _one_line(text: str) -> str:
    return escape(text.replace("\r", "").replace("\n", "⏎"))


def item_lines(item: Item) -> list[str]:
    style = MARK_STYLE[item.mark]
    lines = [f"  [{style}]{item.mark:4}[/] {escape(item.name):18} {escape(item.reason)}"]
    samples = item.details.get("samples")
    for s in samples if isinstance(samples, list) else []:
        lines.append(f"       step {s['step']} score {s['score']:.3g} ({escape(s['file'])}, sample {s['row']})")
        lines.append(f"         prompt:   {_one_line(s['prompt'])}")
        lines.append(f"         response: {_one_line(s['response'])}")
        if s.get("ground_truth") is not None:
            lines.append(f"         expected: {_one_line(s['ground_truth'])}")
    return lines


def checklist_lines(checklist: Checklist) -> list[str]:
    """``guardian checklist`` as lines of rich markup: the verdict, then one line per item (samples under theirs)."""
    at = f" at step {checklist.last_step}" if checklist.last_step is not None else ", no step stored"
    style = MARK_STYLE[checklist.verdict]
    lines = [f"[bold]launch checklist[/] for run {escape(checklist.run_id)}{at}: [{style}]{checklist.verdict}[/]"]
    for item in checklist.items:
        lines += item_lines(item)
    return lines
