"""Builders for the panels of classic (v1) Grafana dashboard JSON: targets, panels, rows, grid layout.

Every builder returns the plain dict Grafana stores (as Grafana 11.6 saves it). Enforced here: every panel queries
the ``datasource`` variable, filters ``run_id=~"$run_id"`` (``selector``), and has a unit and a description;
``layout`` assigns grid positions and ids, so panels never overlap and ids never repeat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from guardian import keys

Json = dict[str, Any]

DATASOURCE_VARIABLE: Final = "datasource"
RUN_VARIABLE: Final = "run_id"
PROMETHEUS: Final[Json] = {"type": "prometheus", "uid": "${" + DATASOURCE_VARIABLE + "}"}
GRID_WIDTH: Final = 24  # Grafana's grid is 24 columns wide

_RUN_MATCHER: Final = f'{keys.PROM_LABEL_RUN_ID}=~"${RUN_VARIABLE}"'


def selector(metric: str, **matchers: str) -> str:
    """``metric{run_id=~"$run_id", k="v", ...}``: a metric limited to the runs picked on the dashboard."""
    extra = "".join(f', {name}="{value}"' for name, value in matchers.items())
    return f"{metric}{{{_RUN_MATCHER}{extra}}}"


def target(expr: str, legend: str = "{{run_id}}", *, instant: bool = False) -> Json:
    """One Prometheus query of a panel (``refId`` is set by the panel builder: A, B, ... in order).
    ``instant``: one value at the end of the range (stat panels), not a series."""
    return {
        "datasource": dict(PROMETHEUS),
        "editorMode": "code",
        "expr": expr,
        "instant": instant,
        "legendFormat": legend,
        "range": not instant,
    }


def _panel(
    kind: str,
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Json],
    *,
    width: int,
    height: int,
    options: Json,
    custom: Json | None = None,
    extra_defaults: Mapping[str, Any] | None = None,
) -> Json:
    refs = [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]
    defaults: Json = {"unit": unit, "color": {"mode": "palette-classic"}, **(extra_defaults or {})}
    if custom is not None:
        defaults["custom"] = custom
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": dict(PROMETHEUS),
        "gridPos": {"h": height, "w": width, "x": 0, "y": 0},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": refs,
    }


def _legend() -> Json:
    return {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Json],
    *,
    width: int = 8,
    height: int = 8,
    stepped: bool = False,
    log_scale: bool = False,
    min_value: float | None = None,
    max_value: float | None = None,
    min_interval: str | None = None,
) -> Json:
    """A time-series panel of lines (``stepped`` for counts, which change in whole steps), optionally
    with a log10 y axis and fixed bounds. ``min_interval`` (e.g. ``"10m"``) is the panel's lower
    bound for ``$__interval``, and so for ``$__rate_interval``: the shortest window a rate averages."""
    custom: Json = {
        "drawStyle": "line",
        "fillOpacity": 0,
        "lineInterpolation": "stepAfter" if stepped else "linear",
        "lineWidth": 1,
        "pointSize": 4,
        "showPoints": "never",
        "spanNulls": False,
        "scaleDistribution": {"type": "log", "log": 10} if log_scale else {"type": "linear"},
    }
    bounds = {name: value for name, value in (("min", min_value), ("max", max_value)) if value is not None}
    options = {"legend": _legend(), "tooltip": {"mode": "multi", "sort": "desc"}}
    panel = _panel(
        "timeseries",
        title,
        description,
        unit,
        targets,
        width=width,
        height=height,
        options=options,
        custom=custom,
        extra_defaults=bounds,
    )
    if min_interval is not None:
        panel["interval"] = min_interval
    return panel


def stat(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Json],
    *,
    width: int = 4,
    height: int = 6,
    red_from: float | None = None,
) -> Json:
    """A single-number panel showing each series' last value; ``red_from``: green below it, red from it
    (else one colour per series)."""
    options = {
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "auto",
    }
    color: Json = {"color": {"mode": "palette-classic"}}
    if red_from is not None:
        steps = [{"color": "green", "value": None}, {"color": "red", "value": red_from}]
        color = {"color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute", "steps": steps}}
    return _panel(
        "stat", title, description, unit, targets, width=width, height=height, options=options, extra_defaults=color
    )


def value_mappings(texts: Mapping[int, tuple[str, str]]) -> list[Json]:
    """Grafana value mappings: each number shown as a word in a colour, e.g. ``{2: ("critical", "red")}``."""
    options = {
        str(value): {"index": index, "text": text, "color": color}
        for index, (value, (text, color)) in enumerate(sorted(texts.items()))
    }
    return [{"type": "value", "options": options}]


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[Json],
    mappings: list[Json],
    *,
    width: int = GRID_WIDTH,
    height: int = 8,
) -> Json:
    """A state timeline: one band per series, coloured by the value mappings (unit ``none``: the words
    come from the mappings)."""
    options = {
        "alignValue": "left",
        "legend": _legend(),
        "mergeValues": True,
        "rowHeight": 0.9,
        "showValue": "auto",
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return _panel(
        "state-timeline",
        title,
        description,
        "none",
        targets,
        width=width,
        height=height,
        options=options,
        custom={"fillOpacity": 80, "lineWidth": 0},
        extra_defaults={"mappings": mappings},
    )


def row(title: str) -> Json:
    """An expanded row header; the panels placed after it (up to the next row) belong to it."""
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"h": 1, "w": GRID_WIDTH}}


def layout(sections: Sequence[tuple[str, Sequence[Json]]]) -> list[Json]:
    """Rows with their panels, flowed left to right and wrapped at the grid width; ids 1, 2, ... in order.

    Each panel brings its own width and height (``gridPos.w``/``h``); ``x``/``y`` are set here. A
    line is as tall as its tallest panel, so nothing overlaps whatever the sizes.
    """
    placed: list[Json] = []
    y = 0
    for title, panels in sections:
        header = row(title)
        header["gridPos"] = {**header["gridPos"], "x": 0, "y": y}
        placed.append(header)
        y += 1
        x, line_height = 0, 0
        for panel in panels:
            w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
            if not 0 < w <= GRID_WIDTH:
                raise ValueError(f"panel {panel['title']!r}: width {w} outside 1..{GRID_WIDTH}")
            if x + w > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            placed.append({**panel, "gridPos": {"h": h, "w": w, "x": x, "y": y}})
            x, line_height = x + w, max(line_height, h)
        y += line_height
    return [{"id": index, **panel} for index, panel in enumerate(placed, start=1)]
