"""``python -m guardian.hydra_compose``: compose one override list with a Hydra config tree, in a child interpreter.

Reads ``{"config_dir", "config_name", "overrides"}`` as JSON on stdin. Exit 0: composed; exit 2: Hydra refused,
the reason on stdout. ``verl_keys.compose_check`` runs it so that Hydra's compose and verl's config tree (several
MB) never stay in a guardian's memory for the rest of its run."""

from __future__ import annotations

import sys
from typing import Any

import orjson

REFUSED = 2


def compose(config_dir: str, config_name: str, overrides: list[str]) -> str | None:
    """None when ``overrides`` compose with the tree; else Hydra's reason, on one line."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
            hydra.compose(config_name=config_name, overrides=overrides)
    except Exception as exc:  # Hydra raises several exception types; all mean "refused"
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def main() -> int:
    request: Any = orjson.loads(sys.stdin.buffer.read())
    refused = compose(str(request["config_dir"]), str(request["config_name"]), [str(o) for o in request["overrides"]])
    if refused is None:
        return 0
    sys.stdout.write(refused + "\n")
    return REFUSED


if __name__ == "__main__":
    sys.exit(main())
