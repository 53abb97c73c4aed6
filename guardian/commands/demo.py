"""``guardian demo``: a real, tiny GRPO run on CPU, guarded by ``guardian run`` in enforce mode on embedded defaults.

The trainer is ``guardian.demo.trainer`` running a named scenario (``guardian.demo.scenarios``); the terminal shows
the steps, the detection, stop, rollback target, patch, resume, probation and outcome. ``--json`` prints the
incident timeline instead.
"""

from __future__ import annotations

import logging
import math
import signal
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
from rich.console import Console
from rich.markup import escape

from guardian.commands.compose import guarded_run, local_site
from guardian.commands.run import guard_loop, register_run
from guardian.config import GuardianConfig
from guardian.core import Severity
from guardian.demo.scenarios import SCENARIOS, RunFiles
from guardian.exits import EXIT_INTERRUPTED
from guardian.keys import Signal
from guardian.logs import logging_to_file
from guardian.notify.compose import at_step, format_setting, format_value
from guardian.rescue.layout import run_layout
from guardian.rescue.policy import CRASH_OUTPUT_EVIDENCE
from guardian.rescue.supervisor import Supervisor
from guardian.sinks.snapshot import RunSnapshot
from guardian.store import IncidentView, InterventionView, StateDetail, Store, config_changes

# seconds per step added to the trainer, so the story unfolds at a readable pace
FINAL_STEPS = 10  # the closing line's reward: means of the first and the last this-many steps
PACE_S = 0.03
STATUS_EVERY = 25
# in the demo these faults are transient (a flaky node, a bad batch): a restart from a checkpoint gets past
# them; a fault that strikes every launch ends in GAVE_UP instead (bench/remediation.py measures both)
TRANSIENT = ("nan", "hang", "crash")


def demo_config(config: GuardianConfig) -> GuardianConfig:
    """The user's config with the demo's pace: fast polls, short stop waits and stall limits."""
    stall = config.checks.stall.model_copy(update={"min_seconds": 3.0, "startup_seconds": 60.0})
    return config.model_copy(
        update={
            "mode": "enforce",
            "sources": config.sources.model_copy(update={"poll_interval_s": 0.1}),
            "intervention": config.intervention.model_copy(
                update={
                    "probation_steps": 20,
                    "startup_seconds": 60.0,
                    "stop_sigint_s": 5.0,
                    "stop_sigterm_s": 5.0,
                    "stop_sigkill_s": 5.0,
                }
            ),
            "checks": config.checks.model_copy(update={"stall": stall}),
        }
    )


@dataclass
class Narrator:
    """Prints what happened since the last call: the run's status from the tick's published snapshot, the story
    (incidents and their evidence, each intervention's events) from the store."""

    console: Console
    store: Store
    run_id: str
    told_events: set[tuple[int, int]] = field(default_factory=set)
    told_incidents: set[int] = field(default_factory=set)
    last_status: int = -STATUS_EVERY

    def __call__(self, snapshot: RunSnapshot) -> None:
        step = snapshot.step
        if step is not None and step >= self.last_status + STATUS_EVERY:
            self.last_status = step
            worst = max((f.severity for f in snapshot.findings.values()), default=Severity.UNKNOWN)
            label = {Severity.CRITICAL: "[bold red]critical[/]", Severity.WARN: "[yellow]warning[/]"}.get(
                worst, "[green]healthy[/]"
            )
            self.console.print(f"  step {step:>4}  {_values(snapshot)}  {label}")
        for incident in reversed(self.store.list_incidents(self.run_id)):
            if incident.id in self.told_incidents or incident.status == "dismissed":
                continue
            self.told_incidents.add(incident.id)
            at = at_step(incident.opened_step)
            onset = f" (estimated onset step {incident.onset_step})" if incident.onset_step is not None else ""
            self.console.print(
                f"[bold red]DETECTED[/] incident #{incident.id}: {incident.check} {at}{onset}: "
                f"{escape(incident.message)}"
            )
            evidence = ", ".join(
                f"{k}={format_value(v)}"
                for k, v in incident.evidence.items()
                if v is not None and k != CRASH_OUTPUT_EVIDENCE
            )
            if evidence:
                self.console.print(f"         evidence: {escape(evidence)}")
        for iv in self.store.interventions(self.run_id):
            for index, e in enumerate(self.store.intervention_events(iv.id)):
                if (iv.id, index) in self.told_events:
                    continue
                self.told_events.add((iv.id, index))
                self._event(e.state, e.detail, iv)

    def _event(self, state: str, detail: StateDetail, iv: InterventionView) -> None:
        say = self.console.print
        tag = f"[cyan]intervention {iv.number} {state:11}[/]"
        more = " " * len(f"intervention {iv.number} {state:11} ")  # a continuation line, under the text
        if state == "DETECTED":
            say(f"{tag} for incident #{iv.incident_id} ({iv.kind}, rung {iv.rung + 1})")
        elif state == "STOPPING":
            say(f"{tag} stopping the trainer's process group (SIGINT, then SIGTERM, then SIGKILL)")
        elif state == "STOPPED" and detail.get("target"):
            say(f"{tag} rollback target {escape(str(detail['target']))}: {escape(str(detail.get('why')))}")
        elif state == "ROLLED_BACK":
            moved = detail.get("moved") or []
            if detail.get("restored_from"):
                say(f"{tag} restored from its pin {escape(str(detail['restored_from']))} (verl's retention deleted it)")
            say(f"{tag} newer checkpoints {moved} moved to .guardian-quarantine/ (never deleted); tracker rewritten")
            if detail.get("why"):
                say(f"{more}{escape(str(detail['why']))}")
        elif state == "PATCHED":
            for key, before, after in config_changes(detail.get("diff")):
                say(f"{tag} {key}: {escape(format_setting(before))} -> {escape(format_setting(after))}")
            for note in detail.get("notes", []):
                say(f"{more}note: {escape(str(note))}")
        elif state == "RESUMING":
            say(f"{tag} relaunched the trainer from the rollback point")
        elif state == "PROBATION":
            say(f"{tag} resumed at step {detail.get('first_step')}; on probation")
        elif state in ("RESOLVED", "UNRESOLVED", "RELAPSED", "GAVE_UP"):
            style = {"RESOLVED": "bold green", "UNRESOLVED": "bold red", "RELAPSED": "yellow", "GAVE_UP": "bold red"}[
                state
            ]
            say(f"[{style}]intervention {iv.number} {state}[/] {escape(str(detail.get('why', '')))}")


def _values(snapshot: RunSnapshot) -> str:
    parts = []
    for shown in (Signal.REWARD, Signal.ENTROPY, Signal.EGR):
        value = snapshot.signals.get(shown)
        if value is not None and math.isfinite(value):
            parts.append(f"{shown.value} {value:.3f}")
    return "  ".join(parts)


def run_demo(config: GuardianConfig, *, scenario: str, json_output: bool) -> int:
    """The demo; Ctrl-C or SIGTERM stop it (its trainer too) and still print its summary, never a traceback."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _demo(config, scenario=scenario, json_output=json_output, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True, slots=True)
class DemoRun:
    """A scenario laid out as a run: its id, the trainer's files under the run's folder, its command."""

    scenario: str
    run_id: str
    files: RunFiles
    command: tuple[str, ...]
    notes: str


def demo_run(config: GuardianConfig, scenario: str) -> DemoRun:
    """Scenario ``scenario`` at the demo's pace, its trainer's folder created."""
    run_id = f"demo-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    files = RunFiles(config.home.resolve() / "runs" / run_id / "trainer")
    files.root.mkdir(parents=True, exist_ok=True)
    extra = [f"+trainer.fault.slow_steps={PACE_S}"]
    if scenario in TRANSIENT:
        extra.append("+trainer.fault.transient=true")  # the fault spares a run resumed from a checkpoint
    chosen = SCENARIOS[scenario].with_extra(*extra)
    return DemoRun(scenario, run_id, files, tuple(chosen.command(files)), chosen.notes or _first_line(scenario))


def _demo(config: GuardianConfig, *, scenario: str, json_output: bool, stop: threading.Event) -> int:
    config = demo_config(config)
    demo = demo_run(config, scenario)
    console = Console(stderr=json_output, soft_wrap=True)  # piped: whole lines, paths unbroken
    console.print(f"[bold]guardian demo[/] - scenario [cyan]{scenario}[/]: {demo.notes}")
    with (
        # in a terminal the narration is the story; only critical log lines (the store failing, giving up) join it
        logging_to_file(
            demo.files.root.parent / "guardian.log", quiet_terminal=console.is_terminal, quiet_level=logging.CRITICAL
        ) as log_file,
        Store.open(
            config.database_url(),
            busy_timeout_s=config.store.busy_timeout_s,
            statement_timeout_s=config.store.statement_timeout_s,
        ) as store,
    ):
        console.print(f"  every event line: {log_file}")
        if config.exporter.enabled:
            console.print(f"  metrics: {metrics_url(config)} while the demo runs")
        code = _guard_demo(config, store, console, demo, stop, json_output)
        return code if code is not None else EXIT_INTERRUPTED


def _guard_demo(
    config: GuardianConfig, store: Store, console: Console, demo: DemoRun, stop: threading.Event, json_output: bool
) -> int | None:
    """Register the demo's run and guard it, narrated, until it ends (its exit code) or is interrupted (None)."""
    layout = run_layout(config.home, demo.run_id, demo.command, demo.files.root)
    register_run(store, layout, mode=config.mode, name=f"demo {demo.scenario}")
    narrate = Narrator(console, store, demo.run_id)

    def lingering(url: str, seconds: float) -> None:
        console.print(
            f"serving the final state on {url} for {seconds:.0f} s more, so Prometheus scrapes it "
            "(exporter.linger_s); Ctrl-C to stop now"
        )

    with guarded_run(config, store, layout, local_site(), stop, on_linger=lingering) as (supervisor, out):
        supervisor.start()
        code = guard_loop(
            supervisor,
            stop,
            config.sources.poll_interval_s,
            live=False,
            after_tick=lambda ok: narrate(out.snapshots.latest),  # the tick's snapshot is published by then
            snapshots=out.snapshots,
        )
        if code is None:  # Ctrl-C or SIGTERM: the demo's trainer is the demo's own, it does not outlive it
            console.print("\n[yellow]interrupted[/]: stopping the demo's trainer")
            supervisor.trainer.stop(reason="demo interrupted")
        # the summary before the exporter's linger, which would otherwise hold it back
        _summary(console, store, supervisor, demo.run_id, demo.scenario, code, json_output, demo.files)
    return code


def metrics_url(config: GuardianConfig) -> str:
    """Where the exporter serves (the port as configured: 0 is a free port, named on the event=exporter line)."""
    port = config.exporter.port or "PORT"
    return f"http://{config.exporter.host}:{port}/metrics"


def _summary(
    console: Console,
    store: Store,
    supervisor: Supervisor,
    run_id: str,
    scenario: str,
    code: int | None,
    json_output: bool,
    files: RunFiles,
) -> None:
    """The demo's closing lines (or, with ``--json``, its incident timeline)."""
    incidents = store.list_incidents(run_id)
    if json_output:
        document = {
            "run": run_id,
            "scenario": scenario,
            "exit_code": code,
            "last_step": supervisor.incident_tick.history.last_step,
            "incidents": [
                {
                    **detail.to_json(),
                    "interventions": [
                        {**iv.to_json(), "events": [e.to_json() for e in store.intervention_events(iv.id)]}
                        for iv in store.interventions(incident_id=i.id)
                    ],
                }
                for i in incidents
                if (detail := store.get_incident(i.id)) is not None
            ],
            "store": store.url,
        }
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
        return
    last = supervisor.incident_tick.history.last_step
    outcome = {
        0: "[bold green]finished[/]",
        93: "[bold red]gave up (exit 93: do not requeue)[/]",
        None: "[yellow]interrupted[/]",
    }
    console.print(f"\nrun {run_id}: {outcome.get(code, f'exit {code}')} at step {last}")
    reward = [v for v in supervisor.incident_tick.history.signal(Signal.REWARD).values if math.isfinite(v)]
    if len(reward) >= 2 * FINAL_STEPS:
        start, end = statistics.fmean(reward[:FINAL_STEPS]), statistics.fmean(reward[-FINAL_STEPS:])
        console.print(f"  reward {start:.2f} over the first {FINAL_STEPS} steps, {end:.2f} over the last")
    for line in incident_lines(list(reversed(incidents))):
        console.print(escape(line))
    console.print(f"history: {store.url}; trainer files: {files.root}")


def incident_lines(incidents: Sequence[IncidentView]) -> list[str]:
    """The closing lines of each incident (oldest first): its status and where it lives, then what its rescue
    showed in the probation's own words (the close note: "intervention 1: 20 steps after the rollback: at the
    same 21 steps: reward 0.271 on the new branch vs 0.27 on the abandoned one (level, within ±0.014), ...")."""
    lines = []
    for i in incidents:
        lines.append(f"  incident #{i.id} {i.check}: {i.status} - guardian incidents show {i.id}")
        if i.note:
            lines.append(f"    {i.note}")
    return lines


def _first_line(scenario: str) -> str:
    return {
        "entropy_collapse": "an entropy bonus whose sign slipped (entropy_coeff=-0.3)",
        "healthy": "sane settings; the guardian should only watch",
        "nan": "weights turn non-finite mid-run",
        "hang": "the trainer stops making progress",
        "crash": "the trainer exits with an error mid-run",
    }.get(scenario, "")
