"""The embedded demo pair: built from the standard library with draftsmith's own stages, then cached."""

import json

import pytest

from draftsmith.decode import load_pair, speculative_generate
from draftsmith.demo import (
    DOMAIN_PACKAGES,
    PRESETS,
    DraftSpec,
    ModelSpec,
    build_demo_draft,
    build_demo_target,
    demo_prompts,
    in_domain,
    read_texts,
    stdlib_files,
    train_tokenizer,
    write_domain_prompts,
)


def test_stdlib_files_exclude_tests_and_generated_tables():
    files = stdlib_files()
    assert len(files) > 100
    parts = {part for f in files for part in f.parts}
    assert not parts & {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages"}


@pytest.mark.slow
def test_tiny_demo_pair_builds_once_and_decodes(tmp_path):
    spec = PRESETS["tiny"]
    target_dir = build_demo_target(spec, root=tmp_path, log=lambda m: None)
    draft_spec = DraftSpec(model=ModelSpec(layers=1, hidden=16, heads=2, steps=3), prompts=24, prompt_tokens=8,
                           max_new_tokens=6, batch_size=4)
    draft_dir = build_demo_draft(target_dir, draft_spec, root=tmp_path, log=lambda m: None)
    manifests = sorted(tmp_path.glob("*/manifest.json"))
    assert len(manifests) == 2
    stamps = [m.stat().st_mtime_ns for m in manifests]
    assert build_demo_target(spec, root=tmp_path) == target_dir  # cached: nothing rebuilt
    assert build_demo_draft(target_dir, draft_spec, root=tmp_path) == draft_dir
    assert [m.stat().st_mtime_ns for m in manifests] == stamps
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(m.parent.name for m in manifests)  # no temp dirs

    for draft in (draft_dir, target_dir.parent / "base-draft"):
        pair = load_pair(target_dir, draft)
        prompt = demo_prompts(pair.tokenizer, 1, 8)[0]
        out = speculative_generate(pair.target, pair.draft, prompt, k=3, max_new_tokens=8)
        assert out.sequences.shape[1] == 16


def test_domain_prompts_come_from_domain_packages_only(tmp_path):
    files = stdlib_files()
    domain = [f for f in files if in_domain(f, DOMAIN_PACKAGES)]
    assert 0 < len(domain) < len(files) // 2
    assert all(in_domain(f, ("json",)) == ("json" in f.parts) for f in files)
    json_texts = read_texts([f for f in files if in_domain(f, ("json",))])
    tok = train_tokenizer(json_texts, 300)
    path = write_domain_prompts(tmp_path / "p.jsonl", tok, n=5, prompt_tokens=6, domain=("json",))
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(prompts) == 5
    assert all(any(p in t for t in json_texts) for p in prompts)  # every prompt is a cut of a json/ file
