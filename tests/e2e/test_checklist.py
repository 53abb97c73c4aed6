"""``guardian checklist`` over real runs: the healthy demo scenario and the rescued demo pass (nothing fails), a
real verl 0.9.1 entropy collapse and a public run's collapse, loaded into a store by ``guardian watch``, fail;
evaluation results are stored and judged against checklist.eval_minimums."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import fixture_path

from guardian.cli import EXIT_ERROR, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, main
from guardian.review.facts import resumable_checkpoints
from guardian.review.samples import dump_files
from guardian.sources.jsonl import read_all
from guardian.states import PinMode
from guardian.store import Store

HARNESS_COLLAPSE = fixture_path("verl-0.9.1-run", "harness", "collapse", "runs", "gpu-collapse")
COLLAPSE = HARNESS_COLLAPSE / "attempt-1"


def _use(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GUARDIAN_HOME", str(home))
    monkeypatch.delenv("GUARDIAN_DB_URL", raising=False)


def _run_id(home: Path) -> str:
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        (run,) = store.list_runs()
        return run.id


def checklist(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, object], dict[str, dict[str, object]]]:
    """Exit status, the JSON document and its items by name."""
    _use(home, monkeypatch)
    code = main(["--log-level", "ERROR", "checklist", _run_id(home), "--json", *extra])
    document = json.loads(capsys.readouterr().out)
    return code, document, {str(i["name"]): i for i in document["items"]}


def watched(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Path,
    rollouts: Path | None = None,
    *,
    exit_code: int = EXIT_UNHEALTHY,
) -> Path:
    """A finished run's files loaded into a fresh store by ``guardian watch`` (observe: no rescue)."""
    home = tmp_path / "home"
    _use(home, monkeypatch)
    argv = ["--log-level", "ERROR", "watch", "--metrics", str(metrics), "--no-live", "--max-ticks", "3"]
    assert main([*argv, *(["--rollouts", str(rollouts)] if rollouts else [])]) == exit_code
    return home


def _dump_scores(folder: Path, steps: list[int]) -> list[tuple[float, str]]:
    rows = [json.loads(line) for s in steps for line in (folder / f"{s}.jsonl").read_text().splitlines() if line]
    return [(float(r["score"]), r["input"]) for r in rows]


# ------------------------------------------------------------------------------------------ healthy runs


@pytest.mark.slow
def test_a_healthy_run_passes_with_its_samples_to_read(
    healthy_demo_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, document, items = checklist(healthy_demo_home, monkeypatch, capsys)
    assert code == EXIT_OK and document["verdict"] == "warn" and document["last_step"] == 300
    assert not [i for i in items.values() if i["mark"] == "fail"]
    for name in ("reward", "entropy", "egr", "response_length", "truncation", "incidents", "checkpoints"):
        assert items[name]["mark"] == "pass", items[name]
    assert items["incidents"]["reason"] == "no incidents"
    assert items["kl"]["mark"] == "warn" and "not logged" in str(items["kl"]["reason"])  # the demo uses no KL loss

    (run_folder,) = (healthy_demo_home / "runs").iterdir()
    on_disk = sorted(
        int(p.name.removeprefix("global_step_")) for p in run_folder.glob("trainer/checkpoints/global_step_*")
    )
    kept = items["checkpoints"]["details"]["healthy"]
    assert [c["step"] for c in kept] == on_disk and on_disk[-1] == 300
    assert items["checkpoints"]["reason"].startswith(f"{len(on_disk)} healthy checkpoint(s) kept, newest step 300")

    samples = items["samples"]
    assert (
        samples["mark"] == "warn" and samples["reason"] == "read these: the 5 highest-reward samples of steps 291-300"
    )
    details = samples["details"]
    assert details["steps_read"] == list(range(291, 301))
    shown = details["samples"]
    scores = _dump_scores(run_folder / "trainer" / "rollouts", list(range(291, 301)))
    best_per_prompt = sorted({p: max(s for s, q in scores if q == p) for _, p in scores}.values(), reverse=True)
    assert [s["score"] for s in shown] == best_per_prompt[:5]
    assert len({s["prompt"] for s in shown}) == 5  # one per prompt: a group repeats its prompt

    assert main(["--log-level", "ERROR", "checklist", _run_id(healthy_demo_home)]) == EXIT_OK
    text = capsys.readouterr().out
    assert text.startswith(f"launch checklist for run {_run_id(healthy_demo_home)} at step 300: warn\n")
    assert "  warn samples            read these: the 5 highest-reward samples of steps 291-300" in text
    assert f"       step {shown[0]['step']} score " in text and "         prompt:   user:" in text
    assert "  warn evaluations        no evaluation results recorded: pass --eval NAME=VALUE" in text


@pytest.mark.slow
def test_a_rescued_collapse_passes_with_its_incident_resolved(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, items = checklist(demo_home, monkeypatch, capsys)
    assert code == EXIT_OK
    assert (
        items["incidents"]["mark"] == "pass"
        and items["incidents"]["reason"] == "1 incident(s), each resolved or dismissed"
    )
    assert items["reward"]["mark"] == "pass"
    # entropy spent to converge on the best answers: low, and said so, but no failure
    assert items["entropy"]["mark"] == "warn" and "with the reward converged" in str(items["entropy"]["reason"])


# ------------------------------------------------------------------------------------------ collapsed runs


def test_a_real_verl_run_stopped_as_its_entropy_fell_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the harness's collapse, stopped at step 18 while its reward still climbed: no incident by today's policy,
    # but not ready to launch at scale either
    run = tmp_path / "attempt-1"
    shutil.copytree(COLLAPSE, run)
    home = watched(tmp_path, monkeypatch, run / "metrics.jsonl", run / "rollouts", exit_code=EXIT_OK)
    capsys.readouterr()
    code, document, items = checklist(home, monkeypatch, capsys)
    assert code == EXIT_UNHEALTHY and document["verdict"] == "fail"
    assert items["incidents"]["mark"] == "pass"
    assert items["truncation"]["mark"] == "fail"  # 16-token responses: nearly all cut at the cap
    assert items["entropy"]["mark"] == "warn" and "still falling" in str(items["entropy"]["reason"])
    assert items["checkpoints"]["mark"] == "warn"  # watch was given no checkpoint folder
    # what only reading shows: the reward pays full marks for a digit repeated past the answer
    (top, *_) = items["samples"]["details"]["samples"]
    assert (
        top["score"] == 1.0
        and top["response"] != top["ground_truth"]
        and top["response"].startswith(top["ground_truth"])
    )


def test_a_public_runs_collapse_fails_on_reward_length_and_kl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "metrics.jsonl"
    trace.write_bytes(fixture_path("traces", "aopd-2.jsonl").read_bytes())
    home = watched(tmp_path, monkeypatch, trace)
    capsys.readouterr()
    code, _, items = checklist(home, monkeypatch, capsys)
    assert code == EXIT_UNHEALTHY
    assert items["reward"]["mark"] == "fail" and str(items["reward"]["reason"]).startswith(
        "collapsed: critic/score/mean"
    )
    assert items["response_length"]["mark"] == "fail" and "collapsed" in str(items["response_length"]["reason"])
    assert items["kl"]["mark"] == "fail" and "ran away from the reference" in str(items["kl"]["reason"])
    assert items["samples"]["mark"] == "warn" and "no scored rollout dumps found" in str(items["samples"]["reason"])


# ------------------------------------------------------------------------------------------ evaluations


@pytest.mark.slow
def test_evaluations_are_stored_and_judged_against_their_minimums(
    healthy_demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    shutil.copytree(healthy_demo_home, home)  # the checkpoints it names stay where the demo wrote them
    code, _, items = checklist(home, monkeypatch, capsys, "--eval", "hotpotqa_em=0.41", "--eval", "gaia_l1=0.12")
    assert code == EXIT_OK
    assert items["eval:hotpotqa_em"]["mark"] == "warn"
    assert items["eval:hotpotqa_em"]["reason"] == "0.41 recorded; no minimum set (checklist.eval_minimums.hotpotqa_em)"
    assert items["eval:gaia_l1"]["details"] == {"value": 0.12, "minimum": None, "step": 300}
    with Store.open(f"sqlite:///{home / 'guardian.db'}") as store:
        assert [(e.name, e.value, e.step) for e in store.evaluations(_run_id(home))] == [
            ("hotpotqa_em", 0.41, 300),
            ("gaia_l1", 0.12, 300),
        ]

    config = tmp_path / "guardian.yaml"
    config.write_text("checklist:\n  eval_minimums: {hotpotqa_em: 0.45, gaia_l1: 0.1, webwalker: 0.2}\n")
    code, _, items = checklist(home, monkeypatch, capsys, "--config", str(config))  # the stored results count
    assert code == EXIT_UNHEALTHY
    assert (items["eval:hotpotqa_em"]["mark"], items["eval:hotpotqa_em"]["reason"]) == (
        "fail",
        "0.41, below its minimum 0.45",
    )
    assert (items["eval:gaia_l1"]["mark"], items["eval:gaia_l1"]["reason"]) == (
        "pass",
        "0.12, at least its minimum 0.1",
    )
    assert items["eval:webwalker"]["reason"] == "required (minimum 0.2) and not recorded"

    code, _, items = checklist(
        home, monkeypatch, capsys, "--config", str(config), "--eval", "hotpotqa_em=0.47", "--eval", "webwalker=0.25"
    )
    assert code == EXIT_OK  # the newest result of a name wins
    assert {items[f"eval:{n}"]["mark"] for n in ("hotpotqa_em", "gaia_l1", "webwalker")} == {"pass"}


@pytest.mark.parametrize("bad", ["hotpotqa_em", "=0.4", "em=high", "em=nan", "em=inf", "x" * 129 + "=1"])
def test_a_bad_eval_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["checklist", "some-run", "--eval", bad])
    assert exited.value.code == EXIT_USAGE
    assert "--eval: expected NAME=VALUE with a finite number (hotpotqa_em=0.41)" in capsys.readouterr().err


def test_an_unknown_run_names_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "metrics.jsonl"
    trace.write_bytes(fixture_path("traces", "aopd-2.jsonl").read_bytes())
    home = watched(tmp_path, monkeypatch, trace)
    capsys.readouterr()
    assert main(["checklist", "no-such-run"]) == EXIT_ERROR
    assert (
        f"no run 'no-such-run' in sqlite:///{home / 'guardian.db'} (newest runs: {_run_id(home)})"
        in capsys.readouterr().err
    )


def test_each_step_is_read_from_the_attempt_that_dumped_it_on_the_timeline() -> None:
    """The harness's real collapse: attempt 1 dumped steps 1-18, its rescue resumed from global_step_12 and attempt 2
    dumped 13-28. Steps 13-18 of attempt 1's folder are the abandoned branch: never read for review."""
    first, second = (HARNESS_COLLAPSE / f"attempt-{n}" for n in (1, 2))
    steps = sorted({r.step for r in read_all(second / "metrics.jsonl")[0]} | set(range(1, 13)))
    found = dump_files([second / "rollouts", first / "rollouts"], steps, 20)
    assert sorted(found) == list(range(9, 29))
    assert {s: p.parent.parent.name for s, p in found.items()} == {
        **{s: "attempt-1" for s in range(9, 13)},
        **{s: "attempt-2" for s in range(13, 29)},
    }


def test_thresholds_out_of_order_are_refused_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "guardian.yaml"
    config.write_text("checklist:\n  kl_warn: 2\n")
    assert main(["checklist", "some-run", "--config", str(config)]) == EXIT_USAGE
    assert "checklist: Value error, kl_warn (2.0) exceeds kl_fail (1.0)" in capsys.readouterr().err


def test_a_checkpoint_verls_retention_emptied_counts_as_kept_only_while_a_pin_holds_it(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'g.db'}") as store:
        store.ensure_run("r", name="r", metrics_path="m", rollouts_dir="", checkpoints_dir="c", mode="enforce", now=0)
        paths = {}
        for step in (10, 20, 30):
            folder = tmp_path / f"global_step_{step}"
            folder.mkdir()
            (folder / "data.pt").touch()
            paths[step] = str(folder)
            store.record_checkpoint("r", step=step, path=str(folder), verdict="healthy", now=1.0)
        (tmp_path / "global_step_10" / "actor").mkdir()  # 20 and 30: verl's retention deleted their actor/
        store.record_pin(
            "r", step=20, source_path=paths[20], pinned_path="p/20", mode=PinMode.LINK, bytes_added=0, now=2.0
        )
        kept = resumable_checkpoints(store, "r", tuple(store.checkpoints("r")))
    assert kept == {paths[10], paths[20]}, "step 30 lost its actor/ and no pin holds it"
