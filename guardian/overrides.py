"""Hydra command lines of a verl launch: parse them, read a key's effective value, write overrides back.

Reads ``python -m verl.trainer.main_ppo …`` (and wrappers, scripts, the demo trainer) or ``bash train.sh …``,
where only the arguments after the script are known until the attempt prints its config. Writes only the keys it
changes, as ``++key`` where a plain override would be refused: docs/decisions/0059-overrides-written-back.md."""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from guardian.hydra_overrides import Op, OverrideSyntaxError, parse
from guardian.hydra_overrides import parse_value as _hydra_value
from guardian.verl_keys import PatchError
from guardian.yamlio import YamlError, load_yaml

_SHAPE = re.compile(r"^(?:\+\+|\+|~)?[A-Za-z_][\w\-.@/]*(?:=|$)")  # what reads as an override, not a positional
_BARE = re.compile(r"^[\w/\-+.%*@?|:]+$")  # text Hydra reads as a string without quotes
_CONFIG_FLAGS = {
    **dict.fromkeys(("--config-path", "-cp"), "path"),
    **dict.fromkeys(("--config-name", "-cn"), "name"),
    **dict.fromkeys(("--config-dir", "-cd"), "dir"),
}
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})


class UnknownKey(PatchError):
    """A key a launch script may set itself: the guardian does not read a script's own arguments."""


@dataclass(frozen=True, slots=True)
class Override:
    """One Hydra override: ``op`` is "", "+", "++" or "~"; ``value_text`` is the raw text after '='."""

    op: Op
    key: str
    value_text: str | None

    def value(self) -> object:
        return None if self.value_text is None else parse_value(self.value_text)

    def text(self) -> str:
        return f"{self.op}{self.key}" + ("" if self.value_text is None else f"={self.value_text}")


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """A parsed launch: ``prefix`` runs the trainer; ``overrides[i]`` sits at ``argv[positions[i]]``."""

    argv: tuple[str, ...]
    prefix: tuple[str, ...]
    entry: str  # module name (``-m``) or script path
    config_path: str | None
    config_name: str | None
    config_dir: str | None
    overrides: tuple[Override, ...]
    positions: tuple[int, ...]
    script: bool = False  # ``entry`` is a shell script that forwards its arguments ("$@") to the trainer

    @property
    def is_verl(self) -> bool:
        """Launches verl itself (not the demo trainer), so verl's Hydra tree applies."""
        return not self.script and (self.entry.startswith("verl.") or self.entry.endswith("main_ppo.py"))

    def override_texts(self) -> list[str]:
        return [o.text() for o in self.overrides]


def parse_override(token: str) -> Override | None:
    """The override in ``token``, or None when it is not one (a flag, a positional); PatchError when it is one
    that Hydra's grammar refuses (verl would refuse it too)."""
    if _SHAPE.match(token) is None or ("=" not in token and not token.startswith("~")):
        return None
    try:
        parsed = parse(token)
    except OverrideSyntaxError as exc:
        raise PatchError(str(exc)) from None
    return Override(parsed.op, parsed.key, parsed.value_text)


def _script_start(argv: tuple[str, ...]) -> int | None:
    """Index just past a launch script's path (``bash [-flags] train.sh``, ``./train.sh``), or None."""
    for i, token in enumerate(argv):
        if token.endswith(".sh") and "=" not in token:  # not an ``env VAR=x.sh`` before the trainer
            return i + 1
        if token.rsplit("/", 1)[-1] in _SHELLS:
            j = i + 1
            while j < len(argv) and argv[j].startswith("-") and argv[j] not in ("-c", "--"):
                j += 1
            if j < len(argv) and argv[j] == "--":  # the end of the shell's options
                j += 1
            if j < len(argv) and argv[j] == "-c":
                raise PatchError(
                    f"{' '.join(argv)!r}: an inline shell command cannot take the guardian's arguments; put it in a "
                    "script whose python command ends in \"$@\" and run 'bash SCRIPT key=value …'"
                )
            return j + 1 if j < len(argv) else None
    return None


def parse_command(argv: Sequence[str]) -> LaunchCommand:
    """Split a launch argv; PatchError when it runs no Python module, script or launch script we can patch."""
    argv = tuple(argv)
    start = next((i + 2 for i, a in enumerate(argv[:-1]) if a == "-m"), None)
    if start is None:
        start = next((i + 1 for i, a in enumerate(argv) if a.endswith(".py")), None)
    script = _script_start(argv[: start - 1] if start is not None else argv)
    start = script if script is not None else start
    if start is None:
        raise PatchError(
            f"cannot find the trainer in {' '.join(argv)!r}: expected 'python -m verl.trainer.main_ppo …', "
            "'python path/to/script.py …' or 'bash train.sh …' (a script whose python command ends in \"$@\")"
        )
    config: dict[str, str] = {}
    overrides: list[Override] = []
    positions: list[int] = []
    i = start
    while i < len(argv):
        token = argv[i]
        flag, eq, value = token.partition("=")
        if flag in _CONFIG_FLAGS:
            if not eq and i + 1 < len(argv):
                i += 1
                value = argv[i]
            config[_CONFIG_FLAGS[flag]] = value
        elif not token.startswith("-") and (override := parse_override(token)) is not None:
            overrides.append(override)
            positions.append(i)
        i += 1
    return LaunchCommand(
        argv,
        argv[:start],
        argv[start - 1],
        config.get("path"),
        config.get("name"),
        config.get("dir"),
        tuple(overrides),
        tuple(positions),
        script is not None,
    )


def parse_value(text: str) -> object:
    """``text`` typed as Hydra types an override's value (int, float, bool, null, list, dict, string)."""
    try:
        return _hydra_value(text)
    except OverrideSyntaxError as exc:
        raise PatchError(str(exc)) from None


def render_value(value: object) -> str:
    """Hydra text for ``value``: 1e-06 (repr), true/false, null, [a,b], strings quoted only when needed."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PatchError(f"refusing to write a non-finite number ({value!r}) into the launch command")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    if isinstance(value, str):
        if value and _BARE.match(value) and value[0] not in "+-" and _reads_back(value):
            return value
        if "'" not in value:
            return f"'{value}'"
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise PatchError(f"cannot write a {type(value).__name__} ({value!r}) as a Hydra override")


def _reads_back(text: str) -> bool:
    """True when Hydra reads the unquoted ``text`` back as that same string."""
    try:
        return parse_value(text) == text
    except PatchError:
        return False


def _omegaconf_loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that, like OmegaConf's, reads ``1e-6`` as a float (plain YAML 1.1 reads a string)."""

    class Loader(yaml.SafeLoader):
        pass

    float_re = re.compile(
        r"^(?:[-+]?\d+(?:_\d+)*\.\d*(?:[eE][-+]?\d+)?|[-+]?\d+(?:_\d+)*[eE][-+]?\d+|\.\d+(?:[eE][-+]\d+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    )
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", float_re, list("-+0123456789."))
    return Loader


_LOADER = _omegaconf_loader()


@dataclass
class EffectiveConfig:
    """What a launch will use for each key: last CLI override, else its ``--config-name`` YAML, else defaults."""

    command: LaunchCommand
    defaults: Mapping[str, object]
    cwd: Path
    config_file: Path | None = None
    notes: list[str] = field(default_factory=list)
    _yaml: dict[str, Any] | None = None
    recorded: Mapping[str, Any] | None = None  # a launch script's run: the config its attempt printed

    @classmethod
    def of(
        cls,
        command: LaunchCommand | Sequence[str],
        defaults: Mapping[str, object],
        cwd: Path | None = None,
        *,
        recorded: Mapping[str, Any] | None = None,
    ) -> EffectiveConfig:
        """``recorded``: the config the launch's attempt printed (read for a launch script's own values)."""
        cmd = command if isinstance(command, LaunchCommand) else parse_command(command)
        eff = cls(cmd, defaults, (cwd or Path.cwd()).resolve())
        eff._load_yaml()
        if cmd.script:
            eff.recorded = recorded
            known = "read from the config its last attempt printed" if recorded else "unknown to it"
            eff.notes.append(
                f"{cmd.entry} is a launch script: the guardian reads the arguments after it; what the script sets "
                f"itself is {known}, and the guardian's overrides are appended after the script's (last wins)"
            )
        return eff

    def _load_yaml(self) -> None:
        cmd = self.command
        if cmd.config_path is None and (cmd.config_name is None or cmd.config_dir is None):
            return  # verl's own config tree (another built-in name is read with verl's defaults)
        name = cmd.config_name or "ppo_trainer"  # verl's @hydra.main default name
        name = name if name.endswith(".yaml") else name + ".yaml"
        tried = [d / name for d in self._search_dirs()]
        path = next((p for p in tried if p.is_file()), None)
        if path is None and cmd.config_path is None:
            return  # --config-dir only adds a search dir: the name may be one of verl's own configs
        if path is None:
            raise PatchError(
                f"config file {name} not found (looked at {', '.join(map(str, tried))}); "
                "give --config-path as an absolute path so the guardian reads what the trainer reads"
            )
        try:  # a SafeLoader subclass; a key given twice is refused, as OmegaConf (so verl) refuses it
            loaded = load_yaml(path.read_text(encoding="utf-8"), f"the run's config file {path}", loader=_LOADER).data
        except OSError as exc:
            raise PatchError(f"cannot read the run's config file {path}: {exc}") from exc
        except YamlError as exc:
            raise PatchError(str(exc)) from None
        self.config_file, self._yaml = path, loaded if isinstance(loaded, dict) else {}
        if self._yaml.get("defaults"):
            self.notes.append(
                f"{path} has a Hydra defaults list {self._yaml['defaults']!r}: only {path.name} itself and verl's "
                "defaults are read, not other files it includes"
            )

    def _search_dirs(self) -> list[Path]:
        """Hydra resolves a relative --config-path against the trainer's file; also try the launch cwd."""
        cmd, dirs = self.command, []
        for raw in (cmd.config_path, cmd.config_dir):
            if raw is None:
                continue
            path = Path(raw).expanduser()
            if path.is_absolute():
                dirs.append(path)
                continue
            if raw is cmd.config_path and (base := _entry_dir(cmd, self.cwd)) is not None:
                dirs.append((base / path).resolve())
            dirs.append((self.cwd / path).resolve())
        return dirs

    def get(self, key: str) -> object:
        """The value ``key`` will have; ``${other.key}`` interpolations resolved. PatchError when unknown."""
        value = self.raw(key)
        if isinstance(value, str):
            for _ in range(8):
                new = _INTERPOLATION.sub(self._interpolate, value)
                if new == value:
                    break
                value = new
        return value

    def _interpolate(self, match: re.Match[str]) -> str:
        try:
            return str(self.raw(match.group(1)))
        except PatchError:
            return match.group(0)  # unknown: left as written

    def raw(self, key: str) -> object:
        for override in reversed(self.command.overrides):
            if override.key == key:
                return None if override.op == "~" else override.value()
        node: Any = self._yaml
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return node
        if self.command.script and self.recorded is not None:
            found, value = _lookup(self.recorded, key)
            if found:
                return value
        if self.command.script:
            raise UnknownKey(
                f"{key}: unknown - {self.command.entry} may set it, and the guardian does not read a script's own "
                f'arguments; pass {key}=VALUE after the script (it forwards "$@", so that value wins)'
            )
        if key in self.defaults:
            return self.defaults[key]
        raise PatchError(f"{key}: not on the command line, not in the config file, and no verl default is known")


def _lookup(tree: Mapping[str, Any], key: str) -> tuple[bool, object]:
    """(True, value) of dotted ``key`` in a nested mapping; (False, None) when a part is missing."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _entry_dir(cmd: LaunchCommand, cwd: Path) -> Path | None:
    """Folder of the trainer's file (module located without importing it)."""
    if cmd.entry.endswith(".py"):
        return (cwd / cmd.entry).resolve().parent
    top, *rest = cmd.entry.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]).joinpath(*rest[:-1]) if locations else None


def effective_value(
    command: LaunchCommand | Sequence[str], key: str, *, defaults: Mapping[str, object], cwd: Path | None = None
) -> object:
    """The value the run will use for ``key`` (see EffectiveConfig); ``~key`` as the last override gives None."""
    return EffectiveConfig.of(command, defaults, cwd).get(key)


def with_overrides(
    command: LaunchCommand | Sequence[str], changes: Mapping[str, object], *, known_keys: Collection[str]
) -> list[str]:
    """The argv with each key in ``changes`` set: its last occurrence replaced in place (earlier ones dropped),
    or appended. ``key=v`` for keys in verl's YAML (``known_keys``), ``++key=v`` otherwise, when the command
    already used ``+``/``++`` for it, or for a launch script (add-or-override works whether or not the key exists,
    even after the script's own ``~key``)."""
    cmd = command if isinstance(command, LaunchCommand) else parse_command(command)
    argv: list[str | None] = list(cmd.argv)
    appended: list[str] = []
    for key, value in changes.items():
        if key.startswith(("+", "~")) or parse_override(f"{key}=x") is None:
            raise PatchError(f"{key!r} is not a plain dotted key; the guardian chooses the '+' prefix itself")
        hits = [(pos, o) for pos, o in zip(cmd.positions, cmd.overrides, strict=True) if o.key == key]
        plus = cmd.script or key not in known_keys or any(o.op in ("+", "++") for _, o in hits)
        text = f"{'++' if plus else ''}{key}={render_value(value)}"
        for pos, _ in hits[:-1]:
            argv[pos] = None
        if hits:
            argv[hits[-1][0]] = text
        else:
            appended.append(text)
    return [a for a in argv if a is not None] + appended
