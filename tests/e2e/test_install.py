"""The project as a user installs it: a wheel built from this checkout, in a fresh venv (issue 25, item 7).

The slow tests build the wheel from a copy of the checkout's files (what git tracks or would track: the build's
``build/`` and ``*.egg-info`` never land in the tree), install it with the ``recipe`` extra into a new venv from the
package registry (and alone, the core, into another: ``guardian demo`` runs without any extra), and run, from outside
the checkout and with nothing of it on the path: ``guardian demo``, the recipe's ``run.sh --dry-run`` (``python -m
recipe``), and its data, index and retrieval-server steps on the repository's samples. verl is not installed there
(it is the user's), so a real ``run.sh`` must stop at once saying so. The install needs the registry: skipped
locally when it cannot be reached, failed in CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import venv
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import fixture_path, missing
from packaging.requirements import Requirement

from recipe import preflight

ROOT = Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "recipe" / "run.sh"
# pip's words when the registry cannot be reached (then skipped locally; in CI the registry is reachable)
OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|Connection refused|Read timed out"
)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without anything that points at the checkout or the dev venv, or a guardian or
    recipe setting: only the system's own commands on PATH and ``home`` as HOME."""
    dropped = ("PYTHON", "VIRTUAL_ENV", "CONDA", "GUARDIAN_", "RECIPE_", "XDG_", "VERL_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    return {**env, "PATH": "/usr/bin:/bin", "HOME": str(home), **extra}


def run(argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False, stdin=None
    )


def checkout_copy(dest: Path) -> Path:
    """The checkout's files as a build sees them (tracked, and untracked ones git does not ignore) copied to
    ``dest``, so that building leaves nothing in the checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        missing(f"{ROOT} is not a git checkout (the wheel is built from its files as git lists them)")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a tracked file deleted in the work tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@dataclass(frozen=True)
class Installed:
    venv: Path
    python: Path
    site_packages: Path
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(self.home, **extra)

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout."""
    base = tmp_path_factory.mktemp("wheel")
    source = checkout_copy(base / "src")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"]
    built = run(
        [*pip_wheel, "--wheel-dir", str(base / "dist"), str(source)],
        cwd=base,
        env=os.environ,
        timeout=300,
    )
    assert built.returncode == 0, f"building the wheel failed:\n{built.stdout}\n{built.stderr}"
    (found,) = (base / "dist").glob("verl_guardian-*.whl")
    return found


def install(base: Path, requirement: str) -> Installed:
    """A fresh venv under ``base`` with ``requirement`` (the wheel, with or without extras) installed from the
    package registry; skipped locally when the registry cannot be reached."""
    venv.EnvBuilder(with_pip=True).create(base / "venv")
    python = base / "venv" / "bin" / "python"
    # the ordinary environment (pip's cache, its registry settings), but nothing of the checkout on the path
    pip_env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installing = run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement],
        cwd=base,
        env=pip_env,
        timeout=900,
    )
    output = installing.stdout + installing.stderr
    if installing.returncode != 0 and OFFLINE.search(output) and not os.environ.get("CI"):
        pytest.skip(
            f"the package registry cannot be reached, so the wheel's dependencies cannot be installed:\n{output}"
        )
    assert installing.returncode == 0, f"pip install {Path(requirement).name} failed:\n{output}"

    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        cwd=base,
        env=clean_env(base),
        timeout=60,
    )
    home = base / "home"
    home.mkdir()
    return Installed(base / "venv", python, Path(site.stdout.strip()), home)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel with the recipe extra."""
    return install(tmp_path_factory.mktemp("install"), f"{wheel}[recipe]")


@pytest.fixture(scope="module")
def core_installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel alone: the core, no extra."""
    return install(tmp_path_factory.mktemp("core"), str(wheel))


@pytest.mark.slow
def test_the_installed_packages_are_the_wheels_not_the_checkouts(installed: Installed, tmp_path: Path) -> None:
    found = run(
        [str(installed.python), "-c", "import guardian, recipe; print(guardian.__file__); print(recipe.__file__)"],
        cwd=tmp_path,
        env=installed.env(),
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    for line in found.stdout.splitlines():
        assert Path(line).is_relative_to(installed.site_packages), line


@pytest.mark.slow
def test_guardian_demo_runs_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    demo = run([installed.bin("guardian"), "demo"], cwd=tmp_path, env=installed.env(), timeout=600)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    incidents = run([installed.bin("guardian"), "incidents", "list"], cwd=tmp_path, env=installed.env(), timeout=120)
    assert incidents.returncode == 0, incidents.stderr
    assert "entropy_collapse" in incidents.stdout  # the demo's incident, in the store the installed package made


# what the extras bring (pyproject.toml's [project.optional-dependencies]); none of it comes with the core
EXTRAS_MODULES = ("psycopg", "grafana_client", "niquests", "wandb", "ray", "bm25s", "fastapi", "pyarrow")


@pytest.mark.slow
def test_the_core_alone_runs_the_demo_without_any_extra(core_installed: Installed, tmp_path: Path) -> None:
    """``pip install verl-guardian`` with no extra: the guard path, the SQLite store and the exporter work, and no
    package of an extra was installed."""
    probe = "import importlib.util as u; print(' '.join(m for m in {mods} if u.find_spec(m) is not None))"
    found = run(
        [str(core_installed.python), "-c", probe.format(mods=EXTRAS_MODULES)],
        cwd=tmp_path,
        env=core_installed.env(),
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [], f"the core install brought packages of extras: {found.stdout}"

    guardian = core_installed.bin("guardian")
    demo = run([guardian, "demo"], cwd=tmp_path, env=core_installed.env(), timeout=600)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    incidents = run([guardian, "incidents", "list"], cwd=tmp_path, env=core_installed.env(), timeout=120)
    assert incidents.returncode == 0, incidents.stderr
    assert "entropy_collapse" in incidents.stdout

    # an extra's feature asked for without it: one line naming the extra, no traceback
    pg = "postgresql+psycopg://me:secret@127.0.0.1:1/guardian"
    listed = run([guardian, "incidents", "list"], cwd=tmp_path, env=core_installed.env(GUARDIAN_DB_URL=pg), timeout=120)
    assert listed.returncode != 0
    assert "pip install 'verl-guardian[postgres]'" in listed.stderr and "Traceback" not in listed.stderr, listed.stderr
    push = run(
        [guardian, "dashboards", "push", "--url", "http://127.0.0.1:1"],
        cwd=tmp_path,
        env=core_installed.env(),
        timeout=120,
    )
    assert push.returncode == 1
    assert "pip install 'verl-guardian[grafana]'" in push.stderr and "Traceback" not in push.stderr, push.stderr


def final_command(stdout: str) -> list[str]:
    import shlex

    lines = [line for line in stdout.splitlines() if line.startswith("run.sh: + ")]
    return shlex.split(lines[-1].removeprefix("run.sh: + "))


@pytest.mark.slow
def test_recipe_run_sh_dry_run_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    work = tmp_path / "work"  # an empty folder outside the checkout
    work.mkdir()
    # python -m recipe, the venv not activated: the launcher puts the venv's python and scripts in front
    result = run(
        [str(installed.python), "-m", "recipe", "--dry-run", "trainer.total_training_steps=5"],
        cwd=work,
        env=installed.env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    steps = [line.split()[2] for line in out.splitlines() if line.startswith("run.sh: step ")]
    assert steps == [f"{i}/7" for i in range(1, 8)]
    # the recipe's dependencies came with the extra; verl is the user's (not in this venv)
    assert f"+ {installed.python} -m recipe.preflight" in out
    assert "dependencies are missing" not in out
    assert f"verl is not installed in {installed.python}" in out
    for step in ("recipe.prepare_data", "recipe.search.index", "recipe.search.server"):
        assert f"+ {installed.python} -m {step} " in out, step

    cmd = final_command(out)
    assert cmd[:5] == ["guardian", "run", "--", str(installed.python), "-m"]
    config_dir = Path(cmd[cmd.index("--config-path") + 1])
    assert config_dir == installed.site_packages / "recipe" / "configs"
    assert {p.name for p in config_dir.glob("*.yaml")} >= {"grpo_qwen7b.yaml", "grpo_collapse_demo.yaml"}
    env_vars = {
        arg.split("=", 1)[0].rsplit(".", 1)[1]: arg.split("=", 1)[1].strip("'")
        for arg in cmd
        if arg.startswith("++ray_kwargs.ray_init.runtime_env.env_vars.")
    }
    # the configs' ${oc.env:RECIPE_ROOT}/recipe/... files are in the installed package
    recipe_root = Path(env_vars["RECIPE_ROOT"])
    assert recipe_root == installed.site_packages
    for shipped in ("recipe/reward.py", "recipe/configs/agent_loops.yaml", "recipe/configs/search_tool.yaml"):
        assert (recipe_root / shipped).is_file(), shipped
    assert "PYTHONPATH" not in env_vars  # site-packages is not put in front of the standard library
    # data and outputs default to the working folder, not site-packages; a dry run writes nothing
    assert env_vars["RECIPE_OUT"] == str(work / "outputs")
    assert f"trainer.default_local_dir={work}/outputs/checkpoints/search_agent/qwen7b_grpo" in cmd
    assert cmd[-1] == "trainer.total_training_steps=5"
    assert list(work.iterdir()) == []

    # a real run on a node without verl stops before any step, saying what is missing
    fake_bin = installed.home / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    nvidia_smi = fake_bin / "nvidia-smi"
    nvidia_smi.write_text('#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done\n')
    nvidia_smi.chmod(0o755)
    real = run(
        [str(installed.python), "-m", "recipe"],
        cwd=work,
        env=installed.env(PATH=f"{fake_bin}:/usr/bin:/bin"),
        timeout=120,
    )
    assert real.returncode == 1, real.stdout + real.stderr
    assert "found 8 GPU(s)" in real.stdout
    assert f"error: verl is not installed in {installed.python}" in real.stderr
    assert "step 2/7" not in real.stdout
    assert list(work.iterdir()) == []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def server_stopper() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.mark.slow
def test_recipe_steps_run_from_the_wheel_with_only_the_extra(
    installed: Installed, tmp_path: Path, server_stopper: list[subprocess.Popen[str]]
) -> None:
    """run.sh's data, index and retrieval steps, as it runs them, on the repository's samples."""
    env = installed.env()
    data, index = tmp_path / "data", tmp_path / "index"
    hotpot = str(fixture_path("recipe", "hotpotqa_train_100.json"))
    corpus = str(fixture_path("recipe", "wiki18_sample_1000.jsonl"))
    prepared = run(
        [str(installed.python), "-m", "recipe.prepare_data", "--out", str(data), "--hotpotqa", hotpot],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert prepared.returncode == 0, prepared.stderr
    assert (data / "train.parquet").is_file() and (data / "val.parquet").is_file()
    built = run(
        [str(installed.python), "-m", "recipe.search.index", "--out", str(index), "--corpus", corpus],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    assert "passages=1000" in built.stderr + built.stdout

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [str(installed.python), "-m", "recipe.search.server", "--index", str(index), "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    server_stopper.append(server)
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, f"the retrieval server exited ({server.returncode}):\n{log.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no /health answer in 120 s:\n{log.read_text()}"
        time.sleep(0.5)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/retrieve",
        data=json.dumps({"queries": ["film"], "topk": 1}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert len(answer["result"]) == 1 and answer["result"][0][0]["document"]["contents"]


# ------------------------------------------------------------------------------------------------ fast


def test_the_preflight_list_is_the_recipe_extra() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["recipe"]
    assert {Requirement(spec).name for spec in extra} == set(preflight.REQUIREMENTS.values())
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert "verl-guardian[all]" in dev  # the tests run the recipe and every other extra


def test_run_sh_stops_at_once_when_the_python_lacks_the_recipes_dependencies(tmp_path: Path) -> None:
    """A real run from the checkout with a bare Python (no bm25s, no verl): one error naming them and the install,
    before any step that would write or start something."""
    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    bare = tmp_path / "bare" / "bin" / "python"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text('#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: H100"; done\n')
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = clean_env(
        tmp_path,
        PATH=f"{fake_bin}:/usr/bin:/bin",
        PYTHON=str(bare),
        RECIPE_DATA=str(tmp_path / "data"),
        RECIPE_OUT=str(tmp_path / "out"),
        RECIPE_INDEX=str(tmp_path / "index"),
        RECIPE_CORPUS=str(tmp_path / "wiki-18.jsonl"),
    )
    result = run(["bash", str(RUN_SH)], cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Stemmer (PyStemmer)" in result.stderr and "-m pip install 'verl-guardian[recipe]'" in result.stderr
    assert f"verl is not installed in {bare}" in result.stderr
    assert "step 2/7" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "bin"]

    result = run(["bash", str(RUN_SH)], cwd=tmp_path, env={**env, "PYTHON": "no-such-python"}, timeout=60)
    assert result.returncode == 1
    assert "PYTHON=no-such-python is not a command here" in result.stderr
