"""The run's length from the config verl ran with: ``trainer.total_training_steps`` in ``.hydra/config.yaml``.
Known only for a run that sets it (verl's default is null, derived at start from the dataset)."""

from __future__ import annotations

from pathlib import Path

from guardian.config import ConfigError, parse_yaml, read_small_text

TOTAL_STEPS_KEY = ("trainer", "total_training_steps")
HYDRA_CONFIG = Path(".hydra") / "config.yaml"
MAX_RUN_CONFIG_BYTES = 1 << 20  # verl's composed config is a few tens of kB; a larger file is something else


def config_beside(metrics: Path) -> Path | None:
    """``.hydra/config.yaml`` in the metrics file's folder (a Hydra output dir that also holds the log)."""
    candidate = metrics.parent / HYDRA_CONFIG
    return candidate if candidate.is_file() else None


def total_training_steps(path: Path) -> int | None:
    """``trainer.total_training_steps`` of the Hydra config at ``path``; None when unset (null or absent).
    Raises ``ConfigError`` naming the file and key when it cannot be read or holds something else."""
    where = f"run config {path}"
    text = read_small_text(path, where, limit=MAX_RUN_CONFIG_BYTES, expected="a Hydra config.yaml")
    value: object = parse_yaml(text, where).data  # a key given twice is refused, as OmegaConf refuses it
    for part in TOTAL_STEPS_KEY:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping above {'.'.join(TOTAL_STEPS_KEY)}, got {value!r:.60}")
        value = value.get(part)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: {'.'.join(TOTAL_STEPS_KEY)} must be a positive integer or null, got {value!r:.60}")
    return value
