"""recipe.prepare_data on the real HotpotQA / 2WikiMultihopQA samples in tests/fixtures/recipe (sources in its
README): verl's columns and types, the protocol in the prompt, parquet round trip, dedup, seeded shuffle, split,
and the errors a user meets (missing file, malformed line)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, fixture_path

from recipe import prepare_data as pd
from recipe import prompt

HOTPOT_TRAIN = fixture_path("recipe", "hotpotqa_train_100.json")
HOTPOT_500 = fixture_path("recipe", "hotpotqa_500_first100.jsonl")
TWOWIKI = fixture_path("recipe", "2wiki_500_first100.jsonl")


def run_cli(*argv: str | Path) -> int:
    return pd.main([str(a) for a in argv])


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_reads_the_real_samples() -> None:
    hotpot = pd.load_items(str(HOTPOT_TRAIN), "--hotpotqa", pd.HOTPOTQA)
    wiki = pd.load_items(str(TWOWIKI), "--2wiki", pd.TWOWIKI)
    assert len(hotpot) == 100 and len(wiki) == 100
    assert hotpot[0] == pd.QAItem(
        pd.HOTPOTQA, "5a77ec115542992a6e59dff7", "If Gallu is a demon Lilu is what?", ("a spirit",)
    )
    assert wiki[0] == pd.QAItem(pd.TWOWIKI, "1", "Who is Ahmose-Henutemipet's paternal grandmother?", ("Tetisheri",))
    assert {"yes", "no"} <= {i.answers[0] for i in hotpot}  # comparison questions


def test_answer_aliases_are_merged_in_order_without_repeats() -> None:
    record = {"id": 7, "question": " Q? ", "answer": "A", "answers": ["A", "a1"], "golden_answers": ["a2", " "]}
    item = pd.record_to_item(record, pd.TWOWIKI, "x")
    assert item == pd.QAItem(pd.TWOWIKI, "7", "Q?", ("A", "a1", "a2"))
    with pytest.raises(pd.DataError, match="x: no answer"):
        pd.record_to_item({"question": "q", "answer": ""}, pd.HOTPOTQA, "x")
    with pytest.raises(pd.DataError, match="x: no question"):
        pd.record_to_item({"answer": "a"}, pd.HOTPOTQA, "x")


def test_rows_have_exactly_verls_columns_and_types() -> None:
    item = pd.load_items(str(HOTPOT_TRAIN), "--hotpotqa", pd.HOTPOTQA)[0]
    row = pd.item_to_row(item, "train", 3)
    assert tuple(row) == pd.COLUMNS
    assert row["data_source"] == "hotpotqa" and row["ability"] == "multihop_qa"
    assert row["agent_name"] == "search_agent"
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": ["a spirit"]}}
    extra = row["extra_info"]
    assert extra["index"] == 3 and extra["split"] == "train" and extra["question"] == item.question
    assert extra["need_tools_kwargs"] is True
    assert extra["tools_kwargs"]["search"]["create_kwargs"] == {
        "ground_truth": {"target": ["a spirit"]},
        "question": item.question,
        "data_source": "hotpotqa",
    }
    assert pd.item_to_row(item, "val", 0, agent_name="other")["agent_name"] == "other"
    # the schema the files are written with accepts the row unchanged
    assert pa.Table.from_pylist([row], schema=pd.SCHEMA).to_pylist() == [row]


def test_prompt_carries_the_protocol_tags() -> None:
    messages = pd.item_to_row(pd.QAItem(pd.TWOWIKI, "1", "Who?", ("x",)), "train", 0)["prompt"]
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    for tag in ("<think>", "</think>", "<search>", "</search>", "<result>", "</result>", "<answer>", "</answer>"):
        assert tag in system
    assert messages[0]["content"] == prompt.SYSTEM_PROMPT
    assert messages[1]["content"] == "Question: Who?"


def test_tool_agent_rows_get_the_native_function_call_prompt(tmp_path: Path) -> None:
    item = pd.QAItem(pd.TWOWIKI, "1", "Who?", ("x",))
    system = pd.item_to_row(item, "train", 0, agent_name="tool_agent")["prompt"][0]["content"]
    assert system == prompt.NATIVE_SYSTEM_PROMPT
    # the native tool call replaces the search/result tags; reasoning and the answer keep theirs (the reward reads them)
    assert not any(tag in system for tag in ("<search>", "</search>", "<result>", "</result>"))
    assert all(tag in system for tag in ("<think>", "</think>", "<answer>", "</answer>"))
    assert pd.item_to_row(item, "train", 0, agent_name="other")["prompt"][0]["content"] == prompt.SYSTEM_PROMPT
    out = tmp_path / "native"
    assert (
        run_cli("--2wiki", TWOWIKI, "--out", out, "--train-size", "5", "--val-size", "2", "--agent-name", "tool_agent")
        == 0
    )
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert {row["agent_name"] for row in rows} == {"tool_agent"}
    assert {row["prompt"][0]["content"] for row in rows} == {prompt.NATIVE_SYSTEM_PROMPT}


def test_normalize_question_ignores_case_punctuation_and_spacing() -> None:
    assert pd.normalize_question("Who is  X's father?") == pd.normalize_question("who is x s FATHER")
    assert pd.normalize_question("Cezaria J\u0119drzejewiczowa") != pd.normalize_question("Cezaria Jedrzejewiczowa")


def test_cli_writes_parquet_that_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data"
    code = run_cli(
        "--hotpotqa", HOTPOT_TRAIN, "--2wiki", TWOWIKI, "--out", out, "--train-size", "150", "--val-size", "40"
    )
    assert code == 0
    train, val = pq.read_table(out / "train.parquet"), pq.read_table(out / "val.parquet")
    assert train.schema.equals(pd.SCHEMA) and val.schema.equals(pd.SCHEMA)
    assert tuple(train.column_names) == pd.COLUMNS
    assert (train.num_rows, val.num_rows) == (150, 40)
    rows = train.to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == list(range(150))
    assert {r["data_source"] for r in rows} == {"hotpotqa", "2wikimultihopqa"}
    assert all(r["extra_info"]["split"] == "train" for r in rows)
    assert all(r["extra_info"]["split"] == "val" for r in val.to_pylist())
    assert sorted(os.listdir(out)) == ["train.parquet", "val.parquet"]  # no temporary file left behind
    printed = capsys.readouterr().out
    assert "hotpotqa: read 100, duplicates dropped 0, kept 100" in printed
    assert "2wikimultihopqa: read 100, duplicates dropped 0, kept 100" in printed
    assert "total: read 200, kept 200 -> train 150, val 40" in printed
    assert "note:" not in printed


def test_dedup_drops_an_injected_duplicate_across_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hotpot = json.loads(HOTPOT_TRAIN.read_text(encoding="utf-8"))
    twin = {"idx": 9999, "question": "  IF gallu is a demon, Lilu is what!! ", "answer": "a spirit"}
    lines = [json.loads(line) for line in TWOWIKI.read_text(encoding="utf-8").splitlines()]
    wiki = write_jsonl(tmp_path / "2wiki.jsonl", [*lines[:10], twin, lines[3]])
    assert hotpot[0]["question"] == "If Gallu is a demon Lilu is what?"
    out = tmp_path / "out"
    assert run_cli("--hotpotqa", HOTPOT_TRAIN, "--2wiki", wiki, "--out", out, "--val-size", "10") == 0
    printed = capsys.readouterr().out
    assert "2wikimultihopqa: read 12, duplicates dropped 2, kept 10" in printed
    assert "total: read 112, kept 110" in printed
    questions = [
        r["extra_info"]["question"] for t in ("train", "val") for r in pq.read_table(out / f"{t}.parquet").to_pylist()
    ]
    assert len(questions) == len({pd.normalize_question(q) for q in questions}) == 110
    assert "If Gallu is a demon Lilu is what?" in questions  # the first one seen (HotpotQA) is kept


def test_shuffle_is_seeded_and_changes_the_order() -> None:
    items = pd.load_items(str(HOTPOT_500), "--hotpotqa", pd.HOTPOTQA)
    a, b, c = pd.shuffled(items, 1), pd.shuffled(items, 1), pd.shuffled(items, 2)
    assert a == b and a != c and a != items
    assert sorted(a, key=lambda i: int(i.id)) == items  # a permutation, nothing lost


def test_cli_order_depends_on_seed_only(tmp_path: Path) -> None:
    def order(seed: str, name: str) -> list[str]:
        assert run_cli("--2wiki", TWOWIKI, "--out", tmp_path / name, "--seed", seed, "--val-size", "0") == 0
        return [r["extra_info"]["id"] for r in pq.read_table(tmp_path / name / "train.parquet").to_pylist()]

    first, again, other = order("5", "a"), order("5", "b"), order("6", "c")
    assert first == again != other
    assert first != [str(i) for i in range(1, 101)]


@pytest.mark.parametrize(
    ("available", "train", "val", "expected"),
    [
        (200, 150, 40, (150, 40)),
        (200, 100_000, 1000, (198, 2)),
        (10, 5, 5, (5, 5)),
        (9, 5, 5, (5, 4)),
        (1, 5, 5, (1, 0)),
    ],
)
def test_split_sizes(available: int, train: int, val: int, expected: tuple[int, int]) -> None:
    assert pd.split_sizes(available, train, val) == expected
    assert pd.split_sizes(3, 0, 5) == (0, 3)


def test_train_and_val_are_disjoint_when_fewer_records_than_requested(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run_cli("--hotpotqa", HOTPOT_500, "--2wiki", TWOWIKI, "--out", out) == 0  # defaults: 100000 + 1000
    train = pq.read_table(out / "train.parquet").to_pylist()
    val = pq.read_table(out / "val.parquet").to_pylist()
    assert (len(train), len(val)) == (198, 2)
    keys = {(r["data_source"], r["extra_info"]["id"]) for r in train}
    assert not keys & {(r["data_source"], r["extra_info"]["id"]) for r in val}
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in val}
    printed = capsys.readouterr().out
    assert "note: 200 unique questions < requested train 100000 + val 1000; wrote train 198 and val 2" in printed


def test_missing_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / "hotpot_train_v1.1.json"
    assert run_cli("--hotpotqa", missing, "--out", tmp_path / "out") == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err and "does not exist" in captured.err
    assert "hf:hotpotqa/hotpot_qa:distractor@train" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "out").exists()


def test_no_source_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("--out", tmp_path) == 2
    assert "at least one of --hotpotqa FILE and --2wiki FILE" in capsys.readouterr().err


def test_malformed_json_line_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = TWOWIKI.read_text(encoding="utf-8").splitlines()[:5]
    lines.insert(3, '{"idx": 4, "question": "broken')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(pd.DataError, match=re.escape(str(bad)) + r" line 4: not valid JSON"):
        pd.load_items(str(bad), "--2wiki", pd.TWOWIKI)
    assert run_cli("--2wiki", bad, "--out", tmp_path / "out") == 2
    assert f"{bad} line 4: not valid JSON" in capsys.readouterr().err


def test_other_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('[{"question": "q", "answer": "a"},\n{oops}]', encoding="utf-8")
    with pytest.raises(pd.DataError, match=re.escape(str(broken)) + r" line 2: not valid JSON"):
        pd.load_items(str(broken), "--hotpotqa", pd.HOTPOTQA)
    not_list = tmp_path / "obj.json"
    not_list.write_text('{"data": []}', encoding="utf-8")
    with pytest.raises(pd.DataError, match="a JSON list of records is needed"):
        pd.load_items(str(not_list), "--hotpotqa", pd.HOTPOTQA)
    csv = tmp_path / "x.csv"
    csv.write_text("q,a\n", encoding="utf-8")
    with pytest.raises(pd.DataError, match=r"unknown file type '\.csv'"):
        pd.load_items(str(csv), "--hotpotqa", pd.HOTPOTQA)
    with pytest.raises(pd.DataError, match="is a folder, not a file"):
        pd.load_items(str(tmp_path), "--2wiki", pd.TWOWIKI)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"question": "caf\u00e9?", "answer": "a"}\n'.encode("latin-1"))
    with pytest.raises(pd.DataError, match=re.escape(str(latin1)) + ": not UTF-8 text"):
        pd.load_items(str(latin1), "--hotpotqa", pd.HOTPOTQA)
    number = write_jsonl(tmp_path / "num.jsonl", [{"question": "Which year?", "answer": 1998}])
    assert pd.load_items(str(number), "--2wiki", pd.TWOWIKI)[0].answers == ("1998",)
    no_answer = write_jsonl(tmp_path / "na.jsonl", [{"idx": 1, "question": "q", "answer": "a"}, {"question": "q2"}])
    with pytest.raises(pd.DataError, match=re.escape(str(no_answer)) + r" line 2: no answer"):
        pd.load_items(str(no_answer), "--2wiki", pd.TWOWIKI)


def test_reads_parquet_in_the_hugging_face_schema(tmp_path: Path) -> None:
    records = json.loads(HOTPOT_TRAIN.read_text(encoding="utf-8"))[:5]
    hf_rows = [{"id": r["_id"], "question": r["question"], "answer": r["answer"], "type": r["type"]} for r in records]
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(hf_rows), path)
    items = pd.load_items(str(path), "--hotpotqa", pd.HOTPOTQA)
    assert [(i.id, i.question, i.answers) for i in items] == [
        (r["_id"], r["question"], (r["answer"],)) for r in records
    ]


def test_hugging_face_cache_is_read_offline_through_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    records = json.loads(HOTPOT_TRAIN.read_text(encoding="utf-8"))[:3]
    calls: list[tuple[Any, ...]] = []

    def load_dataset(name: str, config: str | None, split: str) -> list[dict[str, Any]]:
        calls.append((name, config, split, os.environ.get("HF_DATASETS_OFFLINE")))
        return [{"id": r["_id"], "question": r["question"], "answer": r["answer"]} for r in records]

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    items = pd.load_items("hf:hotpotqa/hotpot_qa:distractor@train", "--hotpotqa", pd.HOTPOTQA)
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "train", "1")]
    assert [i.id for i in items] == [r["_id"] for r in records]
    pd.load_items("hf:some/2wiki", "--2wiki", pd.TWOWIKI)
    assert calls[-1][:3] == ("some/2wiki", None, "train")


def test_hugging_face_without_datasets_or_cache_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(pd.DataError, match="needs the 'datasets' package"):
        pd.load_items("hf:hotpotqa/hotpot_qa:distractor", "--hotpotqa", pd.HOTPOTQA)

    def not_cached(name: str, config: str | None, split: str) -> None:
        raise ConnectionError("offline and not in the cache")

    fake = types.ModuleType("datasets")
    fake.load_dataset = not_cached  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(pd.DataError, match=r"not loadable from the Hugging Face cache.*offline and not in the cache"):
        pd.load_items("hf:hotpotqa/hotpot_qa:distractor", "--hotpotqa", pd.HOTPOTQA)


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    assert pd.main(["--hotpotqa", str(HOTPOT_TRAIN), "--out", str(taken)]) == 1
    assert f"error: cannot write to {taken}" in capsys.readouterr().err
    assert taken.read_text() == "not a folder"


def test_rewrite_replaces_the_old_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_cli("--2wiki", TWOWIKI, "--out", out, "--train-size", "50", "--val-size", "5") == 0
    assert run_cli("--2wiki", TWOWIKI, "--out", out, "--train-size", "20", "--val-size", "3") == 0
    assert pq.read_table(out / "train.parquet").num_rows == 20 and pq.read_table(out / "val.parquet").num_rows == 3
    assert sorted(os.listdir(out)) == ["train.parquet", "val.parquet"]


def test_python_dash_m_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "recipe.prepare_data", "--hotpotqa", str(HOTPOT_TRAIN), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "hotpotqa: read 100" in done.stdout
    assert pq.read_table(tmp_path / "train.parquet").num_rows + pq.read_table(tmp_path / "val.parquet").num_rows == 100
    missing = subprocess.run(
        [sys.executable, "-m", "recipe.prepare_data", "--2wiki", "absent.jsonl", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert missing.returncode == 2 and "--2wiki absent.jsonl: does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_recipe_does_not_import_guardian() -> None:
    for module in (pd, prompt):
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        assert "import guardian" not in source and "from guardian" not in source
