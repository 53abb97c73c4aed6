"""The harness's outside view on this machine's real /proc, and nvidia-smi's CSV as the GPU machine printed it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpu.observe import Sampler, attempt_processes, gpu_memory, process_usage


def test_an_attempts_processes_are_found_by_the_logger_path_they_inherit(tmp_path: Path) -> None:
    metrics = tmp_path / "attempt-1" / "metrics.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics)}
    sleeper = "import time; time.sleep(30)"
    driver = subprocess.Popen([sys.executable, "-c", sleeper, "-m", "verl.trainer.main_ppo"], env=env)
    worker = subprocess.Popen([sys.executable, "-c", sleeper, "ray::WorkerDict"], env=env)
    try:
        deadline = time.time() + 10
        while (found := attempt_processes().get(str(metrics))) is None or len(found["pids"]) < 2:
            assert time.time() < deadline, "the two processes were not seen"
            time.sleep(0.05)
        assert sorted(found["pids"]) == sorted([driver.pid, worker.pid])
        assert found["drivers"] == [driver.pid]  # a Ray worker is not a trainer
    finally:
        for p in (driver, worker):
            p.kill()
            p.wait()
    assert str(metrics) not in attempt_processes()


def test_the_usage_of_a_live_process_and_none_for_a_gone_one() -> None:
    usage = process_usage(os.getpid())
    assert usage is not None and usage["cpu_s"] > 0 and usage["rss_mb"] > 1
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert process_usage(int(done.stdout)) is None


def test_gpu_memory_per_gpu_and_per_process_from_nvidia_smi_csv() -> None:
    uuid = "GPU-5b0e3a4c-91d2-2f6e-8c1a-7e44b02f9d13"
    answers = {
        "--query-gpu=index,uuid,memory.used,memory.total": f"0, {uuid}, 4336, 143771\n",
        "--query-compute-apps=gpu_uuid,pid,used_memory": f"{uuid}, 3508, 1416\n{uuid}, 3803, 746\n{uuid}, [N/A], 0\n",
    }

    def run(argv: list[str], **_: Any) -> SimpleNamespace:
        return SimpleNamespace(stdout=answers[argv[1]])

    assert gpu_memory(run, which=lambda name: "/usr/bin/nvidia-smi") == {
        "used_mib": [4336.0],
        "total_mib": [143771.0],
        "apps": [{"pid": 3508, "mib": 1416.0, "gpu": 0}, {"pid": 3803, "mib": 746.0, "gpu": 0}],
    }
    assert gpu_memory(run, which=lambda name: None) is None


def test_the_sampler_records_each_step_once_and_a_checkpoint_when_it_changes(tmp_path: Path) -> None:
    run = tmp_path / "collapse"
    metrics = run / ".guardian" / "runs" / "r" / "attempt-1" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"step": 1, "data": {}}\n{"step": 2, "data": {}}\n{"step": 3, "da')  # a line being written
    ckpt = run / "ckpt" / "global_step_2" / "actor"
    ckpt.mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"x" * 10)
    out = io.StringIO()
    sampler = Sampler(out, {"collapse": run}, clock=lambda: 1.0)
    sampler.sample()
    (ckpt / "optim.pt").write_bytes(b"y" * 4)
    sampler.sample()
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2]
    manifests = [r["files"] for r in rows if r["kind"] == "ckpt"]
    assert manifests == [{"actor/model.pt": 10}, {"actor/model.pt": 10, "actor/optim.pt": 4}]
