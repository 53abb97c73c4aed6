"""Prepare the wheel bundle that carries verl 0.9.1's missing dependencies to a GPU machine without network.

Run on a machine with registry access::

    python -m gpu.bundle build            # into gpu/.bundle (git-ignored)
    python -m gpu.bundle check            # verify the manifest and the carry-size budget

and on the GPU machine::

    python -m gpu.bundle install --target /tmp/site

The bundle holds one wheel per requirement (``pip download --no-deps`` for the GPU machine's Python and platform),
a pure-Python wheel built from an sdist where PyPI has no wheel (antlr4-python3-runtime 4.9.3), Ray as a trimmed
``.tar.xz`` (its wheel alone would use most of the carry budget), and ``manifest.json`` with the name, version,
sha256 and size of every file. Standard library only: it must run before anything is installed.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from email.parser import Parser
from pathlib import Path

MIB = 1024 * 1024
CARRY_LIMIT_BYTES = 64 * MIB
"""What one device call carries: the working tree and the paths named in ``carry`` together."""

DEFAULT_DEST = Path(__file__).resolve().parent / ".bundle"
MANIFEST_NAME = "manifest.json"

# The GPU machine: Python 3.12 on x86-64 Linux, torch/transformers/numpy already installed there.
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


class BundleError(RuntimeError):
    """A bundle step failed; the message names the file or requirement and what is wrong."""


@dataclass(frozen=True)
class Requirement:
    """One entry of the bundle.

    ``spec`` is a pip requirement. ``pinned_by`` names an earlier entry whose wheel metadata pins this one exactly
    (pydantic pins pydantic-core): the version is read from that wheel, so ``--no-deps`` cannot pair mismatched
    versions. ``build_from_sdist`` builds a wheel locally (PyPI has only an sdist). ``trim`` ships the wheel
    unpacked as ``.tar.xz`` without the members matching these patterns; ``pack`` ships it as ``.tar.xz`` whole
    (xz takes about a third off a large wheel's zip, and the carry limit counts the bundle with the working tree).
    """

    spec: str
    pinned_by: str | None = None
    build_from_sdist: bool = False
    trim: tuple[str, ...] = ()
    pack: bool = False

    @property
    def name(self) -> str:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.spec)
        if match is None:
            raise BundleError(f"requirement {self.spec!r}: no package name")
        return canonical(match.group(0))


RAY_TRIM = (
    "ray/jars/*",
    "ray/rllib/*",
    "ray/dashboard/client/build/*",
    "*.js.map",
    # libraries on top of Ray core that neither verl nor Ray core imports
    *(f"ray/{library}/*" for library in ("air", "data", "llm", "serve", "train", "tune")),
)

# What verl 0.9.1's trainer (V1, FSDP, Ray, TransferQueue, Hydra) and the guardian need beyond the GPU machine's
# own packages.
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("verl==0.9.1", pack=True),
    Requirement("hydra-core==1.3.2"),
    Requirement("omegaconf==2.3.0"),
    # sdist only on PyPI; 4.13 does not work with hydra 1.3
    Requirement("antlr4-python3-runtime==4.9.3", build_from_sdist=True),
    Requirement("codetiming"),
    Requirement("tensordict==0.10.0"),
    Requirement("pyvers==0.1.0"),
    Requirement("orjson"),
    Requirement("importlib-metadata"),
    Requirement("torchdata==0.11.0"),
    Requirement("pylatexenc"),
    Requirement("dill"),
    Requirement("datasets==5.2.0"),
    Requirement("multiprocess"),
    Requirement("pydantic>=2.14,<2.15"),
    Requirement("pydantic-core", pinned_by="pydantic", pack=True),
    Requirement("annotated-types"),
    Requirement("typing-inspection"),
    # Ray imports jsonschema
    Requirement("jsonschema"),
    Requirement("jsonschema-specifications"),
    Requirement("referencing"),
    Requirement("rpds-py"),
    Requirement("transferqueue==0.1.11"),
    Requirement("pyzmq"),
    Requirement("msgspec"),
    Requirement("cachetools"),
    Requirement("uvicorn"),
    Requirement("fastapi<0.137"),
    Requirement("starlette"),
    Requirement("ray==2.60.0", trim=RAY_TRIM),
    # the guardian's own dependencies the GPU machine lacks (it has rich, PyYAML, numpy, prometheus-client, requests)
    Requirement("SQLAlchemy>=2.0.30,<2.2", pack=True),
    Requirement("alembic>=1.13"),
    Requirement("Mako"),
    Requirement("grafana-client>=5.1.4,<6"),
    Requirement("verlib2"),
    Requirement("niquests>=3.4,<4"),
    Requirement("wassima"),
    Requirement("jh2"),
    Requirement("qh3"),
    # without its copy of ``urllib3/``, which would shadow the machine's urllib3 (what URLLIB3_NO_OVERRIDE does)
    Requirement("urllib3-future", trim=("urllib3/*",)),
    # the search recipe's retrieval (recipe/search): the machine has numpy, scipy, numba and tqdm
    Requirement("bm25s==0.3.16"),
    Requirement("PyStemmer>=2.2"),
)


@dataclass(frozen=True)
class Entry:
    """One file of the bundle, as the manifest records it."""

    name: str
    version: str
    file: str
    sha256: str
    size: int


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    """Name and version from a wheel's file name (PEP 427: ``{name}-{version}(-{build})?-{py}-{abi}-{plat}.whl``)."""
    parts = wheel.name.removesuffix(".whl").split("-")
    if not wheel.name.endswith(".whl") or len(parts) not in (5, 6):
        raise BundleError(f"{wheel}: not a wheel file name")
    return canonical(parts[0]), parts[1]


def wheel_metadata(wheel: Path) -> dict[str, list[str]]:
    """The ``METADATA`` headers of a wheel (multi-valued headers such as Requires-Dist as lists)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise BundleError(f"{wheel}: expected one *.dist-info/METADATA, found {len(names)}")
            text = archive.read(names[0]).decode("utf-8")
    except zipfile.BadZipFile as exc:
        raise BundleError(f"{wheel}: not a zip archive ({exc})") from exc
    message = Parser().parsestr(text, headersonly=True)
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(str(value))
    return headers


def exact_pin(wheel: Path, dependency: str) -> str:
    """The version ``wheel`` pins ``dependency`` to (``Requires-Dist: dependency==X``)."""
    wanted = canonical(dependency)
    for requirement in wheel_metadata(wheel).get("Requires-Dist", []):
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?\s*==\s*([^\s,;)]+)", requirement)
        if match and canonical(match.group(1)) == wanted:
            return match.group(2)
    raise BundleError(f"{wheel.name}: no exact pin of {dependency} in Requires-Dist")


def trim_wheel(wheel: Path, out_dir: Path, exclude: Sequence[str]) -> Path:
    """Repack ``wheel`` as ``{name}-{version}-trimmed.tar.xz`` without the members matching ``exclude``.

    The archive holds the wheel's members at their install paths (packages and ``*.dist-info``), so extracting it
    into a ``--target`` folder is the same as a ``pip install --target`` of the wheel minus the trimmed files.
    """
    name, version = wheel_name_version(wheel)
    out = out_dir / f"{name}-{version}-trimmed.tar.xz"
    kept = 0
    with zipfile.ZipFile(wheel) as archive, tarfile.open(out, "w:xz", preset=6) as tar:
        for info in archive.infolist():
            if info.is_dir() or any(fnmatch.fnmatch(info.filename, pattern) for pattern in exclude):
                continue
            member = tarfile.TarInfo(info.filename)
            member.size = info.file_size
            member.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            with archive.open(info) as source:
                tar.addfile(member, source)
            kept += 1
    if kept == 0:
        out.unlink()
        raise BundleError(f"{wheel}: every member matched the trim patterns {list(exclude)}")
    return out


def extract_trimmed(archive: Path, target: Path) -> None:
    """Extract a trimmed ``.tar.xz`` into ``target`` (refusing members that would land outside it)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            destination = (target / member.name).resolve()
            if not member.isfile() or not destination.is_relative_to(target.resolve()):
                raise BundleError(f"{archive}: member {member.name!r} is not a plain file inside the target")
        tar.extractall(target, filter="data")


def _pip(args: Sequence[str]) -> None:
    command = [sys.executable, "-m", "pip", *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BundleError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stderr.strip()[-2000:]}")


def _single_new_file(directory: Path, before: set[Path], what: str) -> Path:
    new = sorted(set(directory.iterdir()) - before)
    if len(new) != 1:
        raise BundleError(f"{what}: expected one new file in {directory}, found {[p.name for p in new]}")
    return new[0]


def fetch_wheel(
    spec: str,
    dest: Path,
    *,
    build_from_sdist: bool,
    pip_args: Sequence[str],
    python_version: str = TARGET_PYTHON,
    platforms: Sequence[str] = TARGET_PLATFORMS,
) -> Path:
    """Download (or build from its sdist) the one wheel of ``spec`` into ``dest``; return its path."""
    with tempfile.TemporaryDirectory(prefix="bundle-") as scratch_name:
        scratch = Path(scratch_name)
        if build_from_sdist:
            _pip(["wheel", "--quiet", "--no-deps", "--no-binary", ":all:", "-w", str(scratch), *pip_args, spec])
        else:
            platform_args = [arg for platform in platforms for arg in ("--platform", platform)]
            _pip(
                [
                    "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--python-version", python_version, *platform_args,
                    "-d", str(scratch), *pip_args, spec,
                ]
            )  # fmt: skip
        wheel = _single_new_file(scratch, set(), spec)
        wheel_name_version(wheel)  # a wheel, not an sdist
        final = dest / wheel.name
        wheel.replace(final)
        return final


def entry_for(path: Path) -> Entry:
    if path.name.endswith(".whl"):
        name, version = wheel_name_version(path)
    else:
        match = re.fullmatch(r"(.+)-([^-]+)-trimmed\.tar\.xz", path.name)
        if match is None:
            raise BundleError(f"{path}: neither a wheel nor a *-trimmed.tar.xz")
        name, version = match.group(1), match.group(2)
    return Entry(name=name, version=version, file=path.name, sha256=sha256_of(path), size=path.stat().st_size)


def build(
    dest: Path,
    requirements: Sequence[Requirement] = REQUIREMENTS,
    *,
    pip_args: Sequence[str] = (),
    skip: Sequence[str] = (),
    python_version: str = TARGET_PYTHON,
    platforms: Sequence[str] = TARGET_PLATFORMS,
) -> list[Entry]:
    """Fill ``dest`` with the bundle of ``requirements`` (minus the names in ``skip``) and write its manifest.

    ``dest`` must be empty or hold only an earlier bundle: its files are replaced, not merged.
    """
    dest.mkdir(parents=True, exist_ok=True)
    strays = [p.name for p in dest.iterdir() if not (p.name.endswith((".whl", ".tar.xz")) or p.name == MANIFEST_NAME)]
    if strays:
        raise BundleError(f"{dest}: holds files that are not a bundle's: {strays}")
    for old in dest.iterdir():
        old.unlink()
    skipped = {canonical(name) for name in skip}
    fetched: dict[str, Path] = {}
    entries: list[Entry] = []
    for requirement in requirements:
        if requirement.name in skipped:
            continue
        spec = requirement.spec
        if requirement.pinned_by is not None:
            pinner = fetched.get(canonical(requirement.pinned_by))
            if pinner is None:
                raise BundleError(f"{spec}: pinned by {requirement.pinned_by}, which is not fetched before it")
            spec = f"{requirement.name}=={exact_pin(pinner, requirement.name)}"
        wheel = fetch_wheel(
            spec,
            dest,
            build_from_sdist=requirement.build_from_sdist,
            pip_args=pip_args,
            python_version=python_version,
            platforms=platforms,
        )
        fetched[requirement.name] = wheel
        if requirement.trim or requirement.pack:
            shipped = trim_wheel(wheel, dest, requirement.trim)
            wheel.unlink()
        else:
            shipped = wheel
        entries.append(entry_for(shipped))
    write_manifest(dest, entries)
    return entries


def write_manifest(dest: Path, entries: Sequence[Entry]) -> Path:
    path = dest / MANIFEST_NAME
    body = {"files": [asdict(e) for e in entries], "total_bytes": sum(e.size for e in entries)}
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(dest: Path) -> list[Entry]:
    path = dest / MANIFEST_NAME
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        return [Entry(**item) for item in body["files"]]
    except FileNotFoundError as exc:
        raise BundleError(f"{path}: no manifest (run `python -m gpu.bundle build` first)") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{path}: not a bundle manifest ({exc})") from exc


def verify(dest: Path) -> list[Entry]:
    """Check every manifest entry against the file beside it; an extra or missing file is an error too."""
    entries = read_manifest(dest)
    problems: list[str] = []
    listed = {e.file for e in entries}
    for extra in sorted(p.name for p in dest.iterdir() if p.name != MANIFEST_NAME and p.name not in listed):
        problems.append(f"{extra}: in the folder but not in the manifest")
    for entry in entries:
        path = dest / entry.file
        if not path.is_file():
            problems.append(f"{entry.file}: in the manifest but missing")
        elif path.stat().st_size != entry.size:
            problems.append(f"{entry.file}: size {path.stat().st_size} != manifest {entry.size}")
        elif sha256_of(path) != entry.sha256:
            problems.append(f"{entry.file}: sha256 differs from the manifest")
    if problems:
        raise BundleError(f"{dest}: bundle does not match its manifest:\n  " + "\n  ".join(problems))
    return entries


def on_disk(path: Path) -> int:
    """What a file uses on disk (whole blocks, as ``du`` counts): the device call's carry limit counts this, not
    the files' lengths - a tree of many small files weighs more than its bytes."""
    st = path.stat()
    return max(st.st_size, st.st_blocks * 512)


def tree_bytes(repo: Path, *, allocated: bool = False) -> int:
    """Bytes of what a device call copies of the working tree: tracked files and untracked ones git does not ignore
    (``allocated``: counted as on disk)."""
    result = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise BundleError(f"git ls-files in {repo} failed: {result.stderr.decode(errors='replace').strip()}")
    total = 0
    for name in result.stdout.decode().split("\0"):
        path = repo / name
        if name and path.is_file() and not path.is_symlink():
            total += on_disk(path) if allocated else path.stat().st_size
    return total


def trim(dest: Path, names: Sequence[str]) -> list[Entry]:
    """Leave requirements out of a built bundle (their files removed, the manifest rewritten): for a call that does
    not load them, when the bundle and the working tree no longer fit the carry limit together."""
    entries = verify(dest)
    gone = {canonical(name) for name in names}
    unknown = gone - {e.name for e in entries}
    if unknown:
        raise BundleError(f"not in the bundle: {', '.join(sorted(unknown))}")
    for e in entries:
        if e.name in gone:
            (dest / e.file).unlink()
    kept = [e for e in entries if e.name not in gone]
    write_manifest(dest, kept)
    return kept


def check_size(bundle_bytes: int, tree: int, limit: int = CARRY_LIMIT_BYTES) -> None:
    """Refuse a bundle that does not fit the carry limit together with the working tree."""
    if bundle_bytes + tree > limit:
        raise BundleError(
            f"bundle {bundle_bytes / MIB:.1f} MiB + working tree {tree / MIB:.1f} MiB = "
            f"{(bundle_bytes + tree) / MIB:.1f} MiB exceeds the carry limit of {limit / MIB:.0f} MiB"
        )


def install(dest: Path, target: Path) -> list[Entry]:
    """On the GPU machine: verify the bundle, ``pip install --no-index --no-deps --target`` its wheels, extract the
    trimmed archives into the same folder. Put ``target`` on PYTHONPATH afterwards."""
    entries = verify(dest)
    wheels = [str(dest / e.file) for e in entries if e.file.endswith(".whl")]
    if wheels:
        _pip(["install", "--quiet", "--no-index", "--no-deps", "--target", str(target), *wheels])
    for entry in entries:
        if entry.file.endswith(".tar.xz"):
            extract_trimmed(dest / entry.file, target)
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu.bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="bundle folder (default gpu/.bundle)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="download/build the bundle and write its manifest")
    p_build.add_argument("--skip", action="append", default=[], help="leave a requirement out (e.g. ray)")
    p_build.add_argument("--pip-arg", action="append", default=[], help="extra argument for pip (index options)")
    sub.add_parser("check", help="verify the manifest and the carry-size budget")
    p_trim = sub.add_parser("trim", help="leave requirements out of a built bundle (e.g. qh3 bm25s pystemmer)")
    p_trim.add_argument("names", nargs="+")
    p_install = sub.add_parser("install", help="install the bundle into a --target folder (GPU machine)")
    p_install.add_argument("--target", type=Path, required=True)
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    try:
        if args.command == "build":
            entries = build(args.dest, pip_args=args.pip_arg, skip=args.skip)
        elif args.command == "check":
            entries = verify(args.dest)
        elif args.command == "trim":
            entries = trim(args.dest, args.names)
        else:
            entries = install(args.dest, args.target)
        total = sum(e.size for e in entries)
        if args.command != "install":
            check_size(sum(on_disk(args.dest / e.file) for e in entries), tree_bytes(repo, allocated=True))
    except BundleError as exc:
        print(f"gpu.bundle {args.command}: {exc}", file=sys.stderr)
        return 1
    print(f"gpu.bundle {args.command}: {len(entries)} files, {total / MIB:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
