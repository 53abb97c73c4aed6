"""The report as one self-contained HTML page. Pure: a ``Report`` in, the page's text out.

Invariant: it opens offline. CSS and SVG are inline, nothing is fetched, and a Content-Security-Policy allows
only inline styles. Every text from the store or a dump is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape

from guardian.notify.compose import at_step, format_setting, format_value
from guardian.report.model import Report
from guardian.report.series import MarkerKind
from guardian.report.story import Patch, TimelineRow
from guardian.report.svg import plot_svg
from guardian.report.trajectories import Trajectory, TrajectorySample
from guardian.review.cost import Rate, RunCost
from guardian.review.lineage import AttemptLink

FOLD_CHARS = 400  # a text longer than this (or of more lines) folds, its start shown
FOLD_LINES = 8
PREVIEW_CHARS = 160
PROBLEMS_SHOWN = 5
CSP = "default-src 'none'; style-src 'unsafe-inline'"

CSS = """
:root { --ink: #1d2330; --dim: #5b6473; --rule: #d8dce3; --kept: #1f6feb; --abandoned: #8c939d;
  --onset: #d97706; --detection: #dc2626; --rollback: #7c3aed; --resume: #059669; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 0 auto;
  max-width: 1180px; padding: 24px 28px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 32px 0 10px;
  border-bottom: 1px solid var(--rule); padding-bottom: 4px; }
.sub, .note, figcaption .key { color: var(--dim); } .note { font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px; border-bottom: 1px solid var(--rule); }
th { background: #f3f5f8; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 12px 0; }
dl.facts dt { color: var(--dim); } dl.facts dd { margin: 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 10px 18px; }
figure { margin: 0; } figcaption { font-weight: 600; font-size: 13px; }
svg.plot { width: 100%; height: auto; display: block; font: 11px system-ui, sans-serif; }
svg .frame { fill: #fbfcfd; stroke: var(--rule); } svg .grid { stroke: #eceef2; }
svg .tick { fill: var(--dim); } svg .missing { fill: var(--dim); font-size: 14px; font-style: italic; }
svg polyline { fill: none; stroke-width: 1.6; stroke-linejoin: round; }
svg .kept { stroke: var(--kept); fill: none; } svg circle.kept { fill: var(--kept); }
svg .abandoned { stroke: var(--abandoned); stroke-dasharray: 5 3; } svg circle.abandoned { fill: var(--abandoned); }
svg .nonfinite { stroke: #dc2626; stroke-width: 2; }
svg .marker line { stroke-width: 1.2; stroke-dasharray: 2 2; }
svg .onset line { stroke: var(--onset); } svg .onset text { fill: var(--onset); }
svg .detection line { stroke: var(--detection); } svg .detection text { fill: var(--detection); }
svg .rollback line { stroke: var(--rollback); } svg .rollback text { fill: var(--rollback); }
svg .resume line { stroke: var(--resume); } svg .resume text { fill: var(--resume); }
.legend span { margin-right: 16px; white-space: nowrap; }
.swatch { display: inline-block; width: 26px; height: 0; vertical-align: middle; margin-right: 5px;
  border-top: 2px solid var(--kept); }
.swatch.abandoned { border-top: 2px dashed var(--abandoned); }
.swatch.onset { border-top: 2px dotted var(--onset); } .swatch.detection { border-top: 2px dotted var(--detection); }
.swatch.rollback { border-top: 2px dotted var(--rollback); } .swatch.resume { border-top: 2px dotted var(--resume); }
.tag { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; background: #e7eefc; }
.tag.abandoned { background: #eceef1; color: #4b5260; }
details summary { cursor: pointer; color: var(--dim); }
"""


# --------------------------------------------------------------------------------------------------- helpers


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _when(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC" if value is not None else ""


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], css: str) -> str:
    """A table of cells already rendered (escaped) by the caller."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(value: object, numeric: bool = False) -> str:
    return f'<td class="num">{_e(value)}</td>' if numeric else f"<td>{_e(value)}</td>"


def folded(text: str) -> str:
    """A long text as ``<details>`` with its start as the summary; a short one as it is."""
    if len(text) <= FOLD_CHARS and text.count("\n") < FOLD_LINES:
        return f"<pre>{_e(text)}</pre>"
    preview = text[:PREVIEW_CHARS].replace("\n", " ")
    return f"<details><summary>{_e(preview)}… ({len(text)} characters)</summary><pre>{_e(text)}</pre></details>"


def _money(value: float | None) -> str:
    return f"${value:,.2f}" if value is not None else "unknown"


def _hours(value: float | None) -> str:
    return f"{value:,.2f}" if value is not None else "unknown"


# -------------------------------------------------------------------------------------------------- sections


def _header(report: Report) -> str:
    run = report.run
    facts = [("run", run.id), ("mode", run.mode), ("run status", run.status)]
    if report.incident is not None:
        i = report.incident.incident
        facts += [
            ("what", i.message),
            ("estimated onset", at_step(i.onset_step)),
            ("detected", f"{at_step(i.opened_step)}, {_when(i.opened_at)}"),
        ]
        if i.closed_at is not None:
            facts.append(("closed", f"{i.status} {at_step(i.closed_step)}, {_when(i.closed_at)}"))
        if i.note:
            facts.append(("outcome", i.note))
    if report.steps is not None:
        facts.append(("steps shown", f"{report.steps[0]}-{report.steps[1]}"))
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    return (
        f"<header><h1>{_e(report.title)}</h1>"
        f'<div class="sub">verl-guardian report, generated {_e(_when(report.generated_at))}</div>'
        f'<dl class="facts">{rows}</dl></header>'
    )


def _legend() -> str:
    items = [("kept", "kept timeline"), ("abandoned", "abandoned branch")]
    items += [(kind.value, kind.value) for kind in MarkerKind]
    spans = "".join(f'<span><i class="swatch {css}"></i>{_e(label)}</span>' for css, label in items)
    return f'<p class="legend note">{spans}<span>red tick: non-finite value</span></p>'


def _plots(report: Report) -> str:
    figures = []
    for plot in report.plots:
        key = f' <span class="key">{_e(plot.key)}</span>' if plot.key else ""
        figures.append(
            f"<figure><figcaption>{_e(plot.title)}{key}</figcaption>"
            f"{plot_svg(plot, report.markers, report.steps)}</figure>"
        )
    return f'<section id="signals"><h2>Signals</h2>{_legend()}<div class="plots">{"".join(figures)}</div></section>'


def _timeline(rows: Sequence[TimelineRow]) -> str:
    cells = ([_td(_when(r.at)), _td("" if r.step is None else r.step, True), _td(r.what), _td(r.detail)] for r in rows)
    body = _table(("time", "step", "what", "detail"), cells, "timeline") if rows else '<p class="note">nothing</p>'
    return f'<section id="timeline"><h2>Timeline</h2>{body}</section>'


def _patches(patches: Sequence[Patch]) -> str:
    if not patches:
        return '<section id="config"><h2>Config change</h2><p class="note">no patch was applied</p></section>'
    parts = []
    for p in patches:
        rung = f" (remedy {p.rung})" if p.rung else ""
        cells = (
            [f"<td><code>{_e(c.key)}</code></td>", _td(format_setting(c.before)), _td(format_setting(c.after))]
            for c in p.changes
        )
        notes = "".join(f"<li>{_e(n)}</li>" for n in p.notes)
        parts.append(
            f"<h3>{_e(p.name)}{_e(rung)}</h3>"
            + _table(("setting", "before", "after"), cells, "diff")
            + (f'<ul class="note">{notes}</ul>' if notes else "")
        )
    return f'<section id="config"><h2>Config change (before → after)</h2>{"".join(parts)}</section>'


def _lineage(links: Sequence[AttemptLink]) -> str:
    def row(a: AttemptLink) -> list[str]:
        by = "a person" if a.launched_by is None else a.launched_by.name
        steps = "" if a.first_step is None else f"{a.first_step}-{a.last_step}"
        exit_code = "" if a.exit_code is None else a.exit_code
        return [
            _td(a.number, True),
            _td(by),
            _td(a.summary),
            _td(steps),
            _td(_when(a.started_at)),
            _td(_when(a.ended_at)),
            _td(exit_code, True),
        ]

    headers = ("attempt", "launched by", "what", "steps", "started", "ended", "exit")
    body = _table(headers, (row(a) for a in links), "lineage") if links else '<p class="note">no attempt</p>'
    return f'<section id="lineage"><h2>Attempts lineage</h2>{body}</section>'


def _rate_note(rate: Rate) -> str:
    if rate.unknown:
        return f"GPU-hours cannot be priced: {rate.unknown}."
    return (
        f"One step: {format_value(rate.step_seconds)} s (median) on {rate.gpus} GPUs ({rate.gpus_source}), "
        f"at ${rate.gpu_hour_usd:,.2f} per GPU-hour."
    )


def _cost(report: Report) -> str:
    cost: RunCost = report.cost
    rate = cost.rate
    if report.incident is not None:
        own = cost.incident(report.incident.incident.id)
        lost = own.steps_lost if own is not None else 0
        manual = cost.manual_lag_steps if own is not None and own.rolled_back else 0
    else:
        lost, manual = cost.steps_lost, cost.manual_steps
    rows = []
    for label, steps in (
        ("lost under the guardian (steps rolled back)", lost),
        (f"rescued by hand (floor: noticed {cost.manual_lag_steps} steps late)", manual),
    ):
        hours = rate.gpu_hours(steps)
        rows.append([_td(label), _td(steps, True), _td(_hours(hours), True), _td(_money(rate.usd(hours)), True)])
    table = _table(("", "steps", "GPU-hours", "USD"), rows, "cost")
    return f'<section id="cost"><h2>Cost</h2>{table}<p class="note">{_e(_rate_note(rate))}</p></section>'


def _trajectory(rank: int, t: Trajectory) -> list[str]:
    branch = "abandoned" if t.abandoned else "kept"
    extras = ", ".join(f"{name} {format_value(value)}" for name, value in t.extras)
    score = _e(format_value(t.score)) + (f'<div class="note">{_e(extras)}</div>' if extras else "")
    return [
        _td(rank, True),
        _td(t.step, True),
        f'<td class="num">{score}</td>',
        f'<td><span class="tag {branch}">{branch}</span><div class="note">{_e(t.source)}</div></td>',
        f"<td>{folded(t.prompt)}</td>",
        f"<td>{folded(t.response)}</td>",
        f"<td>{folded(t.truth)}</td>",
    ]


def _trajectories(sample: TrajectorySample | None) -> str:
    if sample is None:
        return ""
    said = (
        f"The {len(sample.shown)} highest-reward distinct samples of {sample.scored_rows} scored in {sample.dumps} "
        f"rollout dump(s) of the steps shown (both branches): read them for reward hacking. A prompt and response "
        f"dumped more than once is shown once, at its best score."
    )
    if not sample.folders:
        said = "No rollout dump folder of this run was found (trainer.rollout_data_dir)."
    problems = "".join(f"<li>{_e(p)}</li>" for p in sample.problems[:PROBLEMS_SHOWN])
    more = len(sample.problems) - PROBLEMS_SHOWN
    if more > 0:
        problems += f"<li>… and {more} more</li>"
    headers = ("#", "step", "score", "branch", "prompt", "response", "ground truth")
    rows = (_trajectory(rank, t) for rank, t in enumerate(sample.shown, start=1))
    table = _table(headers, rows, "trajectories") if sample.shown else ""
    return (
        f'<section id="trajectories"><h2>Highest-reward trajectories</h2><p class="note">{_e(said)}</p>{table}'
        + (f'<p class="note">Unreadable dump lines:</p><ul class="note">{problems}</ul>' if problems else "")
        + "</section>"
    )


def render(report: Report) -> str:
    """The whole page."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(report.title)}</title><style>{CSS}</style></head><body>"
        + _header(report)
        + _plots(report)
        + _timeline(report.timeline)
        + _patches(report.patches)
        + _lineage(report.lineage)
        + _cost(report)
        + _trajectories(report.trajectories)
        + "</body></html>\n"
    )
