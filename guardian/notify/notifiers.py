"""Where alerts go: the log and webhooks (Slack-compatible); W&B alerts are in wandb_alert.py.

A notifier sends one ``Alert`` or raises ``NotifyError``; routing, cooldowns and retries are the dispatcher's,
which calls notifiers from its own thread (``send`` may block). A webhook URL is a secret: errors and ``repr``
show ``scheme://host/…`` only."""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import urlsplit

import orjson

from guardian.faults import is_outage, transient_status
from guardian.logs import event, get_logger
from guardian.notify.compose import Alert, truncate
from guardian.notify.events import Level

if TYPE_CHECKING:
    from collections.abc import Mapping

log = get_logger("notify")

_LOG_LEVELS: Final[Mapping[Level, int]] = {
    Level.INFO: logging.INFO,
    Level.WARNING: logging.WARNING,
    Level.CRITICAL: logging.ERROR,
}
_BODY_SHOWN: Final = 100  # characters of an error response shown in NotifyError


class NotifyError(RuntimeError):
    """A notifier could not deliver an alert (the message never holds a secret). ``retryable`` says whether
    trying again can help: the rule of ``guardian.faults``, applied by the notifier to the error it wraps
    (a webhook's is not chained, ``from None``: its text could hold the URL's token)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class Notifier(Protocol):
    """Delivers alerts to one destination."""

    name: str

    def send(self, alert: Alert) -> None:
        """Deliver ``alert``, or raise ``NotifyError``."""

    def close(self) -> None:
        """Release what the notifier holds (idempotent)."""


# ---------------------------------------------------------------------------------------------- log


class LogNotifier:
    """One ``event=alert ...`` line per alert, at INFO, WARNING or ERROR by the alert's level."""

    def __init__(self, *, name: str = "log", logger: logging.Logger | None = None) -> None:
        self.name = name
        self._log = logger or log

    def send(self, alert: Alert) -> None:
        fields: dict[str, object] = {
            "key": alert.key,
            "run": alert.run_id,
            "check": alert.check,
            "level": alert.level.label,
            "title": alert.title,
        }
        fields.update({k: v for k, v in alert.fields.items() if k not in ("run", "check")})
        self._log.log(_LOG_LEVELS[alert.level], event("alert", fields))

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"LogNotifier(name={self.name!r})"


# ------------------------------------------------------------------------------------------ webhook


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: a URL with its credentials, path and query left out."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<invalid url>"
    return f"{parts.scheme or '?'}://{host}{port}/…"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: urllib would follow a 302 with a GET and drop the alert."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebhookNotifier:
    """POSTs each alert as JSON a Slack incoming webhook accepts and any receiver can parse (stdlib only)::

        {"text": "<title>\\n<text>",                   # Slack: the message (and the notification fallback)
         "blocks": [{"type": "header", ...}, {"type": "section", "text": {"type": "mrkdwn", ...}}],
         "guardian": {"key": ..., "run_id": ..., "check": ..., "level": ..., "title": ..., "text": ...,
                      "fields": {...}}}                # the alert as data, unescaped; Slack ignores it

    ``text`` and ``blocks`` escape ``&``, ``<`` and ``>`` as Slack requires; ``guardian`` holds the raw strings."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, name: str = "webhook") -> None:
        shown = redact_url(url)
        parts = urlsplit(url) if shown != "<invalid url>" else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook {name}: need an http(s) URL with a host, got {shown}")
        if "@" in parts.netloc:  # urllib would not send them as basic auth, and errors would echo them
            raise ValueError(f"webhook {name}: credentials in the URL are not supported ({shown})")
        if timeout_s <= 0:
            raise ValueError(f"webhook {name}: timeout_s must be positive, got {timeout_s}")
        self.name = name
        self.timeout_s = timeout_s
        self._url = url
        self._shown = shown
        # path segments of the URL (tokens, for Slack), scrubbed from anything an error repeats
        self._secrets = sorted({s for s in [parts.path, parts.query, *parts.path.split("/")] if len(s) >= 6}, key=len)
        self._opener = urllib.request.build_opener(_NoRedirect())

    @property
    def url(self) -> str:
        """The URL as shown in logs: ``scheme://host/…``."""
        return self._shown

    def __repr__(self) -> str:
        return f"WebhookNotifier(name={self.name!r}, url={self._shown!r}, timeout_s={self.timeout_s})"

    def payload(self, alert: Alert) -> dict[str, object]:
        """The JSON document sent for ``alert``."""
        return {
            "text": _slack_escape(f"{alert.title}\n{alert.text}"),
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": truncate(alert.title, 150)}},
                {"type": "section", "text": {"type": "mrkdwn", "text": _slack_escape(truncate(alert.text, 3000))}},
            ],
            "guardian": {
                "key": alert.key,
                "run_id": alert.run_id,
                "check": alert.check,
                "level": alert.level.label,
                "title": alert.title,
                "text": alert.text,
                "fields": dict(alert.fields),
            },
        }

    def send(self, alert: Alert) -> None:
        request = urllib.request.Request(
            self._url,
            data=orjson.dumps(self.payload(alert)),
            headers={"Content-Type": "application/json", "User-Agent": "verl-guardian"},
            method="POST",
        )
        where = f"webhook {self.name} ({self._shown})"
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                status = response.status
                response.read(4096)
        except urllib.error.HTTPError as exc:
            body = self._scrub(_read_some(exc))
            detail = f": {body}" if body else ""
            raise NotifyError(
                f"{where} answered HTTP {exc.code} {self._scrub(str(exc.reason))}{detail}",
                retryable=transient_status(exc.code),
            ) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise NotifyError(f"{where}: no answer within {self.timeout_s:g}s") from None
            raise NotifyError(
                f"{where}: cannot deliver: {self._scrub(str(exc.reason))}", retryable=is_outage(exc)
            ) from None
        except TimeoutError:
            raise NotifyError(f"{where}: no answer within {self.timeout_s:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise NotifyError(
                f"{where}: cannot deliver: {type(exc).__name__}: {self._scrub(str(exc))}", retryable=is_outage(exc)
            ) from None
        if not 200 <= status < 300:  # a redirect (not followed) or another non-success answer
            raise NotifyError(f"{where} answered HTTP {status}", retryable=transient_status(status))

    def close(self) -> None:
        return None

    def _scrub(self, text: str) -> str:
        text = text.replace(self._url, self._shown)
        for secret in reversed(self._secrets):
            text = text.replace(secret, "…")
        return truncate(" ".join(text.split()), _BODY_SHOWN)


def _read_some(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(1024).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException, ValueError):
        return ""
    finally:
        exc.close()


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -------------------------------------------------------------------------------------------- wandb
