"""Where a command keeps its history (the guardian home: store and run folders) and which guardian.yaml it reads,
the same from whatever folder it starts in; the order of both is in docs/configuration.md.

Invariant: a file found through the home cannot move it (its ``home:`` must name that home). ``resolve_home`` and
``config_candidates`` are pure; ``locate`` looks at the disk."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from guardian.config import ENV_OVERRIDES, ConfigError, GuardianConfig, load_config
from guardian.redact import printable, render_db_url

HOME_ENV = "GUARDIAN_HOME"
CEILING_ENV = "GUARDIAN_CEILING_DIRECTORIES"
HOME_FOLDER = ".guardian"
CONFIG_FILE = "guardian.yaml"
STATE_FOLDER = "verl-guardian"
ADVICE = (
    "set GUARDIAN_HOME to the folder that holds guardian.db, or run the command from the project (in the folder "
    "holding .guardian/ or below it)"
)


class HomeFrom(StrEnum):
    """Which rule chose the home (module docstring)."""

    ENV = "env"
    CONFIG = "config"
    PROJECT = "project"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Home:
    """The home chosen, the rule that chose it, and that rule in words (where it was looked for)."""

    path: Path
    source: HomeFrom
    why: str


class StoreNotFoundError(Exception):
    """A command that reads the history found no store where the home says it is (nothing was created)."""


def state_folder(env: Mapping[str, str], user_home: Path | None) -> Path:
    """The per-user state folder: ``$XDG_STATE_HOME/verl-guardian`` (an absolute one; the XDG spec ignores a
    relative one), else ``~/.local/state/verl-guardian``."""
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / STATE_FOLDER
    if user_home is None:
        raise ConfigError(
            "cannot tell where the per-user state folder is: neither XDG_STATE_HOME nor HOME is set; set GUARDIAN_HOME"
        )
    return user_home / ".local" / "state" / STATE_FOLDER


def ceilings(env: Mapping[str, str]) -> frozenset[Path]:
    """The absolute folders of ``$GUARDIAN_CEILING_DIRECTORIES`` (``os.pathsep``-separated, like git's)."""
    return frozenset(Path(p) for p in env.get(CEILING_ENV, "").split(os.pathsep) if p and Path(p).is_absolute())


def searched(cwd: Path, stop_at: frozenset[Path]) -> list[Path]:
    """The folders searched for ``.guardian/``: ``cwd`` (always), then each parent up to the root or a ceiling."""
    folders = [cwd]
    for parent in cwd.parents:
        if parent in stop_at:
            break
        folders.append(parent)
    return folders


def resolve_home(
    env: Mapping[str, str],
    cwd: Path,
    *,
    file_home: tuple[Path, Path] | None,
    is_home: Callable[[Path], bool],
    user_home: Path | None,
) -> Home:
    """The home by the module's rule. ``cwd`` is absolute; ``file_home`` is (home, file) when the guardian.yaml of
    rule 2 names one (already made absolute); ``is_home`` says whether a ``.guardian`` path is a usable folder."""
    if env.get(HOME_ENV):
        path = cwd / env[HOME_ENV]
        return Home(path, HomeFrom.ENV, "$GUARDIAN_HOME")
    if file_home is not None:
        path, file = file_home
        return Home(path, HomeFrom.CONFIG, f"the home: of {file}")
    folders = searched(cwd, ceilings(env))
    for folder in folders:
        if is_home(folder / HOME_FOLDER):
            return Home(folder / HOME_FOLDER, HomeFrom.PROJECT, f"the nearest {HOME_FOLDER}/ up from {cwd}")
    where = f"{cwd} and its parents up to {folders[-1]}" if len(folders) > 1 else str(cwd)
    why = f"the per-user state folder (no GUARDIAN_HOME, no {HOME_FOLDER}/ in {where})"
    return Home(state_folder(env, user_home), HomeFrom.USER, why)


def config_candidates(cwd: Path, home: Home) -> list[Path]:
    """The guardian.yaml files tried in order when ``--config`` is not given."""
    found = [cwd / CONFIG_FILE]
    if home.source is HomeFrom.PROJECT:
        found.append(home.path.parent / CONFIG_FILE)
    found.append(home.path / CONFIG_FILE)
    return list(dict.fromkeys(found))


def home_in_file(config: GuardianConfig, file: Path, env: Mapping[str, str]) -> Path | None:
    """The home a loaded guardian.yaml chose itself (a relative one is read from the file's folder); None when it
    leaves ``home:`` out or ``$GUARDIAN_HOME`` overrides it."""
    if env.get(HOME_ENV) or "home" not in config.model_fields_set:
        return None
    return file.parent / config.home


def store_file(url: str) -> Path | None:
    """The SQLite file a store URL names; None for another backend, an in-memory database or a URL that does not
    parse (opening it says why)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser()


@dataclass(frozen=True, slots=True)
class Located:
    """The configuration a command runs with (its ``home`` is the one chosen) and where it came from."""

    config: GuardianConfig
    home: Home
    file: Path | None  # the guardian.yaml read, None: the defaults
    overrides: tuple[str, ...]  # the environment variables applied over it

    def fields(self, *, store: bool = True) -> dict[str, object]:
        """The ``event=using`` line's fields: home and why, store (password masked), config file and overrides."""
        config = str(self.file) if self.file is not None else "defaults"
        config += "".join(f" + ${name}" for name in self.overrides)
        shown: dict[str, object] = {"home": self.home.path, "home_from": self.home.source.value}
        if store:
            shown["store"] = render_db_url(self.config.database_url())
        shown["config"] = config
        return shown

    def missing_store(self) -> str | None:
        """Why a command that reads the history must not go on (no SQLite file where the store should be), or
        None."""
        file = store_file(self.config.database_url())
        if file is None or file.exists():
            return None
        return (
            f"no guardian store at {printable(file)}: the home {printable(self.home.path)} is "
            f"{printable(self.home.why)}; nothing was created there; {ADVICE}"
        )


def owned_folder(path: Path) -> bool:
    """``path`` is a folder the current user owns (a ``.guardian/`` another user left in ``/tmp`` is not yours)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_dir() and (not hasattr(os, "getuid") or st.st_uid == os.getuid())


def user_folder() -> Path | None:
    try:
        return Path.home()
    except RuntimeError:  # no HOME and no passwd entry
        return None


def locate(config_arg: str | None, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Located:
    """The configuration and home by the module's rule, reading the disk (nothing is created). ``ConfigError`` names
    the file when a guardian.yaml is wrong."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    here = cwd / CONFIG_FILE
    file = cwd / config_arg if config_arg else here if here.is_file() else None
    file_home: tuple[Path, Path] | None = None
    if file is not None:  # rule 2: this file may choose the home
        config = load_config(file, env)
        chosen = home_in_file(config, file, env)
        file_home = (chosen, file) if chosen is not None else None
    home = resolve_home(env, cwd, file_home=file_home, is_home=owned_folder, user_home=user_folder())
    if file is None:  # a file found through the home: it cannot move it
        file = next((p for p in config_candidates(cwd, home) if p.is_file()), None)
        config = load_config(file, env)
        own = home_in_file(config, file, env) if file is not None else None
        if own is not None and own.resolve() != home.path.resolve():
            raise ConfigError(
                f"config file {printable(file)} names home {printable(own)}, but it was found through the home "
                f"{printable(home.path)}: remove its home: (or give the file with --config)"
            )
    overrides = tuple(name for name in ENV_OVERRIDES if name != HOME_ENV and env.get(name))
    return Located(config.model_copy(update={"home": home.path}), home, file, overrides)
