"""``guardian doctor``: what the guardian can use on this machine, and what is missing."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from guardian.config import ConfigError, GuardianConfig
from guardian.extras import install_line, installed
from guardian.home import locate
from guardian.store import Store, StoreError, head_revision

OPTIONAL_PACKAGES = {
    "verl": "validate overrides against verl's own Hydra config (remediation)",
    "psycopg": f"a PostgreSQL store: {install_line('postgres')}",
    "grafana-client": f"dashboards push, Grafana annotations: {install_line('grafana')}",
    "wandb": f"wandb.alert notifier: {install_line('wandb')}",
    "ray": f"guard Ray Jobs: {install_line('ray')}",
}
OPTIONAL_TOOLS = {
    "promtool": "check alert rules",
    "amtool": "check the Alertmanager example",
    "nvidia-smi": "confirm GPUs are free after a stop",
}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok | missing | error
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


def diagnose(config_path: str | None) -> list[Check]:
    report = [Check("python", "ok" if sys.version_info >= (3, 11) else "error", platform.python_version())]
    try:
        located = locate(config_path)
    except ConfigError as exc:
        return [*report, Check("config", "error", str(exc))]
    config = located.config
    report.append(Check("config", "ok", str(located.file or "built-in defaults")))
    report.append(Check("home", "ok", f"{located.home.path} ({located.home.why})"))
    report.append(_store_check(config, located.missing_store()))
    report.extend(_notify_checks(config, os.environ))
    for package, purpose in OPTIONAL_PACKAGES.items():
        try:
            report.append(Check(package, "ok", importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            report.append(Check(package, "missing", f"optional: {purpose}"))
    for tool, purpose in OPTIONAL_TOOLS.items():
        found = shutil.which(tool)
        report.append(Check(tool, "ok" if found else "missing", found or f"optional: {purpose}"))
    return report


def _store_check(config: GuardianConfig, missing: str | None) -> Check:
    """The store opens at the newest schema; a SQLite store that is not there yet is said, never created."""
    if missing is not None:
        return Check("store", "missing", f"{missing} (guardian run, watch or demo creates it)")
    try:
        with Store.open(
            config.database_url(),
            busy_timeout_s=config.store.busy_timeout_s,
            statement_timeout_s=config.store.statement_timeout_s,
        ) as store:
            version = store.schema_version()
            status = "ok" if version == head_revision() else "error"
            return Check("store", status, f"{store.url} schema {version} (head {head_revision()})")
    except StoreError as exc:
        return Check("store", "error", str(exc))


def _notify_checks(config: GuardianConfig, env: Mapping[str, str]) -> list[Check]:
    """Each configured webhook has its URL (nothing is sent), and Grafana answers with the token."""
    from guardian.notify.setup import webhook_url

    checks: list[Check] = []
    for hook in config.notify.webhooks:
        source = f"env {hook.url_env}" if hook.url_env else f"file {hook.url_file}"
        try:
            webhook_url(hook, env)
            checks.append(Check(f"webhook {hook.name}", "ok", f"URL from {source} (not sent to)"))
        except ConfigError as exc:
            checks.append(Check(f"webhook {hook.name}", "error", str(exc)))
    cfg = config.grafana
    if cfg.url is not None and not installed("grafana"):
        checks.append(Check("grafana", "error", f"grafana.url is set; the Grafana client: {install_line('grafana')}"))
    elif cfg.url is not None:
        from guardian.dashboards import grafana

        try:
            api = grafana.connect(cfg.url, grafana.load_token(cfg.token_file, env), timeout_s=cfg.timeout_s)
            try:
                checks.append(Check("grafana", "ok", f"Grafana {grafana.server_version(api)}"))
            finally:
                grafana.close(api)
        except grafana.GrafanaError as exc:
            checks.append(Check("grafana", "error", str(exc)))
    return checks
