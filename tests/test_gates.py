"""Promotion gate logic on hand-made metrics: pass, each failing gate, the champion comparison."""

import pytest

from draftsmith.eval.gates import Gates, decide

GOOD = {"best_k": 4, "speedup": 1.5, "acceptance_rate": 0.7, "greedy_match": 1.0}


def test_a_good_candidate_passes():
    d = decide(GOOD, Gates())
    assert d["promote"] and d["reasons"] == ["all gates passed"] and d["gates"]["min_speedup"] == 1.1


@pytest.mark.parametrize("change, reason", [
    ({"acceptance_rate": 0.49}, "acceptance rate 0.490 < min_acceptance_rate 0.5"),
    ({"speedup": 1.05}, "speedup 1.050 at K=4 < min_speedup 1.1"),
    ({"greedy_match": 0.9}, "greedy_match 0.9 != 1.0"),
])
def test_each_failing_gate_is_named(change, reason):
    d = decide(GOOD | change, Gates())
    assert not d["promote"] and len(d["reasons"]) == 1 and d["reasons"][0].startswith(reason)


def test_all_failures_are_listed():
    d = decide({"best_k": 2, "speedup": 0.9, "acceptance_rate": 0.3, "greedy_match": 0.5}, Gates())
    assert not d["promote"] and len(d["reasons"]) == 3


def test_champion_must_be_beaten_by_the_margin():
    assert decide(GOOD, Gates(), champion={"speedup": 1.40})["promote"]
    d = decide(GOOD, Gates(champion_margin=0.05), champion={"speedup": 1.47})
    assert not d["promote"] and "does not beat the production draft's 1.470" in d["reasons"][0]
    assert d["champion"] == {"speedup": 1.47}


def test_greedy_match_gate_can_be_disabled():
    assert decide(GOOD | {"greedy_match": None}, Gates(require_greedy_match=False))["promote"]


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="lack 'speedup'"):
        decide({"best_k": 4}, Gates())
    with pytest.raises(ValueError, match="promote.min_acceptance_rate"):
        Gates(min_acceptance_rate=1.5)
