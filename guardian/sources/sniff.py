"""What a file given as a metrics log looks like, from its first bytes (empty, binary, verl console log, JSON
without ``step``, text). Pure: ``sniff`` only classifies; reading the sample is the caller's (``read_sample``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import orjson

from guardian.regular_files import open_regular
from guardian.sources.console import parse_console_line
from guardian.sources.jsonl import BadLine

SAMPLE_BYTES = 1 << 20  # the head of the file that is looked at
# text with more undecodable characters than this share is not a log: binary
BINARY_SHARE = 0.05


class TraceKind(StrEnum):
    EMPTY = "empty"
    BINARY = "binary"
    METRICS_JSONL = "metrics_jsonl"  # JSON objects with a "step": what verl's file logger writes
    CONSOLE = "console"  # verl console "step:N - k:v" lines (a captured stdout log)
    JSON_WITHOUT_STEP = "json_without_step"
    NOT_JSON = "not_json"


@dataclass(frozen=True, slots=True)
class TraceShape:
    """The sample's kind and the counts behind it (non-blank lines of the sample)."""

    kind: TraceKind
    lines: int = 0
    json_objects: int = 0
    step_objects: int = 0
    console_steps: int = 0
    truncated: bool = False  # only the head of a larger file was looked at

    def describe(self) -> str:
        where = f" in its first {SAMPLE_BYTES >> 20} MiB" if self.truncated else ""
        lines = f"{self.lines} line{'s' if self.lines != 1 else ''}{where}"
        return {
            TraceKind.EMPTY: "empty" if not self.lines else "only blank lines",
            TraceKind.BINARY: "binary data, not text",
            TraceKind.METRICS_JSONL: f"{lines}, {self.step_objects} of them JSON objects with a 'step'",
            TraceKind.CONSOLE: f"a verl console log: {lines}, {self.console_steps} 'step:N - ...' line(s)",
            TraceKind.JSON_WITHOUT_STEP: f"{lines}, {self.json_objects} JSON object(s), none with a 'step'",
            TraceKind.NOT_JSON: f"{lines}, none of them JSON",
        }[self.kind]


def _console_step_line(row: bytes) -> bool:
    """Whether ``row`` is a console ``step:N - ...`` line (one whose step is out of range is one too: a bad line)."""
    try:
        return parse_console_line(row.decode("utf-8", errors="replace")) is not None
    except BadLine:
        return True


def sniff(sample: bytes, *, truncated: bool = False) -> TraceShape:
    """Classify the first bytes of a file (``truncated``: the file goes on after them)."""
    if not sample.strip():
        return TraceShape(TraceKind.EMPTY, lines=sample.count(b"\n"))
    text = sample.decode("utf-8", errors="replace")
    if b"\x00" in sample or text.count("\ufffd") > BINARY_SHARE * len(text):
        return TraceShape(TraceKind.BINARY, truncated=truncated)
    rows = [line for line in sample.splitlines() if line.strip()]
    if truncated and not sample.endswith(b"\n") and len(rows) > 1:
        rows.pop()  # cut mid-line by the sample
    json_objects = step_objects = console_steps = 0
    for row in rows:
        try:
            value = orjson.loads(row)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            json_objects += 1
            step_objects += "step" in value
        elif _console_step_line(row):
            console_steps += 1
    if step_objects:
        kind = TraceKind.METRICS_JSONL
    elif console_steps:
        kind = TraceKind.CONSOLE
    elif json_objects:
        kind = TraceKind.JSON_WITHOUT_STEP
    else:
        kind = TraceKind.NOT_JSON
    return TraceShape(kind, len(rows), json_objects, step_objects, console_steps, truncated)


def read_sample(path: Path) -> tuple[bytes, bool]:
    """The first ``SAMPLE_BYTES`` of ``path``, and whether the file is longer (a regular file only: a FIFO or a
    device put at the path is ``NotRegularFile``, never read or waited on)."""
    with open_regular(path) as handle:
        sample = handle.read(SAMPLE_BYTES + 1)
    return sample[:SAMPLE_BYTES], len(sample) > SAMPLE_BYTES
