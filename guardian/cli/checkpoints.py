"""``guardian checkpoints RUN`` and ``guardian checkpoints restore RUN --incident ID``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from guardian.cli.common import AddCommand, log, open_store, print_json, resolved_config, store_int
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from guardian.logs import event


def register(add: AddCommand) -> None:
    p = add("checkpoints", "A run's checkpoints with their health verdicts; 'restore' undoes a quarantine.")
    p.add_argument("target", help="RUN id, or 'restore'")
    p.add_argument("run", nargs="?", help="RUN id (with restore)")
    p.add_argument("--incident", type=store_int, help="the incident whose quarantine to undo (with restore)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checkpoints)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from guardian.actions.checkpoints import CheckpointError, list_quarantine, restore_quarantine
    from guardian.actions.dirlock import DirLockedError, holding

    config = resolved_config(args)
    restoring = args.target == "restore"
    run_id = args.run if restoring else args.target
    if run_id is None or (restoring and args.incident is None):
        log.error(
            event("usage", {"message": "guardian checkpoints RUN | guardian checkpoints restore RUN --incident ID"})
        )
        return EXIT_USAGE
    with open_store(config) as store:
        run = store.get_run(run_id)
        if run is None or not run.checkpoints_dir:
            log.error(event("error", {"message": f"run {run_id!r} has no checkpoint dir in {store.url}"}))
            return EXIT_ERROR
        ckpt_dir = Path(run.checkpoints_dir)
        if restoring:
            try:  # never under a guardian that may be rolling back this dir right now
                with holding(ckpt_dir, f"restore of {run_id}"):
                    result = restore_quarantine(ckpt_dir, args.incident)
            except (CheckpointError, DirLockedError) as exc:
                log.error(event("restore_refused", {"message": str(exc)}))
                return EXIT_ERROR
            log.info(
                event(
                    "restored",
                    {
                        "run": run_id,
                        "incident": args.incident,
                        "steps": ",".join(str(m.step) for m in result.restored),
                        "tracker": result.tracker_after,
                    },
                )
            )
            return EXIT_OK
        listed = store.checkpoints(run_id)
        quarantined = {str(p): incident for incident, paths in list_quarantine(ckpt_dir).items() for p in paths}
        if args.json:
            print_json({"checkpoints": [c.to_json() for c in listed], "quarantine": quarantined})
            return EXIT_OK
        console = Console()
        for c in sorted(listed, key=lambda c: c.step):
            where = "present" if Path(c.path).is_dir() else "moved"
            style = {"healthy": "green", "unhealthy": "red"}.get(c.verdict, "dim")
            note = escape(c.note or "")
            console.print(f"step {c.step:>6}  [{style}]{c.verdict:9}[/] {where:8} {escape(c.path)}  {note}")
        for path, incident in quarantined.items():
            console.print(f"quarantined by incident #{incident}: {escape(path)}")
        return EXIT_OK
