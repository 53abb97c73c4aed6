"""``guardian report INCIDENT_ID -o report.html`` and ``guardian report --run RUN_ID -o run.html``."""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path

from guardian.atomic import write_atomically
from guardian.cli.common import AddCommand, dir_problem, log, open_store, resolved_config, store_int
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from guardian.logs import event
from guardian.regular_files import kind_of

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


def not_regular_problem(path: Path, what: str) -> str | None:
    """Why an output file the guardian replaces (a temporary file renamed over it) cannot be ``path``: an existing
    path must be a regular file. A device node (``/dev/null``; as root the rename would replace the node itself),
    a FIFO, a socket or a symlink (``/proc/self/fd/1``, or one pointing anywhere else) is refused, never replaced
    (issue 24, HR4); so is a folder. None: nothing there, or a regular file. The one refusal of every output path
    a user gives (``report -o``, the files of ``dashboards export -o``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{what} {path} cannot be checked: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"{what} {path} is a directory"
    if not stat.S_ISREG(st.st_mode):
        return f"{what} {path} is {kind_of(st.st_mode)}, not a regular file: give a new path or a regular file"
    return None


def output_problem(path: Path) -> str | None:
    """Why the report cannot be written to ``path`` (None: it can be tried), found before the store is read."""
    return not_regular_problem(path, "report file") or dir_problem(path.parent, "folder of the report file")


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
    config = resolved_config(args, reads_history=True)
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
    problem = output_problem(output)  # again: the path may have been replaced while the report was built
    if problem is not None:
        log.error(event("error", {"message": problem}))
        return EXIT_ERROR
    try:
        write_atomically(output, page, mode=REPORT_MODE)
    except OSError as exc:
        log.error(event("error", {"message": f"cannot write the report to {output}: {exc.strerror or exc}"}))
        return EXIT_ERROR
    log.info(event("report_written", {"file": str(output), "bytes": len(page)}))
    return EXIT_OK
