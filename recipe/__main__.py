"""``python -m recipe [run.sh options]``: the recipe's ``run.sh``, run from where the package is installed
(``pip install 'verl-guardian[recipe]'``) or from a checkout.

The script runs with ``PYTHON`` set to this interpreter (unless already set) and this environment's scripts folder
first on ``PATH``, so every step, ``guardian`` and ``ray`` come from the environment the recipe was installed into,
activated or not. Data and outputs default to the current folder (``run.sh --help``).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

RUN_SH = Path(__file__).resolve().with_name("run.sh")


def command(argv: Sequence[str], environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The ``bash run.sh ...`` argv and its environment."""
    bash = shutil.which("bash", path=environ.get("PATH"))
    if bash is None:
        raise SystemExit("python -m recipe: bash not found on PATH (run.sh is a bash script)")
    if not RUN_SH.is_file():
        raise SystemExit(f"python -m recipe: {RUN_SH} is missing: reinstall verl-guardian[recipe]")
    env = dict(environ)
    env.setdefault("PYTHON", sys.executable)
    scripts = sysconfig.get_path("scripts")
    env["PATH"] = os.pathsep.join([scripts, env["PATH"]]) if env.get("PATH") else scripts
    return [bash, str(RUN_SH), *argv], env


def main(argv: Sequence[str] | None = None) -> None:
    """Replace this process with run.sh (its traps then see Ctrl-C and stop what it started)."""
    args, env = command(sys.argv[1:] if argv is None else argv, dict(os.environ))
    os.execve(args[0], args, env)


if __name__ == "__main__":
    main()
