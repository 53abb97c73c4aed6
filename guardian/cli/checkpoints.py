"""``guardian checkpoints RUN`` and ``guardian checkpoints restore RUN --incident ID``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from guardian.cli.common import AddCommand, log, open_store, print_json, resolved_config, store_int
from guardian.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from guardian.logs import event
from guardian.store import PinView


def register(add: AddCommand) -> None:
    p = add(
        "checkpoints",
        "A run's checkpoints with their health verdicts and pins (what each adds on disk); 'restore' undoes a "
        "quarantine.",
    )
    p.add_argument("target", help="RUN id, or 'restore'")
    p.add_argument("run", nargs="?", help="RUN id (with restore)")
    p.add_argument("--incident", type=store_int, help="the incident whose quarantine to undo (with restore)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checkpoints)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from guardian.actions.dirlock import DirLockedError, holding
    from guardian.checkpoints.pinning import held_bytes
    from guardian.checkpoints.quarantine import list_quarantine
    from guardian.checkpoints.restore import restore_quarantine
    from guardian.checkpoints.scan import CheckpointError
    from guardian.checkpoints.view import read_checkpoints

    restoring = args.target == "restore"
    run_id = args.run if restoring else args.target
    if run_id is None or (restoring and args.incident is None):
        log.error(
            event("usage", {"message": "guardian checkpoints RUN | guardian checkpoints restore RUN --incident ID"})
        )
        return EXIT_USAGE
    config = resolved_config(args, reads_history=True)
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
        pins = store.pins(run_id)
        holds = {p.id: held_bytes(Path(p.pinned_path)) for p in pins if p.live}
        try:
            quarantined = {str(p): incident for incident, paths in list_quarantine(ckpt_dir).items() for p in paths}
        except CheckpointError as exc:  # a symlink or a file where the quarantine goes: said, the rest is listed
            log.warning(event("quarantine_not_listed", {"run": run_id, "message": str(exc)}))
            quarantined = {}
        if args.json:
            print_json(
                {
                    "checkpoints": [c.to_json() for c in listed],
                    "pins": [{**p.to_json(), "holds_bytes": holds.get(p.id)} for p in pins],
                    "quarantine": quarantined,
                }
            )
            return EXIT_OK
        console = Console(soft_wrap=True)  # one line per checkpoint and pin, whatever the width: greppable
        pinned = {p.step for p in pins if p.live}
        on_disk = read_checkpoints(ckpt_dir)
        for c in sorted(listed, key=lambda c: c.step):
            where = on_disk.where(c.step) + (" (pinned)" if c.step in pinned else "")
            style = {"healthy": "green", "unhealthy": "red"}.get(c.verdict, "dim")
            note = escape(c.note or "")
            console.print(f"step {c.step:>6}  [{style}]{c.verdict:9}[/] {where:17} {escape(c.path)}  {note}")
        for pin in pins:
            console.print(escape(_pin_line(pin, holds.get(pin.id))))
        for path, incident in quarantined.items():
            console.print(f"quarantined by incident #{incident}: {escape(path)}")
        return EXIT_OK


def _pin_line(pin: PinView, holds: int | None) -> str:
    """One pin: how it was made, what it added, what it holds now (what releasing it would free)."""
    head = f"pin  step {pin.step:>6}  {pin.mode.value:4}  added {_size(pin.bytes_added):>9}"
    if pin.released_at is None:
        now = f"holds {_size(holds or 0):>9}"
        return f"{head}  {now}  since {pin.pinned_at:%Y-%m-%d %H:%M:%S}  {pin.pinned_path}"
    return f"{head}  released {pin.released_at:%Y-%m-%d %H:%M:%S}: {pin.note or ''}"


def _size(n: int) -> str:
    """Bytes as people read them (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
