"""What a person may see of a value that can hold a secret: ``render_db_url`` (a database URL),
``scrub_text`` (a driver's error text) and ``printable`` (a string shown on one line).

``render_db_url`` masks the text as written, without parsing it, so any URL form is masked. ``scrub_text``
removes the secrets of URLs the stores opened (``remember_url``).
Rules: docs/decisions/0060-masking-database-urls.md."""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Iterable
from typing import Final

MASK: Final = "***"

# libpq connection parameters (and SQLite's URI ones) whose values carry no secret: shown as written. Everything
# else - password, sslpassword, passfile, options (free text), a parameter this list does not know - is masked.
SAFE_PARAMETERS: Final = frozenset(
    {
        "host", "hostaddr", "port", "dbname", "user", "connect_timeout", "client_encoding", "application_name",
        "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
        "tcp_user_timeout", "replication", "gssencmode", "sslmode", "sslnegotiation", "sslcompression", "sslcert",
        "sslkey", "sslcertmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer",
        "ssl_min_protocol_version", "ssl_max_protocol_version", "min_protocol_version", "max_protocol_version",
        "krbsrvname", "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
        "channel_binding", "require_auth",
        # SQLite (pysqlite URI parameters and SQLAlchemy's)
        "mode", "cache", "uri", "timeout", "check_same_thread", "nolock", "immutable", "vfs", "psow", "modeof",
    }
)  # fmt: skip
# parameters whose values are secret in free text (an error message quoting a connection string)
SECRET_PARAMETERS: Final = ("password", "sslpassword", "passfile")
_SECRET_NAME = re.compile(r"pass|secret|token|credential|auth", re.IGNORECASE)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_BEFORE_QUERY = re.compile(r"[^:/?]*(?::\d*)?(?:/.*)?", re.DOTALL)  # host[:port][/path] before a query's "?"
_CONNINFO_START = re.compile(r"\s*[A-Za-z_]\w*\s*=")
_CONNINFO_ITEM = re.compile(r"\s*(?:([A-Za-z_]\w*)\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s']*)|(\S+))")
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`]*")
# user:PASS@host without a scheme, in free text
_USERINFO_IN_TEXT = re.compile(r"(?<![\w/:.%+\-])([\w.+\-%]+):(?!//)[^\s\"'<>`]*@(?=[\w\[])")
_SECRET_IN_TEXT = re.compile(
    r"\b(" + "|".join(SECRET_PARAMETERS) + r")(\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s'&,;)\"]+)", re.IGNORECASE
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHORTEST_SECRET = 3  # a piece of a secret shorter than this is not scrubbed from text (it would garble it)
SHORTEST_REMEMBERED: Final = 5  # ... nor, shorter than this, from every log line of the process

_remembered: tuple[str, ...] = ()
_remembered_lock = threading.Lock()


def printable(text: object, limit: int | None = None) -> str:
    """``text`` on one line: control characters (newline, NUL, ESC, C1, U+2028/9) as escapes; longer than ``limit``
    characters: cut, with ``...`` and the length."""
    shown = str(text)
    if limit is not None and len(shown) > limit:
        shown = f"{shown[:limit]}... ({len(shown)} characters)"
    return _CONTROL.sub(_escape, shown)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def render_db_url(url: str) -> str:
    """``url`` (a SQLAlchemy URL, one without its scheme, or a libpq ``key=value`` string) for a person: every
    password masked as ``***`` whatever form it takes (module docstring), on one line."""
    scheme = _SCHEME.match(url)
    if scheme is None and _CONNINFO_START.match(url):
        return printable(_render_conninfo(url))
    head, rest = (url[: scheme.end()], url[scheme.end() :]) if scheme else ("", url)
    end = _userinfo_end(rest)
    shown = head
    if end is not None:
        shown += _render_userinfo(rest[:end]) + "@"
        rest = rest[end + 1 :]
    where, mark, query = rest.partition("?")
    shown += where
    if mark:
        shown += "?" + "&".join(_render_query_item(item) for item in query.split("&"))
    return printable(shown)


def _userinfo_end(rest: str) -> int | None:
    """Where the userinfo of ``rest`` (a URL after its ``scheme://``) ends: the last ``@`` that is not inside a query
    value; None without one. An ``@`` after a ``?`` is in a query value (``/db?application_name=a@b``) when the text
    up to it holds an ``=`` and what stands before the ``?`` is a host, a port or a path - not ``user:pa`` of a
    password with a ``?`` in it (``user:pa?ss=1@host``)."""
    end = len(rest)
    while (at := rest.rfind("@", 0, end)) >= 0:
        question = rest.rfind("?", 0, at)
        if question < 0 or "=" not in rest[question + 1 : at] or not _BEFORE_QUERY.fullmatch(rest[:question]):
            return at
        end = at
    return None


def url_problem(url: str) -> str | None:
    """What is wrong with the form of the database URL ``url``, said without its secrets (None when nothing is seen):
    no scheme, or an ``@`` or ``?`` in the password that was not percent-encoded."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return "it has no scheme: write sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST/DB"
    rest = url[scheme.end() :]
    end = _userinfo_end(rest)
    if end is None:
        return None
    userinfo = rest[:end]
    if "@" in userinfo or "?" in userinfo or "/" in userinfo.partition(":")[2]:
        return "its password holds '@', '?' or '/' as is: percent-encode them (%40, %3F, %2F)"
    return None


def _render_userinfo(userinfo: str) -> str:
    """``user:***`` (``user`` alone when there is no password); the user ends at the first ``:`` (or ``@``)."""
    user, colon, _ = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}"
    user, at, _ = userinfo.partition("@")
    return f"{user}@{MASK}" if at else user


def _render_query_item(item: str) -> str:
    key, equals, _ = item.partition("=")
    if not equals:
        return item if item == "" or _parameter(item) in SAFE_PARAMETERS else MASK
    if _parameter(key) in SAFE_PARAMETERS:
        return item
    return f"{key}={MASK}" if re.fullmatch(r"[\w%.\-]{1,64}", key) else f"{MASK}={MASK}"


def _parameter(key: str) -> str:
    return urllib.parse.unquote(key).strip().lower()


def _render_conninfo(text: str) -> str:
    items = []
    for match in _CONNINFO_ITEM.finditer(text):
        key, value, stray = match.groups()
        if stray is not None:
            items.append(MASK)
        elif key is not None:
            items.append(f"{key}={value if key.lower() in SAFE_PARAMETERS else MASK}")
    return " ".join(items)


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` a driver's message must not show: the password (as written and unescaped) and each piece
    of it around an ``@`` (SQLAlchemy ends the password at the first ``@`` and calls the rest the host), and the
    values of the query parameters named like a secret (``password``, ``sslpassword``, ``passfile``, ...)."""
    scheme = _SCHEME.match(url)
    rest = url[scheme.end() :] if scheme else url
    found: list[str] = []
    if scheme is None and _CONNINFO_START.match(url):
        for match in _CONNINFO_ITEM.finditer(url):
            key, value, stray = match.groups()
            if stray is not None:
                found.append(stray)
            elif key is not None and _SECRET_NAME.search(key) and key.lower() not in SAFE_PARAMETERS and value:
                found.extend((value, value.strip("'")))
        return _with_pieces(found)
    end = _userinfo_end(rest)
    if end is not None:
        userinfo = rest[:end]
        _, colon, password = userinfo.partition(":")
        if not colon:
            _, _, password = userinfo.partition("@")
        if password:
            found.append(password)
        rest = rest[end + 1 :]
    _, mark, query = rest.partition("?")
    for item in query.split("&") if mark else ():
        key, equals, value = item.partition("=")
        if equals and _SECRET_NAME.search(_parameter(key)) and _parameter(key) not in SAFE_PARAMETERS:
            found.append(value)
    return _with_pieces(found)


def _with_pieces(secrets: Iterable[str]) -> list[str]:
    pieces: set[str] = set()
    for secret in secrets:
        for form in (secret, urllib.parse.unquote(secret), urllib.parse.unquote_plus(secret)):
            pieces.add(form)
            pieces.update(form.split("@"))
    # the longest first: a piece inside another is replaced after it
    return sorted((p for p in pieces if len(p) >= _SHORTEST_SECRET), key=len, reverse=True)


def remember_url(url: str) -> None:
    """Keep ``url``'s secret parts (``url_secrets``) for the life of the process: ``scrub_text`` and every log line
    leave them out. Only parts of at least ``SHORTEST_REMEMBERED`` characters that the rendered URL does not show
    anyway (a password equal to the user name) are kept: every log line is scrubbed of them, and a short or common
    piece would blank words all over the log."""
    global _remembered
    visible = render_db_url(url)
    secrets = [part for part in url_secrets(url) if len(part) >= SHORTEST_REMEMBERED and part not in visible]
    if secrets:
        with _remembered_lock:
            _remembered = tuple(sorted({*_remembered, *secrets}, key=len, reverse=True))


def remembered() -> tuple[str, ...]:
    """The secret parts of every URL remembered so far, the longest first."""
    return _remembered


def scrub_remembered(text: str) -> str:
    """``text`` with the remembered URLs' secret parts replaced by ``***`` (a log line: nothing else changes)."""
    for secret in _remembered:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` (an error message, a traceback) with every URL in it rendered by ``render_db_url``, libpq's
    ``password=...``-style values masked, and each of ``secrets`` and the remembered URLs' secret parts replaced by
    ``***``."""
    scrubbed = text
    for secret in sorted(set(_with_pieces(secrets)), key=len, reverse=True):  # whole secrets before the patterns
        scrubbed = scrubbed.replace(secret, MASK)
    scrubbed = scrub_remembered(scrubbed)
    scrubbed = _URL_IN_TEXT.sub(lambda match: render_db_url(match.group()), scrubbed)
    scrubbed = _USERINFO_IN_TEXT.sub(lambda match: f"{match.group(1)}:{MASK}@", scrubbed)
    return _SECRET_IN_TEXT.sub(lambda match: f"{match.group(1)}{match.group(2)}{MASK}", scrubbed)
