"""A throwaway PostgreSQL cluster from Debian's binaries (package ``postgresql``), and the store tests' fixtures that
run them on both backends.

``running_postgres`` runs ``initdb`` into a scratch folder (password authentication over TCP only, no Unix socket),
starts ``postgres`` there and stops it on exit (the folder is removed). PostgreSQL refuses to run as root, so
under root (CI) the cluster belongs to Debian's ``postgres`` user. ``PostgresServer.database()`` creates a fresh
database and gives its URL; ``stop()``/``start()`` take the server away mid-test and bring it back on the same port.
The superuser's password holds characters a URL must escape (``PASSWORD``): tests grep logs and stored rows for it,
raw and escaped.

Fixtures (a plugin of conftest.py): ``postgres`` (one cluster for the session), ``db_url`` (a test on a fresh
SQLite file and on a fresh PostgreSQL database). ``conftest.missing`` skips the PostgreSQL cases locally without the
binaries and fails them under CI (env ``CI``), where .ci/run installs the package. ``HeldLock`` and ``rows`` reach
the database beside the store, on either backend.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from conftest import free_port, missing
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    import psycopg

USER: Final = "guardian"
PASSWORD: Final = "pg:s3cr3t/w%rd@x"  # ':', '/', '%' and '@' are escaped in a URL
DEBIAN_BINARIES: Final = Path("/usr/lib/postgresql")
# a scratch cluster: nothing of it needs to survive a crash
TEST_SETTINGS: Final = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def postgres_bindir() -> Path:
    """The newest Debian PostgreSQL's bin folder (``/usr/lib/postgresql/<version>/bin``); skips locally when there is
    none, fails in CI (.ci/run installs it)."""
    versions = [p.parent.parent for p in DEBIAN_BINARIES.glob("*/bin/initdb") if p.parent.parent.name.isdigit()]
    if not versions:
        missing(f"no initdb under {DEBIAN_BINARIES}/<version>/bin (Debian package postgresql; .ci/run installs it)")
    return max(versions, key=lambda folder: int(folder.name)) / "bin"


def _owner() -> pwd.struct_passwd | None:
    """The user the cluster runs as: Debian's ``postgres`` under root (postgres refuses root), else None (oneself)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        missing("running as root, and there is no 'postgres' user to run the cluster as (Debian package postgresql)")


def conninfo(url: str) -> str:
    """libpq's connection string for a ``postgresql+psycopg://`` URL (psycopg reads no SQLAlchemy URL)."""
    from psycopg.conninfo import make_conninfo

    parsed = make_url(url)
    return make_conninfo(
        host=parsed.host, port=parsed.port, user=parsed.username, password=parsed.password, dbname=parsed.database
    )


@dataclass
class PostgresServer:
    """A cluster in ``root`` serving 127.0.0.1:``port``; its log is ``root/postgres.log``."""

    bindir: Path
    root: Path
    port: int
    settings: Mapping[str, str]
    owner: pwd.struct_passwd | None
    process: subprocess.Popen[bytes] | None = None
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` with the password in it, escaped."""
        url = URL.create("postgresql+psycopg", USER, PASSWORD, "127.0.0.1", self.port, database)
        return url.render_as_string(hide_password=False)

    def database(self) -> str:
        """A new empty database's URL (``guardian_<n>``)."""
        import psycopg

        name = f"guardian_{next(self._names)}"
        with psycopg.connect(conninfo(self.url()), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def start(self, ready_timeout: float = 30.0) -> None:
        """Start ``postgres`` on the cluster (again, on the same port) and wait until it takes connections."""
        import psycopg

        command = [str(self.bindir / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port)]
        command += [f"-c{key}={value}" for key, value in self.settings.items()]
        command += ["-clisten_addresses=127.0.0.1", "-cunix_socket_directories="]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, **self.as_owner()
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"postgres exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                psycopg.connect(conninfo(self.url()), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"postgres not ready after {ready_timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)

    def stop(self, sig: signal.Signals = signal.SIGINT) -> None:
        """Stop the server: SIGINT is PostgreSQL's fast shutdown (it ends every session: 'terminating connection due
        to administrator command'), SIGQUIT its immediate one; SIGKILL if it has not gone after 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def as_owner(self) -> dict[str, Any]:
        """``subprocess`` arguments that run a command as the cluster's owner."""
        if self.owner is None:
            return {}
        return {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}


@contextmanager
def running_postgres(settings: Mapping[str, str] = TEST_SETTINGS) -> Iterator[PostgresServer]:
    """A fresh cluster (superuser ``USER`` with ``PASSWORD``, scram-sha-256 over TCP) on a free loopback port, with
    ``settings`` (``-c`` options); stopped and removed on exit."""
    bindir = postgres_bindir()
    owner = _owner()
    # not under pytest's tmp_path: its root is private to root, and the cluster may belong to 'postgres'
    root = Path(tempfile.mkdtemp(prefix="guardian-pg-"))
    server = PostgresServer(bindir, root, free_port(), settings, owner)
    try:
        password = root / "password"
        password.write_text(PASSWORD)
        if owner is not None:
            for path in (root, password):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        initdb = [str(bindir / "initdb"), "-D", str(root / "data"), "-U", USER, f"--pwfile={password}"]
        initdb += ["--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(initdb, capture_output=True, text=True, check=False, **server.as_owner())
        if done.returncode != 0:
            pytest.fail(f"initdb failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------------ beside the store, either backend


def backend(url: str) -> str:
    """``sqlite`` or ``postgresql``: the backend a store URL names."""
    return make_url(url).get_backend_name()


def rows(url: str, sql: str, **params: object) -> list[tuple[Any, ...]]:
    """The rows of one query on the database at ``url``, read outside the store (on a connection of its own)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


def database_at(url: str, revision: str, rows_sql: Sequence[str]) -> None:
    """The database at ``url`` migrated to ``revision`` only, then ``rows_sql`` run in one transaction: history as
    that release wrote it, for an upgrade test (either backend; a SQLite file's folder is made)."""
    from alembic import command

    from guardian.store.engine import _alembic_config

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    try:
        config = _alembic_config(engine.url)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
        with engine.begin() as connection:
            for sql in rows_sql:
                connection.exec_driver_sql(sql)
    finally:
        engine.dispose()


class HeldLock:
    """Another session holding the store's write lock: SQLite's ``BEGIN EXCLUSIVE``; on PostgreSQL every table of
    the schema locked ``IN EXCLUSIVE MODE`` (writes wait, plain reads go on, as under SQLite's WAL). ``refusal`` is
    what the store's error says once its busy timeout (PostgreSQL: ``lock_timeout``) has passed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.refusal = {"sqlite": "database is locked", "postgresql": "lock timeout"}[backend(url)]
        self.connection: sqlite3.Connection | psycopg.Connection[Any] | None = None

    def take(self) -> None:
        if backend(self.url) == "sqlite":
            database = make_url(self.url).database
            assert database, self.url
            self.connection = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
            self.connection.execute("BEGIN EXCLUSIVE")
            return
        import psycopg

        self.connection = psycopg.connect(conninfo(self.url))  # its transaction stays open until release
        tables = self.connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        self.connection.execute(f"LOCK TABLE {', '.join(name for (name,) in tables)} IN EXCLUSIVE MODE")

    def release(self) -> None:
        if self.connection is not None:
            self.connection.rollback()
            self.connection.close()
            self.connection = None


# ------------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster for the session (tests take a fresh database each: ``server.database()``)."""
    with running_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty store: a SQLite file under ``tmp_path``, or a fresh database on the session's cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'home' / 'guardian.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.database()
