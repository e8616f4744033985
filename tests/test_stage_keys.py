"""draftsmith/stage_keys.py: one declaration of what each stage's hash covers, and the docs table made from it."""

import dataclasses
import re
from pathlib import Path

import pytest

from draftsmith import stage_keys
from draftsmith.artifacts.hashing import stage_digest
from draftsmith.config import DraftsmithConfig

ROOT = Path(__file__).resolve().parents[1]


def changed(value):
    """Another value of the same kind, to see whether a hash notices it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, list):
        return [*value, 99]
    if isinstance(value, dict):
        return {**value, "changed": 1}
    return "changed"


def with_key(cfg, key: str, new):
    *path, last = key.split(".")
    node = cfg
    for part in path:
        node = getattr(node, part)
    object.__setattr__(node, last, new)


def digests(cfg) -> dict[str, str]:
    return {s: stage_digest(s, stage_keys.stage_section(cfg, s), {}) for s in stage_keys.STAGE_KEYS}


def test_every_config_key_is_declared_hashed_or_unhashed():
    """A new setting must say which stage it re-runs (or that it re-runs none, and why): one that does not fails."""
    assert stage_keys.undeclared(DraftsmithConfig()) == []

    @dataclasses.dataclass
    class WithNewKey(DraftsmithConfig):
        brand_new: int = 0

    assert stage_keys.undeclared(WithNewKey()) == ["brand_new"]


def test_declarations_name_real_keys_and_stages():
    leaves = {key for key, _ in stage_keys.leaf_keys(DraftsmithConfig())}
    for stage, d in stage_keys.STAGE_KEYS.items():
        for key in (*d.keys, *d.derived, *stage_keys.UNHASHED):
            assert any(leaf == key or leaf.startswith(key + ".") for leaf in leaves), (stage, key)
        assert set(d.after) <= set(stage_keys.STAGE_KEYS), stage


@pytest.mark.parametrize("key, where", stage_keys.leaf_keys(DraftsmithConfig()))
def test_a_change_moves_exactly_the_hashes_declared(key, where):
    """Changing a key moves the hash of every stage that declares it by value and of no other (a key read through
    a derived fact moves it through the pipeline's facts, not here)."""
    base = digests(DraftsmithConfig())
    cfg = DraftsmithConfig()
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    with_key(cfg, key, changed(node))
    moved = {s for s, h in digests(cfg).items() if h != base[s]}
    by_value = {s for s, d in stage_keys.STAGE_KEYS.items()
                if not where and any(key == k or key.startswith(k + ".") for k in d.keys)}
    assert moved == by_value


def test_runs_again_follows_the_stages_that_read_an_output():
    assert stage_keys.runs_again("method.loss") == ["train", "eval", "serve", "promote"]
    assert stage_keys.runs_again("serve.concurrency") == ["serve", "promote"]
    assert stage_keys.runs_again("eval.k") == ["eval", "serve", "promote"]
    assert stage_keys.runs_again("serve.python", where=True) == []
    assert stage_keys.runs_again("pair.target") == list(stage_keys.ORDER)


def test_the_configuration_page_shows_the_table_the_declarations_make():
    page = (ROOT / "docs" / "configuration.md").read_text()
    found = re.search(r"<!-- runs-again: begin.*?-->\n(.*?)\n<!-- runs-again: end -->", page, re.S)
    assert found, "docs/configuration.md lost its runs-again markers"
    assert found.group(1) == stage_keys.runs_again_table(DraftsmithConfig()), (
        "docs/configuration.md's 'What a change runs again' differs from draftsmith/stage_keys.py: paste the output of "
        "python -c 'from draftsmith.stage_keys import runs_again_table as t; from draftsmith.config import "
        "DraftsmithConfig as C; print(t(C()))'")


@pytest.mark.parametrize("key", [key for key, where in stage_keys.leaf_keys(DraftsmithConfig())
                                 if key.startswith("promote.") and not where])
def test_the_decision_contract_reads_only_promote_keys_the_eval_and_serve_declare(key):
    """The eval and serve stages hash the decision contract (eval/policy.py Contract.of) as a fact: every
    promote.* key that moves it is declared as read by the stage that hashes that part."""
    from draftsmith.eval.policy import Contract

    def contract(cfg):
        return Contract.of(cfg.promote, production=True, free=True)

    cfg = DraftsmithConfig()
    base = contract(cfg)
    node = getattr(cfg.promote, key.split(".", 1)[1])
    with_key(cfg, key, changed(node))
    now = contract(cfg)
    for stage, moved in (("serve", now != base), ("eval", now.at_batch1() != base.at_batch1())):
        if moved:
            assert key in stage_keys.STAGE_KEYS[stage].derived, f"{key} moves the {stage} stage's contract"
