"""Write the dashboards to ``DIR/<uid>.json``, or check that the files there are current.

``render`` is deterministic (the builders' key order, two-space indent, one trailing newline), so ``check`` compares
bytes (tests/integration/test_dashboards.py). Writes are atomic (``guardian.atomic``): Grafana's file provisioner
never reads a half-written dashboard.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from guardian.atomic import for_others, write_atomically
from guardian.dashboards.panels import Json
from guardian.dashboards.training import training_dashboard
from guardian.logs import event, get_logger

log = get_logger("dashboards")

DEFAULT_DIR: Final = Path("dashboards")
# Every dashboard the guardian ships, by builder. A new dashboard is one more entry here.
BUILDERS: Final[tuple[Callable[[], Json], ...]] = (training_dashboard,)
# Grafana accepts uids of up to 40 characters; keep them to what is safe in a URL and a file name.
_UID: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def dashboards() -> list[Json]:
    """Every dashboard, freshly built (uids checked: valid and unique, since they name the files)."""
    built = [build() for build in BUILDERS]
    uids = [str(d.get("uid", "")) for d in built]
    for uid in uids:
        if not _UID.fullmatch(uid):
            raise ValueError(f"dashboard uid {uid!r} must match {_UID.pattern}")
    if len(set(uids)) != len(uids):
        raise ValueError(f"dashboard uids repeat: {uids}")
    return built


def render(dashboard: Mapping[str, Any]) -> bytes:
    """The file content of one dashboard: stable key order, indent 2, a trailing newline."""
    return (json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n").encode()


def file_name(dashboard: Mapping[str, Any]) -> str:
    """``<uid>.json``."""
    return f"{dashboard['uid']}.json"


def expected(directory: Path) -> dict[Path, bytes]:
    """Each dashboard's path under ``directory`` and the bytes it should hold."""
    return {directory / file_name(d): render(d) for d in dashboards()}


def export_all(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write every dashboard to ``directory/<uid>.json`` (creating the folder), readable by others (Grafana's
    provisioner often reads them as another user: 0644 under the usual umask); returns the paths whose content or
    mode changed (an owner-only file an earlier export left is made readable). Files of other names are left alone."""
    directory.mkdir(parents=True, exist_ok=True)
    changed: list[Path] = []
    shared = for_others()
    for path, data in expected(directory).items():
        if _read(path) == data and stat.S_IMODE(path.stat().st_mode) == shared:
            continue
        write_atomically(path, data, mode=shared)
        changed.append(path)
        log.info(event("dashboard_written", {"path": path}))
    return changed


def check(directory: Path = DEFAULT_DIR) -> list[Path]:
    """The dashboard files under ``directory`` that are missing or differ from what the code builds
    (empty: all current). Writes nothing."""
    return [path for path, data in expected(directory).items() if _read(path) != data]


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
