"""Twins (gpu/twins.py, the twin scenarios of gpu/scenarios.py, their verdict in gpu/verdict.py): the settings, the
labelling rule on synthetic runs, the guarded twin's branch and outcome, a twin call judged from synthetic evidence,
a CPU twin call end to end, and the committed real-verl twins (tests/fixtures/verl-twins) re-labelled from their
own metrics."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu import device_run, twins, verdict
from gpu.scenarios import (
    ENTROPY_KEY,
    LR_KEY,
    SETTINGS,
    VERL_HEALTHY,
    TrainerSetup,
    trainer_command,
    twin_scenarios,
)
from guardian.ids import checked_run_id

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "verl-twins"
R, H = "critic/score/mean", "actor/entropy"


def run(rewards: list[float], entropies: list[float]) -> dict[int, dict[str, Any]]:
    return {i + 1: {R: r, H: h} for i, (r, h) in enumerate(zip(rewards, entropies, strict=True))}


def ramp(a: float, b: float, n: int = 30) -> list[float]:
    return [a + (b - a) * i / (n - 1) for i in range(n)]


CONTROL = run(ramp(0.12, 0.35), ramp(4.09, 3.8))

# ------------------------------------------------------------------------------------------------ settings


def test_every_setting_is_the_control_with_its_changes_in_verls_keys() -> None:
    assert dict(SETTINGS["sane"].verl) == VERL_HEALTHY
    changed = {name: {k: v for k, v in s.verl.items() if VERL_HEALTHY.get(k) != v} for name, s in SETTINGS.items()}
    assert changed["lr-high"] == {LR_KEY: "1e-2"}
    assert changed["entropy-neg-strong"] == {LR_KEY: "1e-3", ENTROPY_KEY: "-0.3"}
    assert changed["kl-off"] == {"actor_rollout_ref.actor.use_kl_loss": "False"}
    assert changed["temp-high"] == {"actor_rollout_ref.rollout.temperature": "2.0"}
    assert changed["len-cap-short"] == {"data.max_response_length": "4"}
    assert all(changed[n] for n in SETTINGS if n != "sane")


def test_twins_are_the_same_command_once_bare_and_once_guarded() -> None:
    got = twin_scenarios("verl", ["sane", "lr-high"], steps=40)
    assert list(got) == ["sane.guarded", "sane.unguarded", "lr-high.guarded", "lr-high.unguarded"]
    setup = TrainerSetup("verl", tiny=Path("/tmp/tiny"))
    g, u = got["lr-high.guarded"], got["lr-high.unguarded"]
    assert (g.guarded, u.guarded, g.setting, g.total_steps) == (True, False, "lr-high", 40)
    same_folder = Path("/r")
    assert trainer_command(setup, g, same_folder) == trainer_command(setup, u, same_folder)
    assert "actor_rollout_ref.actor.optim.lr=1e-2" in trainer_command(setup, g, same_folder)
    for s in got.values():
        assert checked_run_id(s.run_id) == s.run_id  # a valid guardian run id (it names the run's folder)
    assert list(twin_scenarios("cpu", ["sane"], steps=5, mode="unguarded")) == ["sane.unguarded"]
    with pytest.raises(ValueError, match="unknown settings"):
        twin_scenarios("verl", ["sane", "lr-huge"], steps=5)


def same(got: Any, text: str) -> bool:
    try:
        return float(got) == float(text)
    except (TypeError, ValueError):
        return str(got).lower() == text.lower()


def test_the_twin_commands_compose_with_verls_own_config(tmp_path: Path) -> None:
    """Hydra composes every setting's command line with verl 0.9.1's config (struct mode: a wrong key fails), and
    verl's validate_config accepts it where verl imports."""
    pytest.importorskip("hydra")
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = Path(spec.origin).parent / "trainer" / "config"
    setup = TrainerSetup("verl", tiny=tmp_path)
    for name, s in twin_scenarios("verl", list(SETTINGS), steps=40, mode="unguarded").items():
        args = [a for a in trainer_command(setup, s, tmp_path / name)[3:] if not a.startswith("++ray_kwargs")]
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose("ppo_trainer", overrides=args)
        OmegaConf.resolve(cfg)
        for key, value in s.overrides.items():
            assert same(OmegaConf.select(cfg, key), value), (name, key)
        try:
            from verl.utils.config import validate_config
        except ImportError:
            continue  # verl's package needs ray, tensordict and torch to import: composing is the check then
        validate_config(cfg, use_reference_policy=cfg.actor_rollout_ref.actor.use_kl_loss, use_critic=False)


# ------------------------------------------------------------------------------------------------ labels


def test_a_twin_that_ends_with_the_control_is_healthy() -> None:
    got = twins.label(run(ramp(0.12, 0.34), ramp(4.09, 3.7)), CONTROL)
    assert (got.label, got.mode, got.onset_step, got.horizon) == ("healthy", "", None, 30)
    assert got.final_reward == pytest.approx(0.3324, abs=1e-3)
    # better than the control is healthy too
    assert twins.label(run(ramp(0.12, 0.55), ramp(4.09, 2.5)), CONTROL).label == "healthy"


def test_entropy_collapse_is_unhealthy_with_its_onset_where_entropy_left_its_band() -> None:
    entropy = [4.0] * 10 + ramp(4.0, 0.05, 20)
    got = twins.label(run(ramp(0.12, 0.5), entropy), CONTROL)
    assert got.label == "unhealthy" and got.mode == "entropy_collapse"
    first_below_half = next(i + 1 for i, h in enumerate(entropy) if h < 2.0)
    assert got.onset_step == first_below_half


def test_entropy_explosion_is_unhealthy() -> None:
    got = twins.label(run(ramp(0.12, 0.35), [1.0] * 10 + ramp(1.0, 3.5, 20)), CONTROL)
    assert got.label == "unhealthy" and got.mode == "entropy_explosion"
    assert got.onset_step == 10 + next(i + 1 for i, h in enumerate(ramp(1.0, 3.5, 20)) if h > 2.0)


def test_a_reward_that_never_learns_is_unhealthy_from_where_it_falls_behind_for_good() -> None:
    flat = [0.13] * 30
    got = twins.label(run(flat, [4.1] * 30), CONTROL)
    assert got.label == "unhealthy" and got.mode == "reward_below_control"
    # the control's 3-step mean first leads by more than the margin (0.05) at step 8 and never stops leading
    control_mean = twins.smoothed(twins.series(CONTROL, R))
    expected = next(s for s, v in control_mean if v - 0.13 > got.reward_margin)
    assert got.onset_step == expected


def test_a_reward_that_rises_then_falls_has_its_onset_after_the_peak() -> None:
    rewards = ramp(0.12, 0.45, 15) + ramp(0.42, 0.15, 15)
    got = twins.label(run(rewards, [4.0] * 30), CONTROL)
    assert got.label == "unhealthy"
    assert got.onset_step == 17  # the raw reward peaks at step 15, its 3-step mean at step 16


def test_between_noise_and_margin_or_entropy_out_of_band_is_borderline() -> None:
    slightly_behind = twins.label(run(ramp(0.12, 0.31), ramp(4.09, 3.8)), CONTROL)
    assert slightly_behind.label == "borderline" and slightly_behind.mode == "reward_behind_control"
    spent = twins.label(run(ramp(0.12, 0.5), ramp(4.09, 1.0)), CONTROL)
    assert spent.label == "borderline" and spent.mode == "entropy_out_of_band"
    assert spent.onset_step is None


def test_runs_are_compared_at_the_steps_both_reached() -> None:
    short = {s: d for s, d in run(ramp(0.12, 0.34), ramp(4.09, 3.7)).items() if s <= 20}
    got = twins.label(short, CONTROL)
    assert got.horizon == 20
    assert got.control_final_reward == pytest.approx(twins.figures(CONTROL, upto=20).final_reward)
    assert twins.label({1: {R: 0.1, H: 4.0}}, CONTROL).mode == "not_enough_data"


# ------------------------------------------------------------------------------------------------ guarded twin


def test_the_branch_replaces_steps_from_a_resumed_attempts_first_trained_step() -> None:
    first = run(ramp(0.1, 0.4, 18), ramp(4.0, 1.0, 18))
    resumed = {12: {"val/score": 0.3}, **{s: {R: 0.5, H: 3.0} for s in range(13, 31)}}
    merged = twins.branch([first, resumed])
    assert merged[12][R] == first[12][R] and merged[12]["val/score"] == 0.3  # the validation line merges in
    assert merged[13][R] == 0.5 and merged[18][H] == 3.0 and max(merged) == 30
    fresh = {s: {R: 0.2, H: 4.0} for s in range(1, 6)}
    assert max(twins.branch([first, fresh])) == 5  # a fresh start replaces everything


def store(state: str = "RESOLVED") -> dict[str, Any]:
    incident = {"id": 1, "check": "entropy_collapse", "severity": "critical", "status": "resolved"}
    incident |= {"opened_step": 18, "onset_step": 15}
    return {
        "incidents": [incident],
        "shown": [{**incident, "interventions": [{"state": state, "target_step": 12, "plan": {}}]}],
    }


def test_the_guardians_outcome_from_its_store() -> None:
    got = twins.guardian_outcome(store())
    assert (got["detection_step"], got["rollback_step"], got["steps_lost"]) == (18, 12, 6)
    assert (got["outcome"], got["detected_by"], got["interventions"]) == ("RESOLVED", "entropy_collapse", 1)
    quiet = twins.guardian_outcome({"incidents": [], "shown": []})
    assert quiet["detection_step"] is None and quiet["outcome"] is None and quiet["interventions"] == 0


def test_first_findings_warnings_included() -> None:
    log = "\n".join(
        f"2026-12-02 05:31:{s:02d},000 WARNING guardian.daemon event=finding run=r check={c} change={ch} "
        f"severity={sev} step={s}"
        for s, c, ch, sev in [
            (7, "kl_drift", "raised", "warn"),
            (22, "kl_drift", "cleared", "ok"),
            (30, "kl_drift", "raised", "warn"),
            (39, "entropy_collapse", "raised", "critical"),
        ]
    )
    got = twins.first_findings(verdict.parse_log(log))
    assert got == [
        {"check": "kl_drift", "severity": "warn", "step": 7},
        {"check": "entropy_collapse", "severity": "critical", "step": 39},
    ]


def write_jsonl(path: Path, metrics: dict[int, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in sorted(metrics.items())))


def test_a_twin_call_judged_from_synthetic_evidence(tmp_path: Path) -> None:
    chosen = twin_scenarios("verl", ["sane", "entropy-neg-strong"], steps=30)
    write_jsonl(tmp_path / "sane.unguarded" / "unguarded" / "metrics.jsonl", CONTROL)
    sane_g = tmp_path / "sane.guarded" / "runs" / "gpu-sane.guarded"
    write_jsonl(sane_g / "attempt-1" / "metrics.jsonl", CONTROL)
    (tmp_path / "sane.guarded" / "store.json").write_text(json.dumps({"incidents": [], "shown": []}))
    collapse = run(ramp(0.12, 0.5), [4.0] * 10 + ramp(4.0, 0.05, 20))
    write_jsonl(tmp_path / "entropy-neg-strong.unguarded" / "unguarded" / "metrics.jsonl", collapse)
    g = tmp_path / "entropy-neg-strong.guarded" / "runs" / "gpu-entropy-neg-strong.guarded"
    write_jsonl(g / "attempt-1" / "metrics.jsonl", {s: d for s, d in collapse.items() if s <= 18})
    write_jsonl(g / "attempt-2" / "metrics.jsonl", {s: {R: 0.45, H: 3.5} for s in range(13, 31)})
    (tmp_path / "entropy-neg-strong.guarded" / "store.json").write_text(json.dumps(store()))
    (g / "guardian.log").write_text(
        "2026-12-02 05:31:00,000 ERROR guardian.daemon event=finding run=r check=entropy_collapse change=raised "
        "severity=critical step=18\n"
    )
    results = {name: {"returncodes": [0]} for name in chosen}
    judged = verdict.judge(tmp_path, chosen, results, timed_out=False)
    assert judged["passed"], verdict.render(judged)
    names = [c["name"] for c in judged["scenarios"]["sane.guarded"]["checks"]]
    assert names == ["reached_total_steps", "no_intervention_on_the_control"]
    rows = {r["setting"]: r for r in judged["twins"]}
    assert rows["sane"]["label"]["label"] == "healthy"
    bad = rows["entropy-neg-strong"]
    assert bad["label"]["label"] == "unhealthy" and bad["label"]["mode"] == "entropy_collapse"
    assert (bad["guarded"]["detection_step"], bad["guarded"]["steps_lost"], bad["guarded"]["outcome"]) == (
        18,
        6,
        "RESOLVED",
    )
    assert bad["guarded"]["final_reward"] == 0.45 and bad["guarded"]["attempts"] == 2
    assert bad["guarded"]["findings"] == [{"check": "entropy_collapse", "severity": "critical", "step": 18}]
    assert bad["guarded_minus_unguarded_reward"] == pytest.approx(0.45 - twins.figures(collapse).final_reward, abs=1e-3)
    table = twins.render(judged["twins"])
    assert "entropy-neg-strong" in table and "RESOLVED" in table


def test_step_arrivals_from_the_samplers_rows() -> None:
    rows = [{"t": 100.0, "kind": "procs"}] + [
        {"t": 280.0 + 6 * i, "kind": "step", "scenario": "sane.unguarded", "step": i + 1} for i in range(4)
    ]
    assert twins.arrivals(rows) == {
        "sane.unguarded": {"first_step_s": 180.0, "last_step_s": 198.0, "steps": 4, "step_s_median": 6.0}
    }


def test_a_cpu_twin_call_end_to_end(tmp_path: Path) -> None:
    """The driver runs the twins of two settings with the guardian's CPU trainer, judges and reports them."""
    code = device_run.main(
        [
            "--trainer", "cpu", "--scenarios", "twins", "--settings", "sane,entropy-neg-strong", "--unguarded",
            "--steps", "12", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--deadline-s", "120",
        ]
    )  # fmt: skip
    judged = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert code == 0, verdict.render(judged)
    assert sorted(judged["scenarios"]) == ["entropy-neg-strong.unguarded", "sane.unguarded"]
    assert [r["setting"] for r in judged["twins"]] == ["sane", "entropy-neg-strong"]
    assert all(r["unguarded"]["steps"] == 12 for r in judged["twins"])
    assert device_run.main(["--trainer", "cpu", "--scenarios", "twins", "--settings", "nope", "--work",
                            str(tmp_path), "--out", str(tmp_path)]) == 2  # fmt: skip


# ------------------------------------------------------------------------------------------------ fixtures


def test_the_committed_real_verl_twins_carry_the_labels_their_metrics_give() -> None:
    entries = json.loads((FIXTURES / "labels.json").read_text())
    runs = {e["setting"]: twins.read_jsonl(FIXTURES / e["file"]) for e in entries}
    assert "sane" in runs and len(entries) >= 6
    for e in entries:
        got = twins.label(runs[e["setting"]], runs["sane"])
        assert (e["label"], e["mode"], e["onset_step"]) == (got.label, got.mode or None, got.onset_step), e["file"]
        assert e["labelled_by"] == twins.LABELLED_BY and e["group"] == twins.GROUP
        assert e["overrides"] == dict(SETTINGS[e["setting"]].verl)
        assert e["final_reward"] == pytest.approx(got.final_reward, abs=1e-4)
    assert {e["setting"]: e["label"] for e in entries}["sane"] == "healthy"
    size = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert size < 2 * 1024 * 1024
    assert not list(FIXTURES.rglob("*.pt")) and not list(FIXTURES.rglob("*.safetensors"))


def test_fixtures_are_written_from_an_unpacked_call(tmp_path: Path) -> None:
    harness = tmp_path / "harness"
    for name, metrics in (("sane", CONTROL), ("temp-high", run([0.13] * 30, [4.1] * 30))):
        write_jsonl(harness / f"{name}.unguarded" / "unguarded" / "metrics.jsonl", metrics)
        (harness / f"{name}.unguarded" / "argv.json").write_text(json.dumps(["python3", "-m", "verl"]))
    (harness / "verdict.json").write_text("{}")
    assert twins.main(["fixtures", str(harness), str(tmp_path / "fx")]) == 0
    labels = json.loads((tmp_path / "fx" / "labels.json").read_text())
    assert [(e["file"], e["label"]) for e in labels] == [("sane.jsonl", "healthy"), ("temp-high.jsonl", "unhealthy")]
    assert (tmp_path / "fx" / "call" / "verdict.json").exists()
    assert json.loads((tmp_path / "fx" / "call" / "argv.json").read_text())["sane.unguarded"][0] == "python3"
    with pytest.raises(ValueError, match=r"no sane\.unguarded"):
        twins.fixture_labels(tmp_path / "fx", {})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
