"""``guardian doctor`` and ``guardian config``: what is installed, and what the guardian will use."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from guardian.cli.common import AddCommand, print_json, resolved_config
from guardian.config import example_yaml
from guardian.exits import EXIT_ERROR, EXIT_OK
from guardian.store import mask_url


def register(add: AddCommand) -> None:
    p = add("doctor", "What is installed, reachable or missing.")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = add("config", "Print the resolved configuration (or --example: the documented defaults).")
    p.add_argument("--example", action="store_true")
    p.set_defaults(func=cmd_config)


def cmd_doctor(args: argparse.Namespace) -> int:
    from guardian.commands.doctor import diagnose

    report = diagnose(args.config)
    if args.json:
        print_json([r.to_json() for r in report])
    else:
        console = Console()
        for r in report:
            mark = {"ok": "[green]ok[/]", "missing": "[yellow]missing[/]", "error": "[red]error[/]"}[r.status]
            console.print(f"{mark:>22}  {r.name:28} {r.detail}")
    return EXIT_ERROR if any(r.status == "error" for r in report) else EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    if args.example:
        sys.stdout.write(example_yaml())
        return EXIT_OK
    document = resolved_config(args).model_dump(mode="json")
    if document["db_url"]:
        document["db_url"] = mask_url(document["db_url"])
    print_json(document)
    return EXIT_OK
