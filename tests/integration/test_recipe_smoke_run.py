"""The search recipe's real verl 0.9.1 smoke run, tests/fixtures/verl-0.9.1-run/recipe-smoke (see its README).

``bash gpu/device.sh search`` ran ``recipe/run.sh`` on one H200: data prepared from the repository's HotpotQA and
2Wiki samples, a BM25 index of the HotpotQA paragraphs, the retrieval server, and 8 GRPO steps of the recipe's own
config (shrunk to a warm-started tiny model, one GPU and the ``hf`` rollout) with the multi-turn search agent loop
and the recipe's reward, under ``guardian run`` in observe mode. Here the recorded evidence is judged again, the
dumped scores are recomputed with the recipe's reward, and the guardian replays the run.
"""

from __future__ import annotations

import json

import pytest
from conftest import fixture_path

from gpu import verdict
from gpu.scenarios import RECIPE_CONFIG, scenarios
from guardian.config import ChecksConfig
from guardian.incidents.replay import replay_file
from recipe.agent.protocol import OBSERVATION_OPEN
from recipe.prompt import SEARCH_CLOSE
from recipe.reward import compute_score

SMOKE = fixture_path("verl-0.9.1-run", "recipe-smoke")
ATTEMPT = SMOKE / "search" / "runs" / "gpu-search" / "attempt-1"
DUMPS = SMOKE / "search" / "rollouts" / "search_agent" / "search"


def dumped_rows() -> list[dict[str, object]]:
    return [json.loads(line) for path in sorted(DUMPS.glob("*.jsonl")) for line in path.read_text().splitlines()]


def test_the_verdict_on_the_recorded_evidence_passes() -> None:
    known = scenarios("verl", collapse_steps=28, healthy_steps=24, search_steps=8)
    judged = verdict.judge(SMOKE, {"search": known["search"]}, {"search": {"returncodes": [0]}}, timed_out=False)
    assert judged["passed"], judged["scenarios"]["search"]["checks"]
    measures = judged["scenarios"]["search"]["measures"]
    rollouts = measures["rollouts"]
    assert (rollouts["trajectories"], rollouts["searches"], rollouts["searches_with_passages"]) == (256, 110, 64)
    assert measures["retrieval_server"]["queries"] == 111  # one search of a trajectory cut at response_length
    assert 15 < measures["step_time_s"] < 25


def test_the_run_used_the_recipe_config_through_run_sh() -> None:
    argv = json.loads((SMOKE / "search" / "argv.json").read_text())
    assert argv[:2] == ["bash", "<repo>/recipe/run.sh"] and argv[argv.index("--config") + 1] == RECIPE_CONFIG
    text = " ".join(json.loads((ATTEMPT / "command.json").read_text())["argv"])
    assert f"--config-name {RECIPE_CONFIG}" in text and "actor_rollout_ref.rollout.name=hf" in text
    assert "ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_TOPK='1'" in text  # strings, as Ray requires


def test_every_dumped_score_is_the_recipe_reward_plus_the_overlong_penalty() -> None:
    rows = dumped_rows()
    penalised = 0
    for row in rows:
        ours = compute_score("hotpotqa", str(row["output"]), row["gts"])["score"]
        dumped = float(row["score"])  # type: ignore[arg-type]
        if dumped != pytest.approx(ours, abs=1e-6):
            # the dapo manager's overlong shaping only lowers the score, and only of long responses
            assert dumped < ours and len(str(row["output"])) > 600, (dumped, ours)
            penalised += 1
    assert len(rows) == 256 and 0 < penalised < len(rows) // 4


def test_searches_were_answered_by_the_retriever_with_passages_of_the_index() -> None:
    answered = [
        row["output"]
        for row in dumped_rows()
        if f"{SEARCH_CLOSE}{OBSERVATION_OPEN}Doc 1 (Title: " in str(row["output"])
    ]
    assert len(answered) >= 50
    corpus_titles = {"Pyar Ki Kahani"}  # a paragraph of the HotpotQA sample, what BM25 ranks first for "film"
    assert any(title in str(text) for text in answered for title in corpus_titles)


def test_the_guardian_replays_the_smoke_run_without_a_critical_as_it_observed_live() -> None:
    live = verdict.parse_log((ATTEMPT.parent / "guardian.log").read_text())
    assert not [e for e in live if e.name in ("finding", "incident_opened")]
    result = replay_file(ATTEMPT / "metrics.jsonl", ChecksConfig(), rollouts=DUMPS)
    assert result.first_critical is None


def test_the_fixture_holds_no_local_paths() -> None:
    for path in SMOKE.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            # gpu/device.sh's scratch folders on the GPU machine; the repository itself appears as <repo>
            assert not any(scratch in text for scratch in ("/tmp/harness", "/tmp/site", "/tmp/tiny")), path
