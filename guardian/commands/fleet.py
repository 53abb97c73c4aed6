"""``guardian fleet FILE``: one guardian process guards every run of a fleet file, each in its own thread.

Each run is guarded as ``guardian run`` guards one (``commands.run.guard_request``) and writes to the fleet's store.
One run's trouble (a long stop, a failing source, a refused config, a bug) holds or ends its own thread only.
One exporter: every run's series under ``run_id``; an ended run stays with ``guardian_up 0``. Ctrl-C or SIGTERM stop
the guardians, never a trainer: ``guardian fleet FILE`` or ``guardian run --attach RUN_ID`` picks them up.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from guardian.actions.patch import prepare_attempt
from guardian.commands.run import RunEnd, RunRequest, guard_request, users_dump_dir
from guardian.config import ConfigError, GuardianConfig
from guardian.exits import EXIT_ERROR, EXIT_USAGE
from guardian.faults import fault_fields
from guardian.fleet.outcome import already_over, fleet_exit, meaning
from guardian.fleet.spec import FleetRun
from guardian.logs import event, get_logger
from guardian.sinks.export import FleetSource, serving
from guardian.store import Store, StoreError, mask_url
from guardian.store.engine import is_locked, reason
from guardian.verl_keys import PatchError

log = get_logger("fleet")
JOIN_POLL_S = 0.5  # the main thread wakes this often while runs are guarded (signals are handled there)


def run_fleet(fleet_config: GuardianConfig, runs: Sequence[FleetRun], *, stop: threading.Event | None = None) -> int:
    """Guard ``runs`` until each ends or the guardian is told to stop; prints one summary line per run."""
    stop = stop or threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    over: dict[str, RunEnd] = {}
    try:
        codes = guard_fleet(fleet_config, runs, stop, over=over)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    width = max(len(run.run_id) for run in runs)
    for run in runs:
        code = codes[run.run_id]
        ended = over.get(run.run_id)
        said = already_over(ended.status, code) if ended is not None else meaning(code)
        sys.stdout.write(f"{run.run_id:<{width}}  exit {code:<3}  {said}\n")
    return fleet_exit(codes, interrupted=stop.is_set())


def guard_fleet(
    fleet_config: GuardianConfig,
    runs: Sequence[FleetRun],
    stop: threading.Event,
    *,
    over: dict[str, RunEnd] | None = None,
) -> dict[str, int]:
    """Guard each run in its own thread, serving their snapshots on the fleet's exporter; each run's exit code.
    A run the store records as over is not launched again: it answers its recorded code, and ``over`` gets how it
    ended."""
    over = {} if over is None else over
    refuse_shared_dump_dirs(runs)
    source = FleetSource()
    codes: dict[str, int] = {}
    served = (
        serving(source, fleet_config.exporter, stop, {"runs": len(runs)})
        if fleet_config.exporter.enabled
        else nullcontext()
    )
    # the schema brought to head once, before the runs open the store together: a first open migrates inside one
    # write transaction, which the other runs' opens would wait for no longer than the busy timeout
    Store.open(fleet_config.database_url(), busy_timeout_s=fleet_config.store.busy_timeout_s).close()
    with served:
        log.info(event("fleet", {"runs": len(runs), "db": mask_url(fleet_config.database_url())}))
        threads = [
            threading.Thread(
                target=_guard_one, args=(run, stop, source, codes, over), name=f"guard-{run.run_id}", daemon=True
            )
            for run in runs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_POLL_S)
    return codes


def refuse_shared_dump_dirs(runs: Sequence[FleetRun]) -> None:
    """Refuse, before any run starts, a fleet whose runs' commands name one rollout dump folder: a rollback of one
    would move the other's step dumps into its quarantine (``guardian.actions.launcher.holding_dumps`` keeps runs of
    different guardians apart the same way). A command the guardian cannot read is left to its run's own refusal."""
    owners: dict[Path, list[str]] = {}
    for run in runs:
        try:
            files = prepare_attempt(run.command, metrics_path=Path("metrics.jsonl"), rollout_dir=Path("r"), cwd=run.cwd)
        except (PatchError, ValueError):
            continue
        folder = users_dump_dir(files, files.checkpoint_dir)
        if folder is not None:
            owners.setdefault(folder, []).append(run.run_id)
    shared = [
        f"{' and '.join(f'run {run_id}' for run_id in ids)} share the rollout dump folder {folder}"
        for folder, ids in owners.items()
        if len(ids) > 1
    ]
    if shared:
        raise ConfigError(
            f"fleet refused: {'; '.join(shared)} (trainer.rollout_data_dir): a rollback of one run would move the "
            "others' step dumps into its quarantine. Give each run its own trainer.rollout_data_dir"
        )


def _guard_one(
    run: FleetRun, stop: threading.Event, source: FleetSource, codes: dict[str, int], over: dict[str, RunEnd]
) -> None:
    """One run's thread: guard it, record its exit code. Nothing it raises reaches another run."""
    request = RunRequest(command=run.command, cwd=run.cwd, run_id=run.run_id, ray_address=run.ray_address)
    code = EXIT_ERROR
    try:
        code = guard_request(
            run.config,
            request,
            stop,
            join_fleet=lambda out: source.join(run.run_id, out.snapshots),
            over=lambda ended: over.__setitem__(run.run_id, ended),
        )
    except (ConfigError, PatchError) as exc:  # this run's settings or command are wrong: the others go on
        code = EXIT_USAGE
        log.error(event("fleet_run_refused", {"run": run.run_id, "message": str(exc)}))
    except StoreError as exc:
        log.error(event("store_error", {"run": run.run_id, "message": str(exc)}))
    except Exception as exc:  # a bug in this run's set-up or loop: the other runs go on
        if is_locked(exc):  # a lock outlasting the busy timeout where nothing waits for it: one line, no traceback
            fix = "another writer held the store locked; start the fleet again"
            log.error(event("store_error", {"run": run.run_id, "message": reason(exc), "fix": fix}))
        else:
            fields = {"run": run.run_id, **fault_fields(exc), "message": str(exc), "others": "still guarded"}
            log.error(event("fleet_run_failed", fields), exc_info=True)
    finally:
        codes[run.run_id] = code
        source.stopped(run.run_id)
        ended = over.get(run.run_id)
        said = already_over(ended.status, code) if ended is not None else meaning(code)
        log.warning(event("fleet_run_ended", {"run": run.run_id, "exit": code, "meaning": said}))
