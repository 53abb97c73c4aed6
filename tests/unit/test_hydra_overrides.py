"""Overrides read with hydra-core's parser: ops, values, one-line errors (that the CLI starts without hydra:
test_lean_imports.py)."""

from __future__ import annotations

import pytest

from guardian.hydra_overrides import OverrideSyntaxError, parse, parse_value
from guardian.overrides import parse_command, parse_override
from guardian.verl_keys import PatchError


@pytest.mark.parametrize(
    ("text", "op", "key", "value_text", "value"),
    [
        ("a.b=1", "", "a.b", "1", 1),
        ("+a.b=1e-6", "+", "a.b", "1e-6", 1e-6),
        ("++a.b=[x,'y z']", "++", "a.b", "[x,'y z']", ["x", "y z"]),
        ("~a.b", "~", "a.b", None, None),
        ("a=", "", "a", "", ""),
        ("a=${x.y}", "", "a", "${x.y}", "${x.y}"),
    ],
)
def test_parse_reads_op_key_and_value(text: str, op: str, key: str, value_text: str | None, value: object) -> None:
    parsed = parse(text)
    assert (parsed.op, parsed.key, parsed.value_text, parsed.value) == (op, key, value_text, value)


@pytest.mark.parametrize("text", ["a=[1,2", "a=b=c", "=1", "k='x", "job"])
def test_grammar_errors_are_one_line_naming_the_argument(text: str) -> None:
    with pytest.raises(OverrideSyntaxError) as exc:
        parse(text)
    message = str(exc.value)
    assert "\n" not in message and repr(text) in message and "key=value" in message


def test_a_sweep_is_refused_with_the_two_spellings_verl_takes() -> None:
    with pytest.raises(OverrideSyntaxError, match=r"sweep.*a=\[a,b\].*a='a,b'"):
        parse("a=1,2")


def test_cached_values_are_copies() -> None:
    parse_value("[a,b]").append("c")
    assert parse_value("[a,b]") == ["a", "b"]


def test_launch_command_names_a_bad_override() -> None:
    assert parse_override("--cfg") is None and parse_override("job") is None
    with pytest.raises(PatchError, match=r"'trainer.logger=\[console' is not a Hydra override"):
        parse_command(["python", "-m", "verl.trainer.main_ppo", "trainer.logger=[console"])
