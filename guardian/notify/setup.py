"""Build a run's dispatcher from guardian.yaml (``notify``, ``grafana``). Secrets are read from the environment
or files by ``webhook_url`` and ``grafana.load_token`` only, and go straight into a client that never prints them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from guardian.config import ConfigError, GrafanaConfig, GuardianConfig, WebhookConfig
from guardian.extras import MissingExtra, need
from guardian.notify.annotations import GrafanaAnnotations
from guardian.notify.compose import Alert, compose
from guardian.notify.dispatcher import Dispatcher, DispatchPolicy, Sink, dispatching
from guardian.notify.events import GuardianEvent, Level
from guardian.notify.notifiers import LogNotifier, Notifier, WebhookNotifier
from guardian.notify.wandb_alert import WandbNotifier
from guardian.store import Store
from guardian.store.deliveries import DeliveryView

DEFAULT_WANDB_PROJECT = "verl-guardian"


@dataclass
class NotifierSink:
    """A notifier behind the dispatcher: routing by level, the per-check cooldown, the alert text."""

    notifier: Notifier
    min_level: Level
    cooldown_s: float

    @property
    def name(self) -> str:
        return self.notifier.name

    def wants(self, event: GuardianEvent) -> bool:
        return event.level >= self.min_level

    def deliver(self, event: GuardianEvent, earlier: Mapping[str, DeliveryView]) -> str | None:
        self.notifier.send(compose(event))
        return None

    def announce(self, alert: Alert) -> None:
        """Send an alert that has no stored event (see ``Dispatcher.announce``), if its level is routed here."""
        if alert.level >= self.min_level:
            self.notifier.send(alert)

    def close(self) -> None:
        self.notifier.close()


def _level(name: str) -> Level:
    return Level[name.upper()]


def webhook_url(cfg: WebhookConfig, env: Mapping[str, str]) -> str:
    """The webhook's URL from its environment variable or file; ConfigError names where it looked."""
    if cfg.url_env is not None:
        url = env.get(cfg.url_env, "").strip()
        where = f"environment variable {cfg.url_env}"
    else:
        assert cfg.url_file is not None
        try:
            url = Path(cfg.url_file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"notify.webhooks[{cfg.name}]: cannot read url_file {cfg.url_file}: {exc.strerror}"
            ) from None
        where = f"file {cfg.url_file}"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"notify.webhooks[{cfg.name}]: {where} must hold an http(s) URL")
    return url


def annotations_sink(cfg: GrafanaConfig, env: Mapping[str, str]) -> GrafanaAnnotations | None:
    """The Grafana sink when ``grafana.url`` is set; the token is read now (a missing token fails at
    start), the connection is made on the first annotation."""
    if cfg.url is None:
        return None
    _need("grafana", "grafana.url")
    from guardian.dashboards import grafana  # its HTTP client (~10 MB) loads only when Grafana is configured

    try:
        token = grafana.load_token(cfg.token_file, env)
    except grafana.GrafanaError as exc:
        raise ConfigError(f"grafana: {exc}") from None
    connect = partial(grafana.connect, cfg.url, token, timeout_s=cfg.timeout_s)
    return GrafanaAnnotations(connect, dashboard_uid=cfg.dashboard_uid)


def sink_names(config: GuardianConfig) -> list[str]:
    """The names the configured sinks deliver under (and the exporter counts)."""
    names = ["log", *(hook.name for hook in config.notify.webhooks)]
    names += ["wandb"] if config.notify.wandb.enabled else []
    return names + (["grafana"] if config.grafana.url is not None else [])


def check_sinks(config: GuardianConfig, env: Mapping[str, str]) -> None:
    """Raise the ConfigError that ``build_sinks`` would (a webhook URL or the Grafana token missing or unusable, the
    package of a configured notifier not installed) without building anything: ``guardian run`` refuses before it
    touches the disk or launches a trainer."""
    for hook in config.notify.webhooks:
        _webhook(hook, env)
    if config.notify.wandb.enabled:
        _need("wandb", "notify.wandb.enabled")
    annotations_sink(config.grafana, env)


def _need(extra: str, setting: str) -> None:
    """A ConfigError naming the extra to install when ``setting`` asks for a package that is not installed."""
    try:
        need(extra, setting)
    except MissingExtra as exc:
        raise ConfigError(str(exc)) from None


def _webhook(hook: WebhookConfig, env: Mapping[str, str]) -> WebhookNotifier:
    try:
        return WebhookNotifier(webhook_url(hook, env), timeout_s=hook.timeout_s, name=hook.name)
    except ValueError as exc:  # the URL itself is unusable (its message never repeats the secret part)
        raise ConfigError(f"notify.webhooks[{hook.name}]: {exc}") from None


def build_sinks(config: GuardianConfig, store: Store, run_id: str, env: Mapping[str, str]) -> list[Sink]:
    notify = config.notify
    sinks: list[Sink] = [NotifierSink(LogNotifier(), _level(notify.log_level), 0.0)]
    for hook in notify.webhooks:
        sinks.append(NotifierSink(_webhook(hook, env), _level(hook.min_level), notify.cooldown_s))
    if notify.wandb.enabled:
        run = store.get_run(run_id)
        project = notify.wandb.project or (run.override("trainer.project_name") if run else None)
        wandb = WandbNotifier(
            project or DEFAULT_WANDB_PROJECT,
            entity=notify.wandb.entity,
            run_name=f"guardian-{run_id}",
            mode=notify.wandb.mode,
            wait_duration_s=notify.wandb.wait_duration_s,
            directory=config.home.resolve(),
        )
        sinks.append(NotifierSink(wandb, _level(notify.wandb.min_level), notify.cooldown_s))
    grafana_sink = annotations_sink(config.grafana, env)
    if grafana_sink is not None:
        sinks.append(grafana_sink)
    return sinks


@contextmanager
def notifying(
    config: GuardianConfig, store: Store, run_id: str, clock: Callable[[], float], env: Mapping[str, str]
) -> Iterator[Dispatcher]:
    """Deliver the run's events in the background while the block runs (and flush them at its end)."""
    policy = DispatchPolicy(
        max_age_s=config.notify.max_age_s,
        retries=config.notify.retries,
        interval_s=config.notify.interval_s,
        reread_s=config.store.reread_s,
    )
    dispatcher = Dispatcher(store, run_id, build_sinks(config, store, run_id, env), policy, clock)
    with dispatching(dispatcher):
        yield dispatcher
