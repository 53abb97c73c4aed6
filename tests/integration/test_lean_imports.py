"""What a guardian loads only when it needs it: Alembic when an older store's schema is behind, the Grafana client when
Grafana is configured (each ~10 MB of a guardian's memory), hydra when an override is parsed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from postgres_server import database_at

from guardian.store import Store, head_revision
from guardian.store.engine import SCHEMA_HEAD


def _loaded_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running ``code``."""
    script = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_the_schema_head_constant_is_the_newest_migration() -> None:
    assert head_revision() == SCHEMA_HEAD


def test_only_an_older_store_loads_alembic(tmp_path: Path) -> None:
    new, old = (f"sqlite:///{tmp_path / name}" for name in ("new.db", "old.db"))
    opening = "from guardian.store import Store\nStore.open({!r}).close()"
    assert "alembic" not in _loaded_after(opening.format(new))  # a new database: created at the head
    assert "alembic" not in _loaded_after(opening.format(new))  # at the head: nothing to do
    database_at(old, "0005", [])
    assert "alembic" in _loaded_after(opening.format(old))  # an older release's store: migrated
    for url in (new, old):
        with Store.open(url) as store:
            assert store.schema_version() == SCHEMA_HEAD


def test_the_sinks_of_a_config_without_grafana_load_no_grafana_client(tmp_path: Path) -> None:
    code = (
        "from guardian.config import GuardianConfig\nfrom guardian.notify.setup import check_sinks\n"
        "check_sinks(GuardianConfig(), {})"
    )
    loaded = _loaded_after(code)
    assert "niquests" not in loaded and "grafana_client" not in loaded


def test_the_cli_starts_without_hydra() -> None:
    code = "import sys, guardian.cli, guardian.overrides; assert 'hydra' not in sys.modules, 'hydra imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_compose_check_of_a_patch_leaves_hydra_out_of_the_guardian() -> None:
    code = (
        "from guardian.verl_keys import compose_check\n"
        "assert compose_check(['actor_rollout_ref.actor.optim.lr=1e-5']).startswith('composed')"
    )
    loaded = _loaded_after(code)
    assert "hydra" not in loaded and "omegaconf" not in loaded
