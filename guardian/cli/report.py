"""``guardian report INCIDENT_ID -o report.html`` and ``guardian report --run RUN_ID -o run.html``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from guardian.atomic import write_atomically
from guardian.cli.common import AddCommand, dir_problem, log, open_store, resolved_config, store_int
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from guardian.logs import event

REPORT_MODE = 0o644  # a page to pass around, readable like any file a browser saves


def register(add: AddCommand) -> None:
    p = add(
        "report",
        "An incident's (or with --run a whole run's) report as one self-contained HTML file: signal plots with the "
        "abandoned branch, timeline, config change, attempts lineage, cost, highest-reward trajectories.",
    )
    p.add_argument("incident", nargs="?", type=store_int, help="the incident id (guardian incidents list)")
    p.add_argument("--run", metavar="RUN_ID", help="report on this whole run instead of one incident")
    p.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write (replaced atomically)")
    p.set_defaults(func=cmd_report)


def output_problem(path: Path) -> str | None:
    """Why the report cannot be written to ``path`` (None: it can be tried), found before the store is read."""
    if path.is_dir():
        return f"report file {path} is a directory"
    return dir_problem(path.parent, "folder of the report file")


def cmd_report(args: argparse.Namespace) -> int:
    from guardian.report.assemble import incident_report, run_report
    from guardian.report.page import render

    if (args.incident is None) == (args.run is None):
        log.error(event("usage", {"message": "give an INCIDENT_ID or --run RUN_ID, not both"}))
        return EXIT_USAGE
    output: Path = args.output
    problem = output_problem(output)
    if problem is not None:
        log.error(event("error", {"message": problem}))
        return EXIT_ERROR
    config = resolved_config(args)
    with open_store(config) as store:
        if args.run is not None:
            report, missing = run_report(store, args.run, config, time.time()), f"no run {args.run!r}"
        else:
            report, missing = (
                incident_report(store, args.incident, config, time.time()),
                f"no incident #{args.incident}",
            )
        if report is None:
            log.error(event("error", {"message": f"{missing} in {store.url}"}))
            return EXIT_ERROR
    page = render(report).encode()
    try:
        write_atomically(output, page, mode=REPORT_MODE)
    except OSError as exc:
        log.error(event("error", {"message": f"cannot write the report to {output}: {exc.strerror or exc}"}))
        return EXIT_ERROR
    log.info(event("report_written", {"file": str(output), "bytes": len(page)}))
    return EXIT_OK
