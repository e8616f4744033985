"""Atomic stage outputs: a crash leaves the previous state intact."""

import json

import pytest

from conftest import make_tokenizer
from draftsmith.artifacts import atomic_dir, tokenizer_hash, write_json


def test_atomic_dir_creates_and_replaces(tmp_path):
    out = tmp_path / "stage"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (out / "a.txt").read_text() == "one"
    with atomic_dir(out) as tmp:
        (tmp / "b.txt").write_text("two")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["stage"]  # no temporary leftovers


def test_atomic_dir_crash_keeps_previous_output(tmp_path):
    out = tmp_path / "stage"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("good")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (out / "a.txt").read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["stage"]


def test_write_json_roundtrip(tmp_path):
    write_json(tmp_path / "m.json", {"a": 1})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 1}


def test_tokenizer_hash_tells_tokenizers_apart():
    assert tokenizer_hash(make_tokenizer()) == tokenizer_hash(make_tokenizer())
    assert tokenizer_hash(make_tokenizer()) != tokenizer_hash(make_tokenizer(["a", "b"]))
