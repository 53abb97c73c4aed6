"""The demo's files have the shapes of the real verl 0.9.1 run in tests/fixtures/verl-0.9.1-run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_path

from guardian.demo import trainer
from guardian.demo.writers import RolloutDumper, console_line
from guardian.sources.console import parse_console_line
from guardian.sources.rollouts import RolloutDir

UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}_\d+_\d+$")
# keys verl logs only in configurations the real run did not use (facts §1.1)
CONDITIONAL = {"actor/kl_loss", "actor/kl_coef", "actor/entropy_loss", "timing_s/ref"}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("VERL_FILE_LOGGER_PATH", str(root / "metrics.jsonl"))
        argv = [
            "trainer.logger=[file]",
            "trainer.total_training_steps=6",
            "trainer.test_freq=3",
            "trainer.save_freq=3",
            f"trainer.rollout_data_dir={root / 'rollouts'}",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.entropy_coeff=0.001",
        ]
        assert trainer.main(argv) == 0
    return root


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metric_keys_are_verls(demo_run: Path) -> None:
    real = records(fixture_path("verl-0.9.1-run", "metrics-30-steps.jsonl"))
    real_keys = {key.replace("tiny_copy", "demo_recall") for r in real for key in r["data"]}
    demo = records(demo_run / "metrics.jsonl")
    assert [r["step"] for r in demo] == list(range(7))
    demo_keys = {key for r in demo for key in r["data"]}
    assert demo_keys - real_keys == CONDITIONAL, "no key verl 0.9.1 does not log"
    assert {k.replace("tiny_copy", "demo_recall") for k in real[0]["data"]} == set(demo[0]["data"])
    required = {
        "actor/entropy",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/grad_norm",
        "actor/lr",
        "critic/score/mean",
        "critic/rewards/mean",
        "critic/advantages/min",
        "response_length/clip_ratio",
        "rollout_corr/training_log_ppl",
        "timing_s/step",
        "perf/time_per_step",
        "training/global_step",
        "training/epoch",
    }
    assert required <= set(demo[1]["data"])
    assert "val-core/demo_recall/acc/mean@1" in demo[3]["data"], "test_freq merges validation into the step line"
    assert "timing_s/save_checkpoint" in demo[3]["data"] and "timing_s/testing" in demo[3]["data"]
    assert isinstance(demo[1]["data"]["training/global_step"], int)


def test_rollout_dumps_have_verls_v1_shape(demo_run: Path) -> None:
    real = [json.loads(line) for line in fixture_path("verl-0.9.1-run", "rollouts", "1.jsonl").read_text().splitlines()]
    dump = [json.loads(line) for line in (demo_run / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert [list(row) for row in dump[:1]] == [list(real[0])], "same fields, same order"
    assert len(dump) == 16 * 16
    for row in dump:
        assert UID.match(row["uid"]) and row["step"] == 1
        assert isinstance(row["score"], float) and isinstance(row["output"], str)
    groups = [row["uid"].rsplit("_", 2)[0] for row in dump]
    assert groups == sorted(groups), "rows sorted by uid, as verl's V1 dump"
    assert [int(row["uid"].rsplit("_", 2)[1]) for row in dump[:16]] == list(range(16))
    raw = (demo_run / "rollouts" / "1.jsonl").read_text()
    assert raw.splitlines()[0] == json.dumps(dump[0], ensure_ascii=False)
    stats = RolloutDir(demo_run / "rollouts")
    computed = dict(stats.poll().stats) | dict(stats.poll().stats)
    assert sorted(computed) == list(range(1, 7)) and computed[1].groups == 16 and computed[1].samples == 256


def test_v1_clip_ratio_is_the_share_at_the_batch_max(demo_run: Path) -> None:
    for record in records(demo_run / "metrics.jsonl")[1:]:
        data = record["data"]
        dump = [json.loads(x) for x in (demo_run / "rollouts" / f"{record['step']}.jsonl").read_text().splitlines()]
        assert len(dump) == 256
        assert 0 < data["response_length/clip_ratio"] <= 1
        assert data["response_length/max"] <= 16


def test_console_reader_round_trip() -> None:
    import numpy as np

    line = console_line({"a": np.float64(0.5), "b": 3, "c": float("nan"), "s": "x", "n": np.int64(2)}, 7)
    assert line == "step:7 - a:np.float64(0.5) - b:3 - c:nan - n:np.int64(2)"
    record = parse_console_line(f"\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m {line}")
    assert record is not None and record.step == 7 and record.data["a"] == 0.5 and record.data["n"] == 2


def test_dumper_writes_in_the_background_and_surfaces_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dumper = RolloutDumper()
    dumper.submit(["p"], ["o"], ["g"], [1.0], ["u_0_0"], str(tmp_path / "r"), 3)
    dumper.close()
    assert json.loads((tmp_path / "r" / "3.jsonl").read_text()) == {
        "input": "p",
        "output": "o",
        "gts": "g",
        "score": 1.0,
        "step": 3,
        "uid": "u_0_0",
    }
    assert capsys.readouterr().out == f"Dumped generations to {tmp_path / 'r' / '3.jsonl'}\n"
    (tmp_path / "file").write_text("")
    broken = RolloutDumper()
    with pytest.raises(OSError):  # on this submit if the thread already failed, else when draining
        broken.submit(["p"], ["o"], ["g"], [1.0], ["u_0_0"], str(tmp_path / "file"), 1)
        broken.close()


def test_ray_runtime_env_vars_reach_the_file_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``+ray_kwargs.ray_init.runtime_env.env_vars.*`` is how a launcher hands verl's TaskRunner its
    environment; the demo applies it to its own, so ``VERL_FILE_LOGGER_PATH`` works the same way."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", "placeholder")  # restored after the test
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    target = tmp_path / "via-ray.jsonl"
    argv = [
        "trainer.total_training_steps=1",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={target}",
    ]
    assert trainer.main(["trainer.logger=[console,file,wandb]", *argv]) == 0
    assert [r["step"] for r in records(target)] == [0, 1]
    out = capsys.readouterr().out
    assert "WARN: trainer.logger 'wandb' is not available in the demo trainer; ignored" in out
    assert f"Creating file logger at {target}" in out
