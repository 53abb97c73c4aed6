"""One signal's plot as an inline SVG string, drawn by hand so the report needs no script. Pure.

Kept timeline solid, abandoned branches dashed grey, non-finite values red ticks, markers as labelled vertical
lines. Every plot shares the step axis; every text is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from guardian.report.series import Marker, Plot, Point, StepRange

WIDTH, HEIGHT = 760, 210
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 44, 26  # the plot area's margins: tick labels left and below, marker labels above
LABEL_ROWS = 3
LABEL_ROW_PX = 13
CHAR_PX = 6.2  # a label character's width at the page's 11 px: enough to keep labels apart
TICKS = 5
DOTTED_POINTS = 40  # a trace of this few points gets a dot at each
# The largest magnitude drawn as is: a finite value beyond it (1.7e308 from a logger gone wrong) is drawn at this
# edge and the plot says so. Far below the float maximum, so a padded span, its ticks and the pixel arithmetic
# never overflow to inf (issue 24, HR3).
PLOT_LIMIT = 1e300


def clip(value: float) -> float:
    """``value`` within ±``PLOT_LIMIT``."""
    return max(-PLOT_LIMIT, min(PLOT_LIMIT, value))


def nice_ticks(lo: float, hi: float, count: int = TICKS) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) spanning ``lo``..``hi``, about ``count`` of them (the
    span clipped to ±``PLOT_LIMIT``, so that finite extremes never overflow)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [v for v in (lo, hi) if math.isfinite(v)][:1]
    lo, hi = clip(lo), clip(hi)
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def value_range(plot: Plot) -> tuple[float, float]:
    """The finite values' span, padded so a line never runs along the frame (a flat line gets a band)."""
    values = [clip(v) for t in plot.traces for _, v in t.points if v is not None]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.06 if hi > lo else (abs(lo) * 0.1 or 1.0)
    return lo - pad, hi + pad


class _Frame:
    """Steps and values to pixels."""

    def __init__(self, steps: StepRange, values: tuple[float, float]) -> None:
        self.steps, self.values = steps, values

    def x(self, step: float) -> float:
        lo, hi = self.steps
        span = WIDTH - LEFT - RIGHT
        return LEFT + (span / 2 if hi == lo else (step - lo) / (hi - lo) * span)

    def y(self, value: float) -> float:
        lo, hi = self.values
        return TOP + (hi - clip(value)) / (hi - lo) * (HEIGHT - TOP - BOTTOM)


def _fmt(value: float) -> str:
    return f"{value:.1f}"


def _runs(points: Sequence[Point]) -> list[list[tuple[int, float]]]:
    """The stretches of finite values, split where a value is non-finite."""
    runs: list[list[tuple[int, float]]] = [[]]
    for step, value in points:
        if value is None:
            runs.append([])
        else:
            runs[-1].append((step, value))
    return [run for run in runs if run]


def _trace(frame: _Frame, points: Sequence[Point], css: str, name: str) -> list[str]:
    out = []
    sparse = len(points) <= DOTTED_POINTS  # a validation score every N steps: each value seen
    for run in _runs(points):
        if len(run) > 1:
            coords = " ".join(f"{_fmt(frame.x(s))},{_fmt(frame.y(v))}" for s, v in run)
            out.append(f'<polyline class="{css}" points="{coords}"><title>{escape(name)}</title></polyline>')
        if sparse or len(run) == 1:
            out += [f'<circle class="{css}" cx="{_fmt(frame.x(s))}" cy="{_fmt(frame.y(v))}" r="2.2"/>' for s, v in run]
    bottom = HEIGHT - BOTTOM
    for step in (step for step, value in points if value is None):
        x = _fmt(frame.x(step))
        out.append(
            f'<line class="nonfinite" x1="{x}" x2="{x}" y1="{bottom - 7}" y2="{bottom}">'
            f"<title>step {step}: non-finite ({escape(name)})</title></line>"
        )
    return out


def _axes(frame: _Frame, finite: bool) -> list[str]:
    out = [
        f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}"/>'
    ]
    lo, hi = frame.steps
    for tick in nice_ticks(lo, hi) if hi > lo else [lo]:
        if tick != int(tick):
            continue
        x = _fmt(frame.x(tick))
        out.append(f'<text class="tick" x="{x}" y="{HEIGHT - BOTTOM + 15}" text-anchor="middle">{int(tick)}</text>')
    if finite:
        for tick in nice_ticks(*frame.values, count=4):
            y = _fmt(frame.y(tick))
            out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y}" y2="{y}"/>')
            out.append(f'<text class="tick" x="{LEFT - 5}" y="{y}" dy="3.5" text-anchor="end">{tick:.4g}</text>')
    return out


def _markers(frame: _Frame, markers: Sequence[Marker]) -> list[str]:
    out = []
    row_ends = [-math.inf] * LABEL_ROWS
    lo, hi = frame.steps
    for marker in sorted(markers, key=lambda m: m.step):
        if not lo <= marker.step <= hi:
            continue
        x = frame.x(marker.step)
        width = len(marker.label) * CHAR_PX
        row = next((r for r, end in enumerate(row_ends) if end < x), min(range(LABEL_ROWS), key=row_ends.__getitem__))
        flip = x + 3 + width > WIDTH  # near the right edge: the label to the left of its line
        row_ends[row] = x + 8 + width if not flip else x + 4
        y = TOP - 6 - row * LABEL_ROW_PX  # row 0 right above the plot
        text_x, anchor = (x - 3, "end") if flip else (x + 3, "start")
        css = f"marker {marker.kind}"
        out.append(
            f'<g class="{css}"><title>{escape(marker.label)} at step {marker.step}</title>'
            f'<line x1="{_fmt(x)}" x2="{_fmt(x)}" y1="{y - 9}" y2="{HEIGHT - BOTTOM}"/>'
            f'<text x="{_fmt(text_x)}" y="{y}" text-anchor="{anchor}">{escape(marker.label)}</text></g>'
        )
    return out


def plot_svg(plot: Plot, markers: Sequence[Marker], steps: StepRange | None) -> str:
    """The plot over ``steps`` (shared by the report's plots); "not logged" when no step in range logs the signal,
    "no finite value" when every value it logged is NaN/inf."""
    state = "drawn" if plot.finite else "non-finite" if plot.key is not None else "not-logged"
    head = (
        f'<svg class="plot" data-signal="{escape(plot.signal)}" data-state="{state}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(plot.title)}">'
    )
    values = value_range(plot) if plot.finite else (0.0, 1.0)
    frame = _Frame(steps if steps is not None else (0, 0), values)
    body = _axes(frame, plot.finite)
    if steps is not None:
        for trace in plot.traces:
            body += _trace(frame, trace.points, "abandoned" if trace.abandoned else "kept", trace.name)
        body += _markers(frame, markers)
    clipped = sum(1 for t in plot.traces for _, v in t.points if v is not None and abs(v) > PLOT_LIMIT)
    if clipped:
        note = f"{clipped} value(s) beyond ±{PLOT_LIMIT:.0e} clipped to the edge"
        body.append(f'<text class="missing" x="{WIDTH - RIGHT - 4}" y="{TOP + 12}" text-anchor="end">{note}</text>')
    if not plot.finite:
        said = "not logged" if plot.key is None else "no finite value logged (NaN/inf only)"
        middle = (TOP + HEIGHT - BOTTOM) / 2
        body.append(f'<text class="missing" x="{WIDTH / 2}" y="{_fmt(middle)}" text-anchor="middle">{said}</text>')
    return head + "".join(body) + "</svg>"
