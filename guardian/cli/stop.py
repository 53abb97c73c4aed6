"""``guardian stop RUN``: stop a run's trainer through the guardian's own stop path (``guardian.commands.stop``)."""

from __future__ import annotations

import argparse

from guardian.cli.common import AddCommand, resolved_config
from guardian.ids import checked_run_id


def register(add: AddCommand) -> None:
    p = add(
        "stop",
        "Stop a run's trainer as the guardian stops it (SIGINT, SIGTERM, SIGKILL to its process group) and record the "
        "run as over; its guardian run, if alive, stops guarding first, so the stop is never taken for a crash.",
    )
    p.add_argument("run_id", metavar="RUN", help="the run's id (guardian incidents list names it)")
    p.add_argument("--reason", default="stopped by hand", help="why (kept with the run)")
    p.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long its guardian may take to stop guarding (default 120)",
    )
    p.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    from guardian.commands.stop import GUARDIAN_EXIT_WAIT_S, stop_run

    wait_s = GUARDIAN_EXIT_WAIT_S if args.wait is None else args.wait
    config = resolved_config(args, reads_history=True)
    return stop_run(config, checked_run_id(args.run_id, option="RUN"), reason=args.reason, wait_s=wait_s)
