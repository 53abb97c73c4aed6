"""The optional extras: each place that uses one says, in one line, which extra to install when its package is
missing (simulated here by ``sys.modules[name] = None``), and pyproject.toml's extras are the ones named."""

from __future__ import annotations

import logging
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from guardian import extras
from guardian.cli import main
from guardian.commands.doctor import diagnose
from guardian.config import ConfigError, GrafanaConfig, GuardianConfig, NotifyConfig, WandbConfig
from guardian.extras import EXTRAS, MissingExtra, install_line, need
from guardian.notify.notifiers import NotifyError
from guardian.notify.setup import check_sinks
from guardian.notify.wandb_alert import WandbNotifier
from guardian.rescue.ray_jobs import RayJobsError, connect
from guardian.store import StoreError
from guardian.store.engine import open_engine

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def hide(monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    """Make the modules of ``extra`` fail to import, as in a core-only install."""
    for module in EXTRAS[extra].modules:
        monkeypatch.setitem(sys.modules, module, None)


def one_line_naming(text: str, extra: str) -> None:
    assert install_line(extra) in text, text
    assert "\n" not in text.strip() and "Traceback" not in text, text


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_need_names_the_extra_when_its_package_is_missing(monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    hide(monkeypatch, extra)
    assert not extras.installed(extra)
    with pytest.raises(MissingExtra) as raised:
        need(extra, "this setting")
    assert str(raised.value).startswith(f"this setting needs {EXTRAS[extra].what}")
    one_line_naming(str(raised.value), extra)


def test_a_postgresql_store_url_without_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "postgres")
    for url in ("postgresql+psycopg://me:s3cret@db.example/guardian", "postgresql://me:s3cret@db.example/guardian"):
        with pytest.raises(StoreError) as raised:
            open_engine(url)
        message = str(raised.value)
        assert message.startswith("the store URL postgresql") and "PostgreSQL driver (psycopg)" in message
        assert "s3cret" not in message
        one_line_naming(message, "postgres")


def test_grafana_url_without_the_client_refuses_at_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hide(monkeypatch, "grafana")
    config = GuardianConfig(home=tmp_path, grafana=GrafanaConfig(url="http://127.0.0.1:3000"))
    with pytest.raises(ConfigError) as raised:
        check_sinks(config, {"GRAFANA_TOKEN": "glsa_x"})
    assert str(raised.value).startswith("grafana.url needs the Grafana client")
    one_line_naming(str(raised.value), "grafana")


def test_dashboards_push_without_the_client(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    hide(monkeypatch, "grafana")
    with caplog.at_level(logging.ERROR):
        assert main(["dashboards", "push", "--url", "http://127.0.0.1:3000"]) == 1
    err = capsys.readouterr().err
    assert "event=dashboards_push_failed" in err and "guardian dashboards push needs the Grafana client" in err
    one_line_naming(err, "grafana")


def test_doctor_says_which_extra_grafana_url_needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hide(monkeypatch, "grafana")
    config = tmp_path / "guardian.yaml"
    config.write_text(f"home: {tmp_path / 'home'}\ngrafana:\n  url: http://127.0.0.1:3000\n")
    checks = {check.name: check for check in diagnose(str(config))}
    assert checks["grafana"].status == "error"
    one_line_naming(checks["grafana"].detail, "grafana")


def test_the_wandb_notifier_without_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hide(monkeypatch, "wandb")
    config = GuardianConfig(home=tmp_path, notify=NotifyConfig(wandb=WandbConfig(enabled=True)))
    with pytest.raises(ConfigError) as raised:  # guardian run refuses before it starts anything
        check_sinks(config, {})
    assert str(raised.value).startswith("notify.wandb.enabled needs the wandb package")
    one_line_naming(str(raised.value), "wandb")
    notifier = WandbNotifier("p", entity=None, run_name="r", mode="offline", wait_duration_s=0.0, directory=tmp_path)
    with pytest.raises(NotifyError, match=r"pip install 'verl-guardian\[wandb\]'") as failed:  # and if it got there
        notifier._start()
    assert not failed.value.retryable


def test_ray_address_without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "ray")
    with pytest.raises(RayJobsError) as raised:
        connect("http://127.0.0.1:8265", timeout_s=1.0)
    assert str(raised.value).startswith("--ray-address needs Ray with its Jobs API")
    one_line_naming(str(raised.value), "ray")


def test_the_extras_are_pyprojects_and_the_core_needs_none_of_them() -> None:
    optional = PROJECT["optional-dependencies"]
    assert set(EXTRAS) <= set(optional)
    core = {Requirement(spec).name for spec in PROJECT["dependencies"]}
    for extra in EXTRAS:
        assert not core & {Requirement(spec).name for spec in optional[extra]}, extra
    (everything,) = optional["all"]
    assert set(Requirement(everything).extras) == set(optional) - {"all", "dev"}
    assert "verl-guardian[all]" in optional["dev"]  # the tests run every extra
