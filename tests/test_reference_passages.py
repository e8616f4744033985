"""data.demo_scored: language-reference passages as given answers beside the stdlib-chat prompts."""

import json

import pytest

from draftsmith.artifacts.errors import ConfigError
from draftsmith.chat_prompts import _unwrap, reference_passage_records, reference_passages, write_stdlib_chat_prompts


def test_passages_are_bounded_and_cover_the_reference():
    from pydoc_data.topics import topics

    passages = reference_passages(chars=260)
    assert {t for t, _ in passages} <= set(topics)
    assert len({t for t, _ in passages}) > 0.9 * len(topics)
    assert all(40 < len(p) <= 261 for _, p in passages)
    kept = sum(len(p) for _, p in passages)
    assert kept > 0.8 * sum(len(" ".join(t.split())) for t in topics.values())  # most of the text, not a sample


def test_unwrap_joins_prose_and_keeps_code_lines():
    assert _unwrap("   Called for\n   instances of it.\n") == "Called for instances of it."
    assert _unwrap("   a ::= b\n      | c\n") == "a ::= b\n   | c"


def test_records_end_with_the_assistant_answer_and_the_file_holds_both_kinds(tmp_path):
    records = reference_passage_records(5, seed=0)
    assert len(records) == 5
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in records)
    assert records == reference_passage_records(5, seed=0)  # deterministic for a seed
    path = write_stdlib_chat_prompts(tmp_path / "p.jsonl", n=7, seed=0, scored=5)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 12 and sum(r["messages"][-1]["role"] == "assistant" for r in rows) == 5


@pytest.mark.parametrize("prompts, responses", [("stdlib-chat", "generate"), ("stdlib-chat", "given"),
                                                ("demo", "auto")])
def test_demo_scored_needs_stdlib_chat_and_auto(prompts, responses):
    from draftsmith.config import DraftsmithConfig, validate

    c = DraftsmithConfig()
    c.data.prompts, c.data.responses, c.data.demo_scored = prompts, responses, 10
    with pytest.raises(ConfigError, match="data.demo_scored"):
        validate(c)
