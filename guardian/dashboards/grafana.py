"""Grafana side of the guardian: dashboards pushed into one folder, incidents drawn as annotations.

Grafana's legacy HTTP API (Grafana 10 to 13) via grafana-client 5.x. A thin library: no retries (see
``GrafanaError.retryable``), no config parsing, no threads. Every failure is one ``GrafanaError`` saying what to do.
The token is held in a ``Secret``, revealed only while a header is set, and scrubbed from every error message.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import niquests
import niquests.auth
import niquests.exceptions
from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaException, GrafanaTimeoutError

from guardian.faults import is_outage, transient_status
from guardian.logs import event, get_logger

TOKEN_ENV = "GRAFANA_TOKEN"
_UID_MAX = 40  # Grafana's limit for dashboard and folder uids
_TAG_MAX = 100
_TAG_BAD = re.compile(r"[^A-Za-z0-9:._-]+")
_MIN_EPOCH_MS = 10**11  # 1973 in ms; anything smaller is almost surely epoch *seconds*

log = get_logger("grafana")


class Secret:
    """A token that cannot leak through repr, str, f-strings or logging; ``reveal()`` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__


class GrafanaError(RuntimeError):
    """A Grafana call failed. ``status`` is the HTTP status (None: no answer); ``retryable`` is True for
    timeouts, unreachable hosts, 5xx, 429 and 408, i.e. failures that a later attempt may not repeat (the rule
    of ``guardian.faults``: not a bad certificate or URL, nor another 4xx)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class PushResult:
    """Grafana's answer to one dashboard save; ``url`` is the path Grafana returns (``/d/<uid>/<slug>``)."""

    uid: str
    url: str
    version: int
    status: str


class _BearerAuth(niquests.auth.AuthBase):
    """Sets ``Authorization: Bearer`` per request, so the plain token lives in no long-lived attribute."""

    def __init__(self, token: Secret) -> None:
        self.token = token

    def __call__(self, r: niquests.PreparedRequest) -> niquests.PreparedRequest:
        if r.headers is not None:
            r.headers["Authorization"] = f"Bearer {self.token.reveal()}"
        return r

    def __repr__(self) -> str:
        return "_BearerAuth(***)"


def load_token(token_file: Path | None, env: Mapping[str, str]) -> Secret:
    """The service-account token from ``token_file`` if given (an explicit file never falls back to the
    environment, so a typo in its path is reported), else from ``$GRAFANA_TOKEN``."""
    if token_file is not None:
        token_file = token_file.expanduser()
        try:
            value = token_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise GrafanaError(f"Grafana token file {token_file} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise GrafanaError(f"cannot read Grafana token file {token_file}: {reason}") from None
        if not value:
            raise GrafanaError(f"Grafana token file {token_file} is empty; put the service-account token in it")
        source = f"token file {token_file}"
    else:
        value = env.get(TOKEN_ENV, "").strip()
        if not value:
            raise GrafanaError(f"no Grafana token: configure a token file or set {TOKEN_ENV}")
        source = TOKEN_ENV
    if any(c.isspace() for c in value):
        raise GrafanaError(f"Grafana {source} holds whitespace inside the token; it must hold the token only")
    return Secret(value)


def connect(url: str, token: Secret | str, *, timeout_s: float, org_id: int | None = None) -> GrafanaApi:
    """A client for ``url`` (no request is made; see ``server_version``). Close it with ``close``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GrafanaError(f"Grafana URL {_safe_url(url)!r} must be http:// or https:// with a host name")
    if parts.path and not parts.path.endswith("/"):
        # grafana-client glues the path prefix to "api" without a slash: /grafana -> /grafanaapi
        url = urlunsplit(parts._replace(path=parts.path + "/"))
    secret = token if isinstance(token, Secret) else Secret(token)
    api: GrafanaApi = GrafanaApi.from_url(url, credential=_BearerAuth(secret), timeout=timeout_s)
    if org_id is not None:
        api.client.organization_id = org_id
        api.client.s.headers["X-Grafana-Org-Id"] = str(org_id)
    return api


def close(api: GrafanaApi) -> None:
    """Close the client's connection pool."""
    api.client.s.close()


def server_version(api: GrafanaApi) -> str:
    """Grafana's version (``GET /api/frontend/settings``, as ``api.health.check`` reads it, but checked
    for a non-JSON answer); also proves the URL and the token work."""
    settings = _call(api, "read the Grafana version", "the organisation", api.client.GET, "/frontend/settings")
    return str((settings.get("buildInfo") or {}).get("version", "unknown")).split("-")[0]


def folder_uid(title: str) -> str:
    """A stable folder uid from its title: the slug, or slug + hash when the slug is long or empty."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    if slug and len(slug) <= _UID_MAX:
        return slug
    digest = hashlib.sha256(title.encode()).hexdigest()[:8]
    return f"{slug[: _UID_MAX - 9]}-{digest}" if slug else f"folder-{digest}"


def ensure_folder(api: GrafanaApi, title: str) -> str:
    """The uid of the folder ``title``, created if missing. A folder of that title made by hand (other
    uid) is found by title when Grafana refuses the create as a duplicate (409/412)."""
    uid = folder_uid(title)
    what = f"look up folder {title!r}"
    try:
        _call(api, what, f"folder {title!r}", api.folder.get_folder, uid)
        return uid
    except GrafanaError as exc:
        if exc.status != 404:
            raise
    what = f"create folder {title!r}"
    try:
        created = _call(api, what, "the organisation", api.folder.create_folder, title, uid=uid)
    except GrafanaError as exc:
        if exc.status not in (409, 412):
            raise
        folders = _call(api, "list folders", "the organisation", api.folder.get_all_folders)
        for folder in folders or []:
            if folder.get("title") == title:
                return str(folder["uid"])
        raise
    log.info(event("grafana_folder_created", {"title": title, "uid": created.get("uid", uid)}))
    return str(created.get("uid", uid))


def push_dashboards(
    api: GrafanaApi,
    dashboards: Sequence[Mapping[str, Any]],
    *,
    folder_title: str,
    message: str,
    overwrite: bool = True,
) -> list[PushResult]:
    """Save each dashboard into the folder ``folder_title`` (created if missing).

    Dashboards are matched by their ``uid`` (required), so pushing again updates them in place
    (version + 1) instead of adding copies; ``id`` is sent as null because ids differ between Grafana
    instances. ``folderUid`` is always sent: without it Grafana moves an existing dashboard to the
    root. ``overwrite=False`` makes Grafana refuse (412) a stale ``version`` or a title taken by
    another dashboard in the folder. Stops at the first failure.
    """
    uids = [d.get("uid") for d in dashboards]
    for d, uid in zip(dashboards, uids, strict=True):
        if not isinstance(uid, str) or not uid or len(uid) > _UID_MAX:
            raise ValueError(f"dashboard {d.get('title')!r} needs a uid of 1-{_UID_MAX} characters")
        if not isinstance(d.get("title"), str) or not d["title"]:
            raise ValueError(f"dashboard {uid!r} needs a title")
    if len(set(uids)) != len(uids):
        raise ValueError("dashboard uids must be unique within one push")
    folder = ensure_folder(api, folder_title)
    results: list[PushResult] = []
    for d in dashboards:
        body = {"dashboard": {**d, "id": None}, "folderUid": folder, "overwrite": overwrite, "message": message}
        what = f"push dashboard {d['uid']!r} to folder {folder_title!r}"
        answer = _call(api, what, f"folder {folder_title!r}", api.dashboard.update_dashboard, body)
        result = PushResult(
            uid=str(answer["uid"]), url=str(answer["url"]), version=int(answer["version"]), status=str(answer["status"])
        )
        log.info(event("grafana_dashboard_pushed", {"uid": result.uid, "version": result.version, "folder": folder}))
        results.append(result)
    return results


def tag(text: str) -> str:
    """``text`` as an annotation tag of ``[A-Za-z0-9:._-]`` (accents folded, other runs become ``_``):
    grafana-client puts tags into the query string unencoded, and Grafana splits ``key:value``. Case
    and dots are kept, so ``run:<id>`` equals the dashboard's ``run:$run_id`` filter for run ids the
    guardian makes (``guardian run``, ``watch``, ``demo``)."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    cleaned = _TAG_BAD.sub("_", folded).strip("_")[:_TAG_MAX]
    if not cleaned:
        raise ValueError(f"tag {text!r} has no usable characters")
    return cleaned


def add_annotation(
    api: GrafanaApi,
    *,
    time_ms: int,
    time_end_ms: int | None,
    tags: Sequence[str],
    text: str,
    dashboard_uid: str | None = None,
) -> int:
    """Create an annotation and return its id. Times are epoch milliseconds; ``time_end_ms=None`` makes
    a point (open a region now, close it later with ``close_region``). Without ``dashboard_uid`` (or
    with an unknown one, which Grafana silently drops) it is org-wide and shown where tags match."""
    _check_ms("time_ms", time_ms)
    if time_end_ms is not None:
        _check_ms("time_end_ms", time_end_ms)
        if time_end_ms < time_ms:
            raise ValueError(f"time_end_ms {time_end_ms} is before time_ms {time_ms}")
    if not text:
        raise ValueError("annotation text must not be empty (Grafana rejects it)")
    clean = list(dict.fromkeys(tag(t) for t in tags))
    target = "the dashboard" if dashboard_uid else "the organisation (org-wide annotations)"
    fields = {"dashboard_uid": dashboard_uid, "time_from": time_ms, "time_to": time_end_ms, "tags": clean, "text": text}
    answer = _call(api, "add annotation", target, api.annotations.add_annotation, **fields)
    annotation_id = int(answer["id"])
    log.info(event("grafana_annotation_added", {"id": annotation_id, "tags": ",".join(clean)}))
    return annotation_id


def close_region(api: GrafanaApi, annotation_id: int, time_end_ms: int) -> None:
    """Set ``timeEnd`` of an annotation (PATCH with that field alone).

    Not ``annotations.partial_update_annotation``: it always sends ``"tags": []`` and Grafana's PATCH
    replaces tags whenever the field is present, so closing a region would strip its tags.
    """
    _check_ms("time_end_ms", time_end_ms)
    what, path = f"close annotation {annotation_id}", f"/annotations/{annotation_id}"
    _call(api, what, "the annotation", api.client.PATCH, path, json={"timeEnd": time_end_ms})
    log.info(event("grafana_region_closed", {"id": annotation_id}))


def _check_ms(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < _MIN_EPOCH_MS:
        raise ValueError(f"{name}={value!r} is not epoch milliseconds (seconds × 1000?)")


def _call(api: GrafanaApi, what: str, target: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every client/transport failure turned into a ``GrafanaError``;
    ``target`` names what a 403 lacks permission on. A non-JSON answer means the URL is not Grafana's API."""
    try:
        result = fn(*args, **kwargs)
    except niquests.exceptions.InvalidJSONError:
        result = ""
    except (GrafanaException, niquests.exceptions.RequestException) as exc:
        raise _to_error(api, what, exc, target) from exc
    if isinstance(result, str):
        where = _safe_url(str(api.url or api.client.url))
        raise GrafanaError(f"{what}: {where} answered with text, not JSON; is it Grafana (not a proxy or login page)?")
    return result


def _to_error(api: GrafanaApi, what: str, exc: Exception, target: str) -> GrafanaError:
    where = _safe_url(str(api.url or api.client.url))
    if isinstance(exc, GrafanaTimeoutError | niquests.exceptions.Timeout):
        err = GrafanaError(
            f"{what}: Grafana unreachable at {where} (no answer within {api.client.timeout}s); "
            "check the URL and that Grafana is up",
            retryable=True,
        )
    elif not isinstance(exc, GrafanaException) or not exc.status_code:
        err = GrafanaError(
            f"{what}: Grafana unreachable at {where} ({_reason(exc)}); check the URL and that Grafana is up",
            retryable=is_outage(exc),  # refused, reset, a resolver down; not a bad certificate or URL
        )
    else:
        status, detail = int(exc.status_code), _detail(exc.response)
        if status == 401:
            text = "token rejected (401): check the service-account token (token file / GRAFANA_TOKEN)"
        elif status == 403:
            text = f"token lacks permission (403): the service account needs Editor on {target} ({detail})"
        elif status == 412:
            kind = exc.response.get("status") if isinstance(exc.response, dict) else None
            advice = "rename one of them or push with overwrite" if kind == "name-exists" else "push with overwrite"
            text = f"conflict (412 {kind or 'precondition failed'}): {detail}; {advice}"
        elif status >= 500:
            text = f"Grafana server error {status} at {where}: {detail}; try again later"
        else:
            text = f"refused ({status}): {detail}"
        err = GrafanaError(f"{what}: {text}", status=status, retryable=transient_status(status))
    auth = api.client.auth  # defence in depth: Grafana never echoes the token, but a proxy might
    if isinstance(auth, _BearerAuth) and len(auth.token.reveal()) >= 4 and auth.token.reveal() in str(err):
        err = GrafanaError(str(err).replace(auth.token.reveal(), "***"), status=err.status, retryable=err.retryable)
    return err


def _detail(response: object) -> str:
    if isinstance(response, dict) and "message" in response:
        return str(response["message"])[:300]
    return str(response)[:300] if response else "no detail"


def _reason(exc: Exception) -> str:
    text = str(exc)
    for known in ("Connection refused", "Name or service not known", "No route to host", "certificate verify failed"):
        if known.lower() in text.lower():
            return known.lower()
    return type(exc).__name__


def _safe_url(url: str) -> str:
    """``url`` without user:password (a URL may carry basic-auth credentials)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
