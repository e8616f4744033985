"""Promotion gates on intervals (eval/gates.py), on hand-made summaries: clear pass, clear fail, straddle ->
inconclusive, the acceptance rule only without a measured speedup, the champion by the paired difference."""

import pytest

from draftsmith.eval.gates import INCONCLUSIVE, PROMOTED, REFUSED, Gates, decide

GOOD = {"best_k": 4, "speedup": 1.5, "speedup_ci95": [1.4, 1.6], "repeats": 2, "acceptance_rate": 0.7,
        "greedy_match": 1.0}


def test_a_clear_pass_is_promoted():
    d = decide(GOOD, Gates())
    assert d["promote"] and d["decision"] == PROMOTED and d["rule"] == "speedup interval"
    assert d["reasons"] == ["all gates passed"] and d["gates"]["min_speedup"] == 1.1
    assert d["checks"][0]["reason"] == "speedup 1.50x [1.40, 1.60] at K=4: its 95% interval clears min_speedup 1.1"


def test_a_clear_fail_is_refused_and_a_straddle_is_inconclusive():
    d = decide(GOOD | {"speedup": 1.0, "speedup_ci95": [0.95, 1.05]}, Gates())
    assert not d["promote"] and d["decision"] == REFUSED and "< min_speedup 1.1" in d["reasons"][0]
    d = decide(GOOD | {"speedup": 1.15, "speedup_ci95": [1.05, 1.25]}, Gates())
    assert not d["promote"] and d["decision"] == INCONCLUSIVE
    assert "interval straddles min_speedup 1.1 after 2 passes" in d["reasons"][0] and "eval.max_repeats" in d["reasons"][0]
    d = decide(GOOD | {"speedup_ci95": None}, Gates())  # a point estimate without an interval decides nothing
    assert d["decision"] == INCONCLUSIVE and "has no 95% interval" in d["reasons"][0]
    # the lower bound reaching the bar clears it
    assert decide(GOOD | {"speedup_ci95": [1.1, 1.9]}, Gates())["decision"] == PROMOTED


def test_a_measured_gain_is_not_vetoed_by_the_acceptance_rule():
    d = decide(GOOD | {"acceptance_rate": 0.39}, Gates())  # K=3, token acceptance 0.6: accepted/drafted 0.39
    assert d["decision"] == PROMOTED and d["rule"] == "speedup interval"


def test_the_acceptance_rule_decides_only_without_a_measured_speedup():
    unmeasured = GOOD | {"speedup": 0.0, "speedup_ci95": None}
    d = decide(unmeasured | {"acceptance_rate": 0.49}, Gates())
    assert d["decision"] == REFUSED and d["rule"].startswith("acceptance rule of thumb")
    assert d["reasons"][0].startswith("no speedup measured; acceptance rate 0.490 < min_acceptance_rate 0.5")
    assert decide(unmeasured, Gates())["decision"] == PROMOTED


def test_greedy_mismatch_refuses_and_every_failure_is_listed():
    d = decide(GOOD | {"greedy_match": 0.9}, Gates())
    assert d["decision"] == REFUSED and d["reasons"][0].startswith("greedy_match 0.9 != 1.0")
    d = decide({"best_k": 2, "speedup": 0.9, "speedup_ci95": [0.8, 1.0], "acceptance_rate": 0.3,
                "greedy_match": 0.5}, Gates())
    assert d["decision"] == REFUSED and len(d["reasons"]) == 2  # speedup and greedy; the acceptance rule is silent
    assert [c["gate"] for c in d["checks"]] == ["speedup", "greedy_match"]


def test_a_fail_outranks_an_unsure_gate():
    d = decide(GOOD | {"speedup": 1.15, "speedup_ci95": [1.05, 1.25], "greedy_match": 0.5}, Gates())
    assert d["decision"] == REFUSED and len(d["reasons"]) == 2


def test_champion_by_the_paired_difference():
    champion = {"speedup": 1.40, "speedup_ci95": [1.3, 1.5]}
    d = decide(GOOD, Gates(), champion=champion, difference_ci95=[0.05, 0.15])
    assert d["decision"] == PROMOTED and d["difference_ci95"] == [0.05, 0.15]
    d = decide(GOOD, Gates(), champion=champion, difference_ci95=[-0.05, 0.01])
    assert d["decision"] == REFUSED and "does not beat the production draft's 1.400 [1.300, 1.500] by the margin 0.02" in d["reasons"][0]
    d = decide(GOOD, Gates(), champion=champion, difference_ci95=[-0.02, 0.2])
    assert d["decision"] == INCONCLUSIVE and "straddles the margin 0.02" in d["reasons"][0]
    assert "measured side by side" in d["reasons"][0] and "production draft's 1.400 [1.300, 1.500]" in d["reasons"][0]


def test_a_recorded_champion_is_compared_with_the_candidates_interval():
    d = decide(GOOD, Gates(champion_margin=0.05), champion={"speedup": 1.30})  # 1.4 >= 1.35: beats it
    assert d["decision"] == PROMOTED
    d = decide(GOOD, Gates(champion_margin=0.05), champion={"speedup": 1.47})  # 1.52 inside [1.4, 1.6]
    assert d["decision"] == INCONCLUSIVE and "vs the production draft's 1.470:" in d["reasons"][0]
    d = decide(GOOD, Gates(champion_margin=0.05), champion={"speedup": 1.60})
    assert d["decision"] == REFUSED and d["champion"] == {"speedup": 1.60}


def test_serving_off_is_refused_unless_the_best_k_interval_reaches_the_bar():
    serving = {"concurrency": 8, "best_speedup": 0.95, "best_speedup_k": 2, "best_speedup_ci95": [0.9, 1.0],
               "outputs_unequal": []}
    off = GOOD | {"best_k": 0, "speedup": 1.0, "speedup_ci95": None, "serving": serving}
    d = decide(off, Gates())
    assert d["decision"] == REFUSED and "serve without speculation" in d["reasons"][0]
    d = decide(off | {"serving": serving | {"best_speedup_ci95": [0.8, 1.2]}}, Gates())
    assert d["decision"] == INCONCLUSIVE and "reaches min_speedup 1.1" in d["reasons"][0]


def test_greedy_match_gate_can_be_disabled():
    assert decide(GOOD | {"greedy_match": None}, Gates(require_greedy_match=False))["promote"]


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="lack 'speedup'"):
        decide({"best_k": 4}, Gates())
    with pytest.raises(ValueError, match="promote.min_acceptance_rate"):
        Gates(min_acceptance_rate=1.5)


NGRAM = {"name": "ngram", "best_k": 3, "speedup": 1.3, "speedup_ci95": [1.2, 1.4]}


def test_the_training_free_gate_on_the_paired_difference():
    """Draft beats n-gram: promoted; n-gram beats the draft: refused, saying what to serve; a straddle:
    inconclusive; an n-gram that does not pay here is no rival."""
    d = decide(GOOD, Gates(), free=NGRAM | {"difference_ci95": [0.1, 0.3]})
    assert d["decision"] == PROMOTED and d["training_free"]["name"] == "ngram"
    assert [c["result"] for c in d["checks"] if c["gate"] == "training_free"] == ["pass"]
    d = decide(GOOD, Gates(), free=NGRAM | {"speedup": 1.9, "speedup_ci95": [1.8, 2.0], "difference_ci95": [-0.5, -0.3]})
    assert d["decision"] == REFUSED
    assert d["reasons"][0].startswith("serve ngram with K=3: 1.90x [1.80, 2.00]; the trained draft (1.50x [1.40, 1.60]) "
                                      "adds nothing measurable")
    d = decide(GOOD, Gates(), free=NGRAM | {"speedup": 1.45, "difference_ci95": [-0.1, 0.2]})
    assert d["decision"] == INCONCLUSIVE and "straddles 0.0" in d["reasons"][0]
    # the margin moves the bar: a gain of [0.1, 0.3] does not clear a margin of 0.2 for sure
    assert decide(GOOD, Gates(free_margin=0.2), free=NGRAM | {"difference_ci95": [0.1, 0.3]})["decision"] == INCONCLUSIVE
    d = decide(GOOD, Gates(), free=NGRAM | {"pays": False, "speedup": 0.9, "speedup_ci95": [0.8, 0.97],
                                           "difference_ci95": None})
    assert d["decision"] == PROMOTED
    assert "does not pay here" in next(c["reason"] for c in d["checks"] if c["gate"] == "training_free")
    # without paired timings, the candidate's own interval against the method's figure
    assert decide(GOOD, Gates(), free=NGRAM | {"difference_ci95": None})["decision"] == PROMOTED  # [1.4, 1.6] vs 1.3
    assert decide(GOOD, Gates(), free=NGRAM | {"speedup": 1.5, "difference_ci95": None})["decision"] == INCONCLUSIVE
    assert decide(GOOD, Gates())["training_free"] is None  # none measured: no gate
    # the cells short of the server lives a difference is declared on: held, whatever the requests say
    short = "trained K=2 and ngram K=2 ran on 3 and 1 server lives, fewer than the 3 a difference is declared on"
    d = decide(GOOD, Gates(), free=NGRAM | {"speedup": 1.9, "difference_ci95": None, "short_lives": short})
    assert d["decision"] == INCONCLUSIVE and short in d["reasons"][0]
