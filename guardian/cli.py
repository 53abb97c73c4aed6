"""``guardian`` command line. Every command is ``main(argv) -> exit code``.

Exit codes: 0 ok / healthy, 1 error, 2 usage, 3 unhealthy run (replay, watch).
``--json`` prints one JSON document on stdout; logs go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import orjson
from rich.console import Console

from guardian import __version__
from guardian.actions.verl_keys import PatchError
from guardian.config import ConfigError, GuardianConfig, example_yaml, load_config
from guardian.findings import Severity
from guardian.logs import event, get_logger, init_logging
from guardian.notify.events import incident_key, intervention_key
from guardian.outcome import outcome_line
from guardian.replay import ReplayResult, replay_file
from guardian.store import InterventionEventView, InterventionView, Store, StoreError, mask_url
from guardian.store.deliveries import DeliveryView

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNHEALTHY = 0, 1, 2, 3
log = get_logger("cli")
SEVERITY_STYLE = {"warn": "yellow", "critical": "bold red", "ok": "green", "unknown": "dim"}


def _print_json(document: object) -> None:
    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")


def _config(args: argparse.Namespace) -> GuardianConfig:
    config = load_config(Path(args.config) if args.config else None)
    port = getattr(args, "export", None)
    if port is not None:  # --export PORT: the exporter on, on loopback
        config = config.model_copy(
            update={"exporter": config.exporter.model_copy(update={"enabled": True, "port": port})}
        )
    return config


# -- replay ---------------------------------------------------------------------------------------
def cmd_replay(args: argparse.Namespace) -> int:
    config = _config(args)
    path = Path(args.trace)
    if not path.is_file():
        log.error(event("error", {"message": f"trace file {path} does not exist"}))
        return EXIT_ERROR
    rollouts = Path(args.rollouts) if args.rollouts else None
    result = replay_file(path, config.checks, rules=args.rules, rollouts=rollouts)
    for bad in result.bad_lines[:20]:
        log.warning(event("bad_line", {"detail": str(bad)}))
    if args.json:
        _print_json(result.to_json())
    else:
        _print_timeline(result, Console())
    return EXIT_OK if result.healthy else EXIT_UNHEALTHY


def _print_timeline(result: ReplayResult, console: Console) -> None:
    console.print(f"[bold]{result.run}[/]: {result.steps} steps, signals: {', '.join(result.signals) or 'none'}")
    if result.bad_lines:
        console.print(f"[yellow]{len(result.bad_lines)} unreadable line(s) skipped[/]")
    for t in result.transitions:
        f = t.finding
        style = SEVERITY_STYLE[f.severity.label]
        onset = f" (onset ~{f.onset_step})" if f.onset_step is not None and f.onset_step != f.step else ""
        console.print(
            f"  step {f.step:>6}  [{style}]{f.severity.label:8}[/] {f.check:18} {t.change.value:9} {f.message}{onset}"
        )
    first = result.first_critical
    verdict = f"[bold red]UNHEALTHY[/] from step {first.step} ({first.check})" if first else "[green]HEALTHY[/]"
    console.print(f"verdict: {verdict}")


# -- watch ----------------------------------------------------------------------------------------
def derive_run_id(metrics: Path) -> str:
    digest = hashlib.sha1(str(metrics.resolve()).encode()).hexdigest()[:8]
    return f"{metrics.stem}-{digest}"


def cmd_watch(args: argparse.Namespace) -> int:
    from guardian.daemon import Guardian
    from guardian.notify.setup import notifying, sink_names
    from guardian.sinks.export import exporting
    from guardian.sources.console import ConsoleFile
    from guardian.sources.jsonl import MetricsFile
    from guardian.sources.rollouts import RolloutDir

    config = _config(args)
    path = Path(args.metrics or args.console)
    source = MetricsFile(path) if args.metrics else ConsoleFile(path)
    run_id = args.run_id or derive_run_id(path)
    stop = threading.Event()
    with _open_store(config) as store:
        store.ensure_run(
            run_id,
            name=run_id,
            metrics_path=str(path.resolve()),
            rollouts_dir=str(Path(args.rollouts).resolve()) if args.rollouts else "",
            checkpoints_dir=str(Path(args.checkpoints).resolve()) if args.checkpoints else None,
            mode="observe",
            now=time.time(),
        )
        guardian = Guardian(
            config=config,
            store=store,
            run_id=run_id,
            metrics=source,
            clock=time.time,
            rollouts=RolloutDir(Path(args.rollouts)) if args.rollouts else None,
            checkpoints_dir=Path(args.checkpoints) if args.checkpoints else None,
        )
        log.info(event("watch", {"run": run_id, "metrics": path, "db": store.url}))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        with (
            notifying(config, store, run_id, time.time, os.environ),
            exporting(guardian, store, config.exporter, time.time, stop, sink_names(config)) as polled,
        ):
            _watch_loop(
                guardian,
                stop,
                live=sys.stdout.isatty() and not args.no_live,
                max_ticks=args.max_ticks,
                after_tick=polled,
            )
        worst = guardian.tracker.worst()
        log.info(event("watch_stopped", {"run": run_id, "last_step": guardian.history.last_step}))
    return EXIT_UNHEALTHY if worst == Severity.CRITICAL else EXIT_OK


def _watch_loop(
    guardian: object,
    stop: threading.Event,
    *,
    live: bool,
    max_ticks: int | None,
    after_tick: Callable[[], None] = lambda: None,
) -> None:
    from rich.live import Live

    from guardian.daemon import Guardian
    from guardian.view import render

    assert isinstance(guardian, Guardian)
    ticks = 0

    def counted(_result: object) -> None:
        nonlocal ticks
        ticks += 1
        after_tick()
        if max_ticks is not None and ticks >= max_ticks:
            stop.set()

    if not live:
        guardian.run_forever(stop, on_tick=counted)
        return
    with Live(render(guardian.run_id, guardian.history, guardian.tracker, time.time()), refresh_per_second=4) as view:

        def redraw(result: object) -> None:
            counted(result)
            view.update(render(guardian.run_id, guardian.history, guardian.tracker, time.time()))

        guardian.run_forever(stop, on_tick=redraw)


def _open_store(config: GuardianConfig) -> Store:
    return Store.open(config.database_url())


# -- incidents ------------------------------------------------------------------------------------
def cmd_incidents(args: argparse.Namespace) -> int:
    config = _config(args)
    with _open_store(config) as store:
        if args.action == "list":
            incidents = store.list_incidents(args.run, limit=args.limit)
            if args.json:
                _print_json([i.to_json() for i in incidents])
                return EXIT_OK
            console = Console()
            if not incidents:
                console.print("no incidents")
            for i in incidents:
                style = SEVERITY_STYLE[i.severity.label]
                console.print(
                    f"#{i.id:<4} {i.run_id:28} step {i.opened_step!s:>6} (onset {i.onset_step!s:>5}) "
                    f"[{style}]{i.severity.label:8}[/] {i.status:10} {i.check:18} {i.message}"
                )
            return EXIT_OK
        detail = store.get_incident(args.id)
        if detail is None:
            log.error(event("error", {"message": f"no incident #{args.id} in {store.url}"}))
            return EXIT_ERROR
        interventions = [(iv, store.intervention_events(iv.id)) for iv in store.interventions(incident_id=args.id)]
        told = incident_deliveries(args.id, interventions, store.deliveries(detail.incident.run_id).values())
        if args.json:
            document = detail.to_json()
            document["interventions"] = [
                {**iv.to_json(), "events": [e.to_json() for e in timeline]} for iv, timeline in interventions
            ]
            document["notifications"] = [d.to_json() for d in told]
            _print_json(document)
            return EXIT_OK
        console = Console()
        i = detail.incident
        console.print(
            f"[bold]incident #{i.id}[/] run {i.run_id}: {i.check} [{SEVERITY_STYLE[i.severity.label]}]"
            f"{i.severity.label}[/] status {i.status}"
        )
        console.print(f"  opened at step {i.opened_step} (estimated onset {i.onset_step}) - {i.message}")
        for key, value in i.evidence.items():
            console.print(f"    {key} = {value:.4g}" if isinstance(value, float) else f"    {key} = {value}")
        for f in detail.findings:
            console.print(f"  step {f.step!s:>6} {f.severity.label:8} {f.check:18} {f.message}")
        for iv, timeline in interventions:
            console.print(f"  intervention {iv.number} ({iv.kind}, rung {iv.rung}): {iv.state}")
            for e in timeline:
                why = e.detail.get("why")
                console.print(f"    {e.at:%Y-%m-%d %H:%M:%S} {e.state}" + (f" - {why}" if why else ""))
                if isinstance(outcome := e.detail.get("outcome"), Mapping):
                    console.print(f"      figures: {outcome_line(outcome)}")
        for d in told:
            error = f" - {d.last_error}" if d.last_error else ""
            console.print(f"  told {d.sink}: {d.event_key} {d.status} ({d.attempts} attempt(s)){error}")
        return EXIT_OK


def incident_deliveries(
    incident_id: int,
    interventions: Sequence[tuple[InterventionView, Sequence[InterventionEventView]]],
    deliveries: Iterable[DeliveryView],
) -> list[DeliveryView]:
    """What each notifier and Grafana were told about one incident (its own events and its interventions')."""
    keys = {intervention_key(e.id) for _, timeline in interventions for e in timeline}
    prefix = incident_key(incident_id, "")
    return [d for d in deliveries if d.event_key in keys or d.event_key.startswith(prefix)]


# -- checkpoints ----------------------------------------------------------------------------------
def cmd_checkpoints(args: argparse.Namespace) -> int:
    from guardian.actions.checkpoints import CheckpointError, list_quarantine, restore_quarantine
    from guardian.actions.dirlock import DirLockedError, holding

    config = _config(args)
    restoring = args.target == "restore"
    run_id = args.run if restoring else args.target
    if run_id is None or (restoring and args.incident is None):
        log.error(
            event("usage", {"message": "guardian checkpoints RUN | guardian checkpoints restore RUN --incident ID"})
        )
        return EXIT_USAGE
    with _open_store(config) as store:
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
            _print_json({"checkpoints": [c.to_json() for c in listed], "quarantine": quarantined})
            return EXIT_OK
        console = Console()
        for c in sorted(listed, key=lambda c: c.step):
            where = "present" if Path(c.path).is_dir() else "moved"
            style = {"healthy": "green", "unhealthy": "red"}.get(c.verdict, "dim")
            console.print(f"step {c.step:>6}  [{style}]{c.verdict:9}[/] {where:8} {c.path}  {c.note or ''}")
        for path, incident in quarantined.items():
            console.print(f"quarantined by incident #{incident}: {path}")
        return EXIT_OK


# -- doctor, config -------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace) -> int:
    from guardian.doctor import diagnose

    report = diagnose(args.config)
    if args.json:
        _print_json([r.to_json() for r in report])
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
    document = _config(args).model_dump(mode="json")
    if document["db_url"]:
        document["db_url"] = mask_url(document["db_url"])
    _print_json(document)
    return EXIT_OK


# -- run ----------------------------------------------------------------------------------------
def default_run_id(command: Sequence[str], cwd: Path) -> str:
    digest = hashlib.sha1("\0".join([str(cwd), *command]).encode()).hexdigest()[:10]
    return f"run-{digest}"


def cmd_run(args: argparse.Namespace) -> int:
    from guardian.run import RunRequest, run_guarded

    config = _config(args)
    if args.mode:
        config = config.model_copy(update={"mode": args.mode})
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command and not args.attach:
        log.error(event("usage", {"message": "give the training command after --, or --attach RUN_ID"}))
        return EXIT_USAGE
    request = RunRequest(
        command=tuple(command),
        cwd=Path.cwd(),
        run_id=args.attach or args.run_id or default_run_id(command, Path.cwd()),
        attach=bool(args.attach),
        dry_run=args.dry_run,
        live=sys.stdout.isatty() and not args.no_live,
    )
    return run_guarded(config, request)


def cmd_demo(args: argparse.Namespace) -> int:
    from guardian.demo_run import run_demo

    return run_demo(_config(args), scenario=args.scenario, json_output=args.json)


# -- dashboards -----------------------------------------------------------------------------------
def cmd_dashboards_export(args: argparse.Namespace) -> int:
    from guardian.dashboards import DEFAULT_DIR, check, export_all

    directory = Path(args.output) if args.output else DEFAULT_DIR
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
    from guardian import grafana
    from guardian.dashboards import dashboards

    config = _config(args).grafana
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


# -- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guardian", description="Guard a verl RL training run.")
    parser.add_argument("--version", action="version", version=f"verl-guardian {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", help="guardian.yaml (default: built-in defaults + env overrides)")
        return p

    p = add("replay", "Run the checks over a finished metrics log as if live; exit 3 if unhealthy.")
    p.add_argument("trace", help="verl file-logger JSONL ({'step':N,'data':{...}} per line)")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir with {step}.jsonl dumps (for EGR)")
    p.add_argument("--rules", choices=("default", "seed"), help="rule set (default: from config)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_replay)

    p = add("watch", "Attach to a live run in observe mode: findings and incidents to the store.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics", help="the run's file-logger JSONL (VERL_FILE_LOGGER_PATH)")
    source.add_argument("--console", help="the run's stdout log, parsed as verl console lines (fallback)")
    p.add_argument("--rollouts", help="trainer.rollout_data_dir")
    p.add_argument("--checkpoints", help="trainer.default_local_dir (global_step_N folders)")
    p.add_argument("--run-id", help="run id in the store (default: derived from the metrics path)")
    p.add_argument("--no-live", action="store_true", help="no live terminal view (logs only)")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument("--max-ticks", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_watch)

    p = add("incidents", "Incident history.")
    isub = p.add_subparsers(dest="action", required=True)
    pl = isub.add_parser("list", help="newest first")
    pl.add_argument("--run", help="only this run id")
    pl.add_argument("--limit", type=int, default=50)
    pl.add_argument("--json", action="store_true")
    ps = isub.add_parser("show", help="one incident with its findings")
    ps.add_argument("id", type=int)
    ps.add_argument("--json", action="store_true")
    for q in (pl, ps):
        q.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_incidents)

    p = add("checkpoints", "A run's checkpoints with their health verdicts; 'restore' undoes a quarantine.")
    p.add_argument("target", help="RUN id, or 'restore'")
    p.add_argument("run", nargs="?", help="RUN id (with restore)")
    p.add_argument("--incident", type=int, help="the incident whose quarantine to undo (with restore)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_checkpoints)

    p = add("doctor", "What is installed, reachable or missing.")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = add("config", "Print the resolved configuration (or --example: the documented defaults).")
    p.add_argument("--example", action="store_true")
    p.set_defaults(func=cmd_config)

    p = add("run", "Launch a training command and guard it (enforce: stop, roll back, patch, resume).")
    p.add_argument("--mode", choices=("observe", "advise", "enforce"), help="default: config mode (enforce)")
    p.add_argument("--run-id", help="run id (default: derived from the command and the working directory)")
    p.add_argument("--attach", metavar="RUN_ID", help="re-attach to a run this store knows (after a guardian restart)")
    p.add_argument("--dry-run", action="store_true", help="print the command the first attempt would run, and exit")
    p.add_argument("--no-live", action="store_true", help="no live terminal view (logs only)")
    p.add_argument("--export", type=int, metavar="PORT", help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python -m verl.trainer.main_ppo key=value ...")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    init_logging(args.log_level)
    try:
        code: int = args.func(args)
        return code
    except ConfigError as exc:
        log.error(str(exc))
        return EXIT_USAGE
    except PatchError as exc:  # a training command the guardian cannot read or patch
        log.error(event("bad_command", {"message": str(exc)}))
        return EXIT_USAGE
    except StoreError as exc:
        log.error(event("store_error", {"message": str(exc)}))
        return EXIT_ERROR
