"""One retrieved passage, and the corpus row format it comes from.

A wiki-18 corpus line is ``{"id": "…", "contents": "\"Title\"\ntext"}`` (Search-R1, FlashRAG): the first line of
``contents`` is the title in double quotes, the rest is the passage text.
"""

from __future__ import annotations

from dataclasses import dataclass


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a corpus row's ``contents``. The title line loses its surrounding quotes; a row without a
    newline is all text and has an empty title."""
    head, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents.strip()
    return head.strip().strip('"').strip(), rest.strip()


@dataclass(frozen=True, slots=True)
class Passage:
    """A passage as the retriever returns it: the corpus row's id and contents split into title and text, and the
    BM25 score of the query it answers."""

    doc_id: str
    title: str
    text: str
    score: float

    @classmethod
    def from_row(cls, row: dict[str, object], score: float) -> Passage:
        """From a corpus row (``id``, ``contents``) as the ``/retrieve`` API returns it under ``document``."""
        title, text = split_contents(str(row.get("contents", "")))
        return cls(doc_id=str(row.get("id", "")), title=title, text=text, score=float(score))


class RetrievalError(Exception):
    """The retriever could not answer (unreachable, timed out, or refused the request). The message names the URL,
    what failed and after how many attempts; the agent shows the model an empty result and counts the failure."""
