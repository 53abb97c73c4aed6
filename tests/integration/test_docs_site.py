"""The docs: the site builds with ``mkdocs build --strict`` (no broken link or anchor between pages), the README's
links resolve, and the metric table of docs/observability.md is the exporter's families, names, types and labels."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify
from prometheus_client.core import Metric

from guardian import keys
from guardian.core import Severity
from guardian.sinks.prometheus import INTERVENTION_OUTCOMES, build_registry
from guardian.sinks.snapshot import RunSnapshot

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OBSERVABILITY = ROOT / "docs" / "observability.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROW = re.compile(r"^\| `(guardian_[a-z_]+)(?:\{([a-z_,]+)\})?` \| (gauge|counter|info) \|", re.M)


def test_the_site_builds_strict_without_warnings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "observability" / "index.html").is_file()


def headings(page: Path) -> set[str]:
    """The anchors mkdocs gives a page's headings (Python-Markdown's toc slugs; code spans lose their backticks)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slugify(h.replace("`", ""), "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for command in ("make demo", "make test"):  # the two set-up commands of a fresh clone
        assert command in text and f"\n{command.split()[1]}:" in (ROOT / "Makefile").read_text()
    targets = [t for t in LINK.findall(text) if not t.startswith(("http://", "https://"))]
    assert any(t.startswith("docs/") for t in targets)
    for target in targets:
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:
            assert anchor in headings(ROOT / path), target


def every_family() -> list[Metric]:
    """What the exporter builds for a snapshot in which every family has a series."""
    run = RunSnapshot(
        run_id="run-a",
        experiment="exp",
        attempt=1,
        mode="enforce",
        step=10,
        last_step_age_seconds=1.0,
        signals=dict.fromkeys(keys.PROM_SIGNAL_METRICS, 1.0),
        checks={"entropy_collapse": Severity.WARN},
        reward_components={"format": 0.5},
        incidents_opened={"entropy_collapse": 1},
        open_incidents={"entropy_collapse": Severity.WARN},
        interventions_finished=dict.fromkeys(INTERVENTION_OUTCOMES, 1),
        intervention_in_progress=True,
        notifications={("webhook", "sent"): 1},
        last_poll_success=True,
        last_poll_success_at=1_764_000_000.0,
        tick_seconds=0.01,
        pinned_checkpoints=1,
        pinned_bytes=0,
    )

    class Source:
        def snapshot(self) -> list[RunSnapshot]:
            return [run]

    return list(build_registry(Source()).collect())


def test_the_metric_table_is_the_exporters_families() -> None:
    documented = {
        name: (kind, set(filter(None, labels.split(","))))
        for name, labels, kind in ROW.findall(OBSERVABILITY.read_text())
    }
    exported: dict[str, tuple[str, set[str]]] = {}
    for family in every_family():
        for sample in family.samples:
            extra = set(sample.labels) - {keys.PROM_LABEL_RUN_ID, keys.PROM_LABEL_EXPERIMENT}
            exported[sample.name] = (family.type, extra)
    assert set(exported) == keys.PROM_METRIC_NAMES  # the snapshot above fills every family
    undocumented = sorted(set(exported) - set(documented))
    not_exported = sorted(set(documented) - set(exported))
    assert not undocumented and not not_exported, f"undocumented: {undocumented}, not exported: {not_exported}"
    assert documented == exported
