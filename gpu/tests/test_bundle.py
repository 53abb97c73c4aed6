"""The bundle's real code paths (pip download, sdist build, trimming, manifest, install) on tiny stand-in packages."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from gpu import bundle
from gpu.bundle import BundleError, Requirement


def make_wheel(
    directory: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()
) -> Path:
    """A minimal valid pure-Python wheel (PEP 427), written by hand so that nothing is downloaded."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        **files,
        f"{dist}/METADATA": metadata.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for member, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{member},sha256={digest},{len(data)}")
    record_lines.append(f"{dist}/RECORD,,")
    members[f"{dist}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A local find-links folder: a package, a pinner and the package it pins, and a 'ray' stand-in to trim."""
    folder = tmp_path / "index"
    folder.mkdir()
    make_wheel(folder, "standin-core", "1.0", {"standin_core/__init__.py": b"V = 'wrong'\n"})
    make_wheel(folder, "standin-core", "2.3", {"standin_core/__init__.py": b"V = '2.3'\n"})
    make_wheel(folder, "standin", "0.5", {"standin/__init__.py": b"X = 1\n"}, requires=("standin-core ==2.3",))
    make_wheel(
        folder,
        "fakeray",
        "9.9",
        {
            "fakeray/__init__.py": b"OK = True\n",
            "fakeray/jars/big.jar": b"j" * 50_000,
            "fakeray/dashboard/client/build/app.js": b"js",
            "fakeray/dashboard/client/build/app.js.map": b"m" * 10_000,
            "fakeray/dashboard/api.py": b"API = 1\n",
            "fakeray/util.js.map": b"m",
        },
    )
    return folder


REQS = (
    Requirement("standin==0.5"),
    Requirement("standin-core", pinned_by="standin"),
    Requirement("fakeray==9.9", trim=("fakeray/jars/*", "fakeray/dashboard/client/build/*", "*.js.map")),
)


def build(dest: Path, index: Path, reqs: tuple[Requirement, ...] = REQS) -> list[bundle.Entry]:
    return bundle.build(dest, reqs, pip_args=["--no-index", "--find-links", str(index)])


def test_build_downloads_pins_trims_and_writes_a_matching_manifest(tmp_path: Path, index: Path) -> None:
    dest = tmp_path / "bundle"
    entries = build(dest, index)
    assert [(e.name, e.version) for e in entries] == [("standin", "0.5"), ("standin-core", "2.3"), ("fakeray", "9.9")]
    # the pinned version came from standin's metadata, not the newest/any version in the index
    assert entries[1].file == "standin_core-2.3-py3-none-any.whl"
    assert entries[2].file == "fakeray-9.9-trimmed.tar.xz"
    assert sorted(p.name for p in dest.iterdir()) == sorted([bundle.MANIFEST_NAME, *(e.file for e in entries)])
    manifest = json.loads((dest / bundle.MANIFEST_NAME).read_text())
    for item in manifest["files"]:
        data = (dest / item["file"]).read_bytes()
        assert item["sha256"] == hashlib.sha256(data).hexdigest()
        assert item["size"] == len(data)
    assert manifest["total_bytes"] == sum(e.size for e in entries)
    with tarfile.open(dest / entries[2].file) as tar:
        names = set(tar.getnames())
    assert names >= {"fakeray/__init__.py", "fakeray/dashboard/api.py", "fakeray-9.9.dist-info/METADATA"}
    assert not any("jars" in n or n.endswith(".js.map") or "client/build" in n for n in names)
    assert bundle.verify(dest) == entries


def test_install_gives_importable_packages_in_the_target(tmp_path: Path, index: Path) -> None:
    dest = tmp_path / "bundle"
    build(dest, index)
    site = tmp_path / "site"
    bundle.install(dest, site)
    probe = "import standin, standin_core, fakeray; print(standin.X, standin_core.V, fakeray.OK)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env={"PYTHONPATH": str(site)}, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["1", "2.3", "True"]
    assert not (site / "fakeray" / "jars").exists()
    assert (site / "fakeray-9.9.dist-info" / "METADATA").is_file()


def test_verify_names_the_tampered_missing_and_extra_files(tmp_path: Path, index: Path) -> None:
    dest = tmp_path / "bundle"
    build(dest, index)
    (dest / "standin-0.5-py3-none-any.whl").write_bytes(b"tampered")
    (dest / "standin_core-2.3-py3-none-any.whl").unlink()
    (dest / "stray.whl").write_bytes(b"")
    with pytest.raises(BundleError) as caught:
        bundle.verify(dest)
    message = str(caught.value)
    assert "standin-0.5-py3-none-any.whl: size" in message
    assert "standin_core-2.3-py3-none-any.whl: in the manifest but missing" in message
    assert "stray.whl: in the folder but not in the manifest" in message


def test_a_requirement_missing_from_the_index_names_the_requirement(tmp_path: Path, index: Path) -> None:
    with pytest.raises(BundleError, match=r"nosuchpkg==1\.0"):
        build(tmp_path / "bundle", index, (Requirement("nosuchpkg==1.0"),))


def test_a_pin_without_its_pinner_is_refused(tmp_path: Path, index: Path) -> None:
    with pytest.raises(BundleError, match="pinned by standin, which is not fetched before it"):
        build(tmp_path / "bundle", index, (Requirement("standin-core", pinned_by="standin"),))


def test_build_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path, index: Path) -> None:
    dest = tmp_path / "bundle"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(BundleError, match=r"notes\.txt"):
        build(dest, index)
    assert (dest / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools for --no-build-isolation")
def test_sdist_only_requirement_is_built_into_a_wheel(tmp_path: Path, index: Path) -> None:
    source = tmp_path / "standin_sdist-1.0"
    (source / "standin_sdist").mkdir(parents=True)
    (source / "standin_sdist" / "__init__.py").write_text("Y = 2\n")
    (source / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='standin-sdist', version='1.0', packages=['standin_sdist'])\n"
    )
    (source / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: standin-sdist\nVersion: 1.0\n")
    with tarfile.open(index / "standin_sdist-1.0.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=source.name)
    dest = tmp_path / "bundle"
    entries = bundle.build(
        dest,
        (Requirement("standin-sdist==1.0", build_from_sdist=True),),
        pip_args=["--no-index", "--find-links", str(index), "--no-build-isolation"],
    )
    assert [(e.name, e.version) for e in entries] == [("standin-sdist", "1.0")]
    assert entries[0].file.endswith("-py3-none-any.whl")


def test_size_check_counts_the_tree_with_the_bundle() -> None:
    bundle.check_size(40 * bundle.MIB, 20 * bundle.MIB)
    with pytest.raises(BundleError, match=r"bundle 50\.0 MiB \+ working tree 20\.0 MiB = 70\.0 MiB exceeds"):
        bundle.check_size(50 * bundle.MIB, 20 * bundle.MIB)


def test_tree_bytes_counts_tracked_and_untracked_but_not_ignored_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("ignored/\n")  # 9 bytes
    (repo / "kept.txt").write_bytes(b"x" * 100)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_bytes(b"y" * 10_000)
    assert bundle.tree_bytes(repo) == 109


def test_the_real_requirement_list_is_well_formed() -> None:
    names = [r.name for r in bundle.REQUIREMENTS]
    assert len(names) == len(set(names))
    assert {"verl", "ray", "hydra-core", "transferqueue", "antlr4-python3-runtime"} <= set(names)
    for requirement in bundle.REQUIREMENTS:
        if requirement.pinned_by is not None:
            assert names.index(bundle.canonical(requirement.pinned_by)) < names.index(requirement.name)
    ray = next(r for r in bundle.REQUIREMENTS if r.name == "ray")
    assert "ray/rllib/*" in ray.trim and "ray/jars/*" in ray.trim


def test_tree_bytes_allocated_counts_whole_blocks(tmp_path: Path) -> None:
    """The device call's carry limit counts files as on disk: a 100-byte file takes a whole block."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "kept.txt").write_bytes(b"x" * 100)
    allocated = bundle.tree_bytes(repo, allocated=True)
    assert allocated == bundle.on_disk(repo / "kept.txt") >= 100
    assert allocated == max(100, (repo / "kept.txt").stat().st_blocks * 512)


def test_trim_leaves_named_requirements_out_of_a_built_bundle(tmp_path: Path) -> None:
    dest = tmp_path / "bundle"
    dest.mkdir()
    entries = []
    for name in ("keep-me", "qh3", "bm25s"):
        path = dest / f"{name}-1.0-py3-none-any.whl"
        path.write_bytes(name.encode() * 10)
        entries.append(bundle.Entry(name, "1.0", path.name, bundle.sha256_of(path), path.stat().st_size))
    bundle.write_manifest(dest, entries)
    assert bundle.main(["--dest", str(dest), "trim", "qh3", "BM25S"]) in (0, 1)  # 1 only if the tree is too big
    assert [e.name for e in bundle.verify(dest)] == ["keep-me"]
    assert sorted(p.name for p in dest.iterdir()) == ["keep-me-1.0-py3-none-any.whl", "manifest.json"]
    with pytest.raises(BundleError, match="not in the bundle: qh3"):
        bundle.trim(dest, ["qh3"])


def test_a_packed_requirement_ships_whole_as_tar_xz_and_installs(tmp_path: Path, index: Path) -> None:
    dest = tmp_path / "bundle"
    entries = build(dest, index, (Requirement("standin==0.5", pack=True),))
    assert [e.file for e in entries] == ["standin-0.5-trimmed.tar.xz"]
    with zipfile.ZipFile(next(index.glob("standin-0.5-*.whl"))) as wheel:
        members = {i.filename for i in wheel.infolist() if not i.is_dir()}
    with tarfile.open(dest / entries[0].file) as tar:
        assert set(tar.getnames()) == members
    site = tmp_path / "site"
    bundle.install(dest, site)
    out = subprocess.run(
        [sys.executable, "-c", "import standin; print(standin.X)"],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"
