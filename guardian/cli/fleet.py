"""``guardian fleet FILE``: guard every run of a fleet file in one guardian process."""

from __future__ import annotations

import argparse
from pathlib import Path

from guardian.cli.common import AddCommand, resolved_config


def register(add: AddCommand) -> None:
    p = add(
        "fleet",
        "Guard several runs in one guardian process: one store, one /metrics (run_id labels), a thread per run.",
    )
    p.add_argument("file", type=Path, help="fleet file: runs with their run_id, command, cwd, config, ray_address")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.set_defaults(func=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    from guardian.commands.fleet import run_fleet
    from guardian.fleet.spec import load_fleet

    config = resolved_config(args)
    return run_fleet(config, load_fleet(args.file, config))
