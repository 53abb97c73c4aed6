"""recipe.search.hotpot_corpus on the real HotpotQA sample: one wiki-18 passage per context title."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.search.hotpot_corpus import main
from recipe.search.passage import split_contents

FIXTURES = Path(__file__).parents[1] / "fixtures" / "recipe"
HOTPOT = FIXTURES / "hotpotqa_train_100.json"


def test_every_context_title_becomes_one_passage(tmp_path: Path) -> None:
    out = tmp_path / "corpus.jsonl"
    assert main(["--hotpotqa", str(HOTPOT), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    titles = [split_contents(row["contents"])[0] for row in rows]
    assert len(rows) == 994 == len(set(titles))  # the sample's 100 questions × 10 paragraphs share titles
    assert [row["id"] for row in rows] == [str(i) for i in range(len(rows))]
    records = json.loads(HOTPOT.read_text(encoding="utf-8"))
    supporting = {title for record in records for title, _ in record["supporting_facts"]}
    assert supporting <= set(titles)
    first_title, first_sentences = records[0]["context"][0]
    assert rows[0]["contents"] == f'"{first_title}"\n' + " ".join(s.strip() for s in first_sentences)


def test_records_without_contexts_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qa_only = FIXTURES / "2wiki_500_first100.jsonl"
    assert main(["--hotpotqa", str(qa_only), "--out", str(tmp_path / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{qa_only} line 1: no 'context' paragraphs" in err
    assert not (tmp_path / "c.jsonl").exists() and not list(tmp_path.iterdir())
