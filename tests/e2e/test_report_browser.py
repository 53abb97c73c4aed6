"""``guardian report`` in a real headless browser (Debian's chromium; .ci/run installs it, CI fails without it):
the reports of a real guarded run - ``guardian demo``'s entropy collapse, stopped, rolled back, patched, resumed
and resolved end to end - open with the network off, ask for nothing, log nothing to the console, and show
their plots and tables. A control page first proves the two instruments (console and network log) see trouble.

``REPORT_SHOT=/path.png`` keeps a copy of the incident report's screenshot to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest
from conftest import required_tool

from guardian.cli import EXIT_OK, main

# no network at all: every name resolves to nothing, every request goes to a proxy that is not there
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9")
FLAGS = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--enable-logging=stderr",
    "--v=0",
    *OFFLINE,
)
PNG = b"\x89PNG\r\n\x1a\n"
CONTROL = """<!DOCTYPE html><html><body><img src="http://report.invalid/x.png">
<script>throw new Error("control page")</script></body></html>"""


class Dom(HTMLParser):
    """A page's elements (attributes by tag) and its text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, css: str | None = None) -> list[dict[str, str]]:
        """The attributes of each ``tag`` element (of CSS class list ``css``, when given)."""
        return [a for t, a in self.elements if t == tag and (css is None or a.get("class") == css)]


@dataclass(frozen=True)
class Visit:
    dom: str
    console: list[str]  # the page's console lines (errors, uncaught exceptions, CSP refusals)
    requests: list[str]  # the URLs the page itself asked the network for


def page_requests(netlog: Path) -> list[str]:
    """The URLs requested on the page's behalf: their network isolation key is the file:// page's (the browser's
    own background requests carry other keys)."""
    events = orjson.loads(netlog.read_bytes())["events"]
    return [
        str(p["url"])
        for e in events
        if "url" in (p := e.get("params", {})) and p.get("method") and "file://" in str(p.get("network_isolation_key"))
    ]


def visit(chromium: str, page: Path, work: Path, *extra: str) -> Visit:
    netlog = work / f"{page.stem}.netlog.json"
    done = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--log-net-log={netlog}", *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return Visit(done.stdout, console, page_requests(netlog))


@pytest.fixture(scope="module")
def chromium() -> str:
    return required_tool("chromium", "chromium")


@pytest.fixture(scope="module")
def reports(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The incident report and the run report of a real ``guardian demo`` (entropy collapse, guarded end to end);
    no demo runs where there is no browser to look at them."""
    home = tmp_path_factory.mktemp("demo-home")
    env = {**os.environ, "GUARDIAN_HOME": str(home)}
    env.pop("GUARDIAN_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "guardian", "--log-level", "ERROR", "demo", "--json"],
        env=env,
        cwd=home,
        capture_output=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    story = orjson.loads(done.stdout)
    (incident,) = story["incidents"]
    assert incident["status"] == "resolved"
    out = tmp_path_factory.mktemp("reports")
    incident_page, run_page = out / "incident.html", out / "run.html"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GUARDIAN_HOME", str(home))
        patch.delenv("GUARDIAN_DB_URL", raising=False)
        for target, argv in ((incident_page, [str(incident["id"])]), (run_page, ["--run", story["run"]])):
            assert main(["--log-level", "ERROR", "report", *argv, "-o", str(target)]) == EXIT_OK
    return incident_page, run_page


def test_the_instruments_see_a_console_error_and_a_network_request(chromium: str, tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    control.write_text(CONTROL)
    seen = visit(chromium, control, tmp_path, "--dump-dom")
    assert any("Uncaught Error: control page" in line for line in seen.console)
    assert "http://report.invalid/x.png" in seen.requests


@pytest.mark.parametrize("which", ["incident", "run"])
def test_the_report_opens_offline_and_shows_its_plots_and_tables(
    chromium: str, reports: tuple[Path, Path], tmp_path: Path, which: str
) -> None:
    report = reports[0] if which == "incident" else reports[1]
    source = Dom(report.read_text())
    for tag, attrs in source.elements:  # nothing to fetch: no link, no image, no script, no CSS url()
        assert tag not in ("script", "link", "img", "iframe", "object"), tag
        assert not {"src", "href", "srcset", "xlink:href"} & attrs.keys(), (tag, attrs)
    assert "url(" not in report.read_text() and "@import" not in report.read_text()

    seen = visit(chromium, report, tmp_path, "--dump-dom")
    assert seen.console == [] and seen.requests == []
    dom = Dom(seen.dom)
    plots = dom.having("svg", "plot")
    assert [p["data-signal"] for p in plots] == [
        "entropy",
        "egr",
        "kl",
        "log_ppl",
        "reward",
        "val_score",
        "length_mean",
    ]
    states = {p["data-signal"]: p["data-state"] for p in plots}
    assert states["kl"] == "not-logged" and states["entropy"] == states["reward"] == "drawn"  # the demo has no KL
    assert "not logged" in dom.text  # KL's plot says so
    assert dom.having("polyline", "abandoned") and dom.having("polyline", "kept")
    for kind in ("onset", "detection", "rollback", "resume"):
        assert dom.having("g", f"marker {kind}"), kind
    for table in ("timeline", "diff", "lineage", "cost", "trajectories"):
        assert dom.having("table", table), table
    assert len(dom.having("tr")) > 100  # 100 trajectories and the other tables' rows
    assert "actor_rollout_ref.actor.entropy_coeff" in dom.text


def test_the_screenshot_shows_the_page(chromium: str, reports: tuple[Path, Path], tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    seen = visit(chromium, reports[0], tmp_path, f"--screenshot={shot}", "--window-size=1280,2400", "--hide-scrollbars")
    assert seen.console == [] and seen.requests == []
    data = shot.read_bytes()
    assert data.startswith(PNG) and len(data) > 100_000  # a blank page of this size compresses to a few kB
    if keep := os.environ.get("REPORT_SHOT"):
        shutil.copyfile(shot, keep)
