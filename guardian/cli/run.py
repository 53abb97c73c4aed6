"""``guardian run`` (launch and guard a training command) and ``guardian demo`` (the same on CPU)."""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

from guardian.cli.common import AddCommand, log, resolved_config
from guardian.exits import EXIT_USAGE
from guardian.ids import checked_run_id
from guardian.logs import event


def register(add: AddCommand) -> None:
    p = add("run", "Launch a training command and guard it (enforce: stop, roll back, patch, resume).")
    p.add_argument("--mode", choices=("observe", "advise", "enforce"), help="default: config mode (enforce)")
    p.add_argument("--run-id", help="run id (default: derived from the command and the working directory)")
    p.add_argument("--attach", metavar="RUN_ID", help="re-attach to a run this store knows (after a guardian restart)")
    p.add_argument(
        "--new",
        action="store_true",
        help="start a new run even if the store records this one as over (finished, or gave up: 93); it gets the "
        "run id with a timestamp added. Without it such a run is not launched again: it answers its recorded exit",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command the first attempt would run (the arguments the guardian appends, the variables it "
        "exports), and exit",
    )
    p.add_argument("--no-live", action="store_true", help="no live terminal view (logs only)")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="submit the trainer as Ray Jobs to this cluster's dashboard (http://HEAD:8265) instead of a local process",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- python -m verl.trainer.main_ppo key=value ..., or -- bash train.sh key=value ... (a script whose "
        'python command ends in "$@"; the guardian appends its arguments after yours)',
    )
    p.set_defaults(func=cmd_run)

    p = add("demo", "The closed loop on CPU: a tiny verl-compatible GRPO run, guarded in enforce mode.")
    p.add_argument(
        "--scenario",
        default="entropy_collapse",
        choices=("entropy_collapse", "nan", "hang", "crash", "healthy"),
        help="what goes wrong (default entropy_collapse)",
    )
    p.add_argument("--json", action="store_true", help="print the incident timeline as JSON")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.set_defaults(func=cmd_demo)


def default_run_id(command: Sequence[str], cwd: Path) -> str:
    digest = hashlib.sha1("\0".join([str(cwd), *command]).encode()).hexdigest()[:10]
    return f"run-{digest}"


def cmd_run(args: argparse.Namespace) -> int:
    from guardian.commands.run import RunRequest, run_guarded

    config = resolved_config(args)
    if args.mode:
        config = config.model_copy(update={"mode": args.mode})
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.new and args.attach:
        log.error(event("usage", {"message": "--new starts a new run and --attach follows a known one: give one"}))
        return EXIT_USAGE
    if not command and not args.attach:
        log.error(event("usage", {"message": "give the training command after --, or --attach RUN_ID"}))
        return EXIT_USAGE
    request = RunRequest(
        command=tuple(command),
        cwd=Path.cwd(),
        run_id=_run_id(args, command),
        attach=bool(args.attach),
        dry_run=args.dry_run,
        live=sys.stdout.isatty() and not args.no_live,
        ray_address=args.ray_address,
        new=args.new,
    )
    return run_guarded(config, request)


def _run_id(args: argparse.Namespace, command: Sequence[str]) -> str:
    if args.attach:
        return checked_run_id(args.attach, option="--attach")
    if args.run_id:
        return checked_run_id(args.run_id)
    return default_run_id(command, Path.cwd())


def cmd_demo(args: argparse.Namespace) -> int:
    from guardian.commands.demo import run_demo

    return run_demo(resolved_config(args), scenario=args.scenario, json_output=args.json)
