"""``guardian dashboards export|push``: the Grafana dashboards built by the guardian's code."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from guardian import __version__
from guardian.cli.common import AddCommand, log, resolved_config
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from guardian.extras import MissingExtra, need
from guardian.logs import event


def register(add: AddCommand) -> None:
    p = add("dashboards", "Grafana dashboards built by the guardian's code.")
    dsub = p.add_subparsers(dest="action", required=True)
    pe = dsub.add_parser("export", help="write DIR/<uid>.json for every dashboard")
    pe.add_argument("-o", "--output", metavar="DIR", help="output folder (default: dashboards)")
    pe.add_argument("--check", action="store_true", help="write nothing; exit 1 naming missing or stale files")
    pe.set_defaults(func=cmd_dashboards_export)
    pp = dsub.add_parser("push", help="upload every dashboard to Grafana (folder, overwrite: idempotent)")
    pp.add_argument("--url", help="Grafana base URL (default: grafana.url)")
    pp.add_argument(
        "--token-file", help="service-account token file (default: grafana.token_file, else $GRAFANA_TOKEN)"
    )
    pp.add_argument("--folder", help="folder title (default: grafana.folder)")
    pp.set_defaults(func=cmd_dashboards_push)
    for q in (pe, pp):
        q.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def cmd_dashboards_export(args: argparse.Namespace) -> int:
    from guardian.cli.report import not_regular_problem
    from guardian.dashboards import DEFAULT_DIR, check, export_all
    from guardian.dashboards.export import expected

    directory = Path(args.output) if args.output else DEFAULT_DIR
    if directory.exists() and not directory.is_dir():
        log.error(event("usage", {"message": f"-o {directory} is not a directory"}))
        return EXIT_USAGE
    problem = next(filter(None, (not_regular_problem(p, "dashboard file") for p in expected(directory))), None)
    if problem is not None:  # a FIFO there would block the read, a symlink or a device would be replaced
        log.error(event("error", {"message": problem}))
        return EXIT_ERROR
    if args.check:
        stale = check(directory)
        for path in stale:
            sys.stdout.write(f"{path}\n")
        if stale:
            log.error(event("dashboards_stale", {"files": len(stale), "fix": "run: guardian dashboards export"}))
            return EXIT_ERROR
        return EXIT_OK
    written = export_all(directory)
    log.info(event("dashboards_exported", {"dir": directory, "written": len(written)}))
    return EXIT_OK


def cmd_dashboards_push(args: argparse.Namespace) -> int:
    try:
        need("grafana", "guardian dashboards push")
    except MissingExtra as exc:
        log.error(event("dashboards_push_failed", {"message": str(exc)}))
        return EXIT_ERROR
    from guardian.dashboards import dashboards, grafana

    config = resolved_config(args, store=False).grafana
    url = args.url or config.url
    if not url:
        log.error(event("usage", {"message": "give --url or set grafana.url in guardian.yaml"}))
        return EXIT_USAGE
    token_file = Path(args.token_file) if args.token_file else config.token_file
    folder = args.folder or config.folder
    try:
        api = grafana.connect(url, grafana.load_token(token_file, os.environ), timeout_s=config.timeout_s)
        try:
            version = grafana.server_version(api)
            results = grafana.push_dashboards(
                api, dashboards(), folder_title=folder, message=f"verl-guardian {__version__}"
            )
        finally:
            grafana.close(api)
    except grafana.GrafanaError as exc:
        log.error(event("dashboards_push_failed", {"message": str(exc)}))
        return EXIT_ERROR
    for result in results:
        sys.stdout.write(f"{result.uid} v{result.version} {result.url}\n")
    log.info(event("dashboards_pushed", {"grafana": version, "folder": folder, "dashboards": len(results)}))
    return EXIT_OK
