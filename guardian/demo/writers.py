"""verl's writers, byte for byte: the ``file`` logger, the ``console`` logger and V1 rollout dumps.

``FileLogger`` (``verl/utils/tracking.py``) opens ``$VERL_FILE_LOGGER_PATH`` with ``"wb"``, so every start
truncates it; NaN/inf are written as ``null``. ``console_line`` is ``concat_dict_to_str``. ``RolloutDumper`` writes
``{dir}/{step}.jsonl`` with ``"w"`` (a replayed step overwrites) from a one-thread pool, so a dump can land after its
step's metric line. Details: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""

from __future__ import annotations

import json
import numbers
import os
import pprint
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np
import orjson


class FileLogger:
    """verl's ``file`` backend."""

    def __init__(self, project_name: str, experiment_name: str) -> None:
        path = os.getenv("VERL_FILE_LOGGER_PATH", None)
        if path is None:
            root_path = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
            directory = os.path.join(root_path, project_name)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"{experiment_name}.jsonl")
        self.filepath = path
        print(f"Creating file logger at {os.path.abspath(self.filepath)}", flush=True)
        self.fp: BinaryIO = open(self.filepath, "wb", buffering=0)  # noqa: SIM115 - closed in finish()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        record = {"step": step, "data": data}
        self.fp.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def finish(self) -> None:
        self.fp.close()


def console_line(data: Mapping[str, Any], step: int) -> str:
    """``step:N - k:v - ...`` exactly as verl's console logger prints it."""
    output = [f"step:{step}"]
    for key, value in data.items():
        if isinstance(value, numbers.Number):
            output.append(f"{key}:{pprint.pformat(value)}")
    return " - ".join(output)


class Tracking:
    """The subset of ``verl.utils.tracking.Tracking`` the demo has: console and file, in that order."""

    def __init__(self, project_name: str, experiment_name: str, backends: Sequence[str]) -> None:
        self.console = "console" in backends
        self.file = FileLogger(project_name, experiment_name) if "file" in backends else None
        self._finished = False

    def log(self, data: Mapping[str, Any], step: int) -> None:
        if self.console:
            print(console_line(data, step), flush=True)
        if self.file is not None:
            self.file.log(data, step)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self.file is not None:
            self.file.finish()


def _json_default(obj: object) -> object:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def write_generations(
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    uids: Sequence[str],
    dump_path: str,
    global_steps: int,
) -> None:
    """One dump file, rows in the given order (verl sorts them by uid before calling this)."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{global_steps}.jsonl")
    n = len(inputs)
    base_data: dict[str, Sequence[Any]] = {
        "input": inputs,
        "output": outputs,
        "gts": gts,
        "score": scores,
        "step": [global_steps] * n,
        "uid": uids,
    }
    with open(filename, "w") as f:
        for i in range(n):
            entry = {k: v[i] for k, v in base_data.items()}
            f.write(json.dumps(entry, ensure_ascii=False, default=_json_default) + "\n")
    print(f"Dumped generations to {filename}", flush=True)


class RolloutDumper:
    """V1's dump executor: one background thread; errors re-raised on a later submit or at close."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1)
        self._futures: list[Future[None]] = []

    def submit(self, *args: Any) -> None:
        self._futures.append(self._executor.submit(write_generations, *args))
        pending = []
        for future in self._futures:
            if future.done():
                future.result()
            else:
                pending.append(future)
        self._futures = pending

    def close(self) -> None:
        for future in self._futures:
            future.result()
        self._futures.clear()
        self._executor.shutdown(wait=True)
