"""Engines on the guardian's database and the schema migrations that keep it current.

``open_engine`` builds the engine for a URL and runs ``alembic upgrade head``. Every failure is a ``StoreError``
with the URL's secrets masked, and ``hide_parameters=True`` keeps values out of error text. SQLite: WAL, a busy
timeout, ``BEGIN IMMEDIATE`` for writes. PostgreSQL (psycopg 3): lock and connect timeouts, pre-ping, bounded
round trips, migrations under an advisory lock. Details: docs/ARCHITECTURE.md §8."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from guardian.config import (
    BUSY_TIMEOUT_S,  # a write waits this long for another writer's lock
    MIGRATION_WAIT_S,  # a first open's migration, by another guardian, is waited for this long
    STATEMENT_TIMEOUT_S,  # PostgreSQL: a round trip without an answer fails after this
)
from guardian.extras import MissingExtra, need
from guardian.redact import printable, remember_url, render_db_url, scrub_text, url_problem, url_secrets
from guardian.store.errors import StoreError
from guardian.store.models import Base

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"
SCHEMA_HEAD: Final = "0006"
"""The newest revision in ``migrations/versions`` (a test holds the two together): a store already at it is opened
without loading Alembic, which would cost every guardian ~15 MB of memory for nothing to do."""

WRITE_OPTION: Final = "guardian_write"
"""Execution option that marks a connection's transactions as writes (``BEGIN IMMEDIATE`` on SQLite)."""

STEPS_ONLY_OPTION: Final = "guardian_steps_only"
"""Execution option of a write transaction that writes step rows alone (``changes.WriteCount`` counts it apart)."""


_SQLITE_PRAGMAS: Final = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)

PG_CONNECT_TIMEOUT_S: Final = 10  # libpq waits for ever by default: an unreachable server would hang a tick
MIGRATION_POLL_S: Final = 0.1
_PG_MIGRATION_LOCK: Final = 0x67756172640001  # pg_advisory_xact_lock key: one migration of a database at a time
_T = TypeVar("_T")


def mask_url(url: str) -> str:
    """``url`` for a person: every password masked as ``***`` whatever its form (in the userinfo, a query
    parameter, a URL without a scheme, an unescaped ``@``; ``guardian.redact.render_db_url``), also when it does
    not parse."""
    return render_db_url(url)


def head_revision() -> str:
    """The newest schema revision this version of the guardian ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(None)).get_current_head()
    if head is None:
        raise StoreError("the packaged migrations have no head revision")
    return head


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database behind ``engine`` is at, or None if it has none."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        revision: str | None = MigrationContext.configure(connection).get_current_revision()
    return revision


def open_engine(
    url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S, statement_timeout_s: float = STATEMENT_TIMEOUT_S
) -> Engine:
    """An engine on ``url`` with the schema brought to the newest revision (a write waits up to ``busy_timeout_s``
    for another connection's lock: SQLite's busy timeout, PostgreSQL's ``lock_timeout``; on PostgreSQL a round trip
    the server does not answer within ``statement_timeout_s`` fails as an outage: ``guardian.store.postgres``).

    Raises ``StoreError`` (URL shown with its password masked) when the URL is invalid, its driver
    is missing, the database cannot be reached or created, or the migration fails.
    """
    masked = mask_url(url)
    remember_url(url)  # no log line, traceback or error text shows its secrets from now on
    parsed: URL | None = None
    engine: Engine | None = None
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            engine = _sqlite_engine(parsed, busy_timeout_s)
        elif backend == "postgresql":
            need("postgres", f"the store URL {masked}")
            parsed = parsed.set(drivername="postgresql+psycopg") if parsed.drivername == backend else parsed
            engine = _postgresql_engine(parsed, busy_timeout_s, statement_timeout_s)
        else:
            engine = create_engine(parsed, pool_pre_ping=True, hide_parameters=True)
        _upgrade_when_free(engine, parsed)
    except MissingExtra as exc:
        raise StoreError(str(exc)) from None
    except (SQLAlchemyError, StoreError, OSError, ImportError, ValueError) as exc:
        if engine is not None:
            engine.dispose()
        problem = url_problem(url)
        advice = f" ({problem})" if problem else ""
        raise StoreError(f"cannot open store at {masked}: {reason(exc, url)}{advice}") from None
    return engine


def _alembic_config(url: URL | None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        # configparser interpolates '%', so a percent-encoded password must be escaped
        config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": another connection's write transaction outlasted the busy
    timeout (nothing of the refused transaction was written: ``BEGIN IMMEDIATE`` takes the lock before any write)."""
    return (
        isinstance(exc, OperationalError)
        and isinstance(exc.orig, sqlite3.OperationalError)
        and "locked" in str(exc.orig)
    )


def when_free(work: Callable[[], _T], wait_s: float) -> _T:
    """``work()`` (one whole write transaction), run again while SQLite refuses it as locked, until ``wait_s`` has
    passed; then the lock's error is raised. SQLite's busy handler is no queue: a writer among many (a fleet's runs
    starting together) can be passed over for longer than the busy timeout while the others take turns."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return work()
        except OperationalError as exc:
            if not is_locked(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(MIGRATION_POLL_S)


def _upgrade_when_free(engine: Engine, url: URL, wait_s: float = MIGRATION_WAIT_S) -> None:
    """``_upgrade``, waiting up to ``wait_s`` while another connection holds SQLite's write lock (another guardian
    migrating the same new database: its transaction may outlast the busy timeout)."""
    when_free(lambda: _upgrade(engine, url), wait_s)


def _upgrade(engine: Engine, url: URL) -> None:
    """``alembic upgrade head`` inside one write transaction on the store's own connection.

    On SQLite the migration runs with foreign keys off (a revision that rebuilds a table drops the old one, which
    the rows referring to it would refuse) and checks them all before it commits: SQLite's own procedure for
    altering a table. The setting cannot change inside a transaction, so it is made on the driver's connection.
    A store already at ``SCHEMA_HEAD`` is left as it is, and an empty database gets the models' schema stamped at
    head (what the migrations build: tests/integration/test_store.py compares them), both without loading Alembic,
    which would stay in the guardian's memory for the rest of the run."""
    if _at_head(engine):
        return
    with engine.connect() as connection:
        connection.execution_options(**{WRITE_OPTION: True})
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            _sqlite_foreign_keys(connection, on=False)
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
                with _unbounded(connection):  # rewriting a large table may take longer than one statement may
                    if inspect(connection).get_table_names():
                        _migrate(connection, url)
                    else:
                        _create_at_head(connection)
                if sqlite:
                    _sqlite_check_foreign_keys(connection)
        finally:
            if sqlite and not connection.invalidated:
                _sqlite_foreign_keys(connection, on=True)


def _migrate(connection: Connection, url: URL) -> None:
    """``alembic upgrade head`` on ``connection``, inside its transaction."""
    from alembic import command
    from alembic.util import CommandError

    config = _alembic_config(url)
    config.attributes["connection"] = connection
    try:
        command.upgrade(config, "head")
    except CommandError as exc:
        raise StoreError(str(exc)) from exc


def _create_at_head(connection: Connection) -> None:
    """The models' tables, and Alembic's version table saying ``SCHEMA_HEAD``, in an empty database."""
    Base.metadata.create_all(connection)
    connection.execute(
        text(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    connection.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"), {"head": SCHEMA_HEAD})


def _at_head(engine: Engine) -> bool:
    """Whether the database's schema is at ``SCHEMA_HEAD`` (one read of ``alembic_version``; False when it has
    none yet, or when it cannot be read: the migration then says why)."""
    try:
        with engine.connect() as connection:
            versions = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except SQLAlchemyError:
        return False
    return versions == [SCHEMA_HEAD]


@contextmanager
def _unbounded(connection: Connection) -> Iterator[None]:
    """No ``statement_timeout_s`` bound on ``connection``'s round trips inside the block (PostgreSQL)."""
    raw: Any = connection.connection.dbapi_connection  # a postgres.BoundedConnection, or another driver's
    bound = getattr(raw, "answer_timeout_s", None)
    if bound is None:
        yield
        return
    raw.answer_timeout_s = None
    try:
        yield
    finally:
        raw.answer_timeout_s = bound


def _sqlite_foreign_keys(connection: Connection, *, on: bool) -> None:
    raw = connection.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    try:
        cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    finally:
        cursor.close()


def _sqlite_check_foreign_keys(connection: Connection) -> None:
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        tables = sorted({str(row[0]) for row in broken})
        raise StoreError(
            f"the migration left {len(broken)} rows referring to rows that do not exist (tables {tables}); nothing "
            "of it was kept: report it with the database file"
        )


def _sqlite_on_connect(busy_timeout_s: float) -> Callable[[sqlite3.Connection, object], None]:
    pragmas = (f"PRAGMA busy_timeout={round(busy_timeout_s * 1000)}", *_SQLITE_PRAGMAS)

    def on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # SQLAlchemy emits BEGIN itself (see _sqlite_on_begin); pysqlite's own handling would not.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    return on_connect


def _sqlite_on_begin(connection: Connection) -> None:
    writes = bool(connection.get_execution_options().get(WRITE_OPTION))
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


def _sqlite_engine(url: URL, busy_timeout_s: float) -> Engine:
    database = url.database or ""
    in_memory = database in ("", ":memory:") or "mode=memory" in database
    if in_memory:
        engine = create_engine(
            url, poolclass=StaticPool, connect_args={"check_same_thread": False}, hide_parameters=True
        )
    else:
        if not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, hide_parameters=True)
    event.listen(engine, "connect", _sqlite_on_connect(busy_timeout_s))
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _postgresql_engine(url: URL, lock_timeout_s: float, answer_timeout_s: float) -> Engine:
    from guardian.store.postgres import BoundedConnection, bounded_waits_supported

    if not bounded_waits_supported():
        raise ImportError("this psycopg cannot bound a wait for the server's answer: install psycopg >= 3.3")
    connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    engine = create_engine(url, pool_pre_ping=True, hide_parameters=True, connect_args=connect_args)

    def connect(_dialect: object, _record: object, cargs: list[object], cparams: dict[str, Any]) -> DBAPIConnection:
        connection = BoundedConnection.connect(*cargs, **cparams)  # type: ignore[arg-type]
        connection.answer_timeout_s = answer_timeout_s
        return cast(DBAPIConnection, connection)

    event.listen(engine, "do_connect", connect)
    event.listen(engine, "connect", _postgresql_on_connect(lock_timeout_s))
    return engine


def _postgresql_on_connect(lock_timeout_s: float) -> Callable[[DBAPIConnection, object], None]:
    statement = f"SET lock_timeout = {max(1, round(lock_timeout_s * 1000))}"

    def on_connect(dbapi_connection: DBAPIConnection, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()
        dbapi_connection.commit()  # a session setting, kept when the pool later rolls a transaction back

    return on_connect


def reason(exc: BaseException, url: str | URL | None = None) -> str:
    """``TypeName: first line of the message`` (just the type when there is none), scrubbed of secrets should a
    driver echo them: ``url``'s own (each piece of its password, its secret query values), any URL in the text
    rendered by ``mask_url``, libpq's ``password=...``, and every URL a store opened. The first line only: SQLAlchemy
    puts the SQL text on the lines after it."""
    lines = str(exc).strip().splitlines()
    said = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    secrets: list[str] = []
    if isinstance(url, URL):
        secrets.extend(str(part) for part in (url.password, url.query.get("password")) if part)
        url = url.render_as_string(hide_password=False)
    if url is not None:
        secrets.extend(url_secrets(url))
    return printable(scrub_text(said, secrets))
