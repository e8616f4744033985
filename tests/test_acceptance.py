"""The acceptance arithmetic (decode/acceptance.py), by hand: figures from counts, pooling as adding counts."""

import subprocess
import sys

import pytest

from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR, AcceptanceCounts
from draftsmith.decode.stats import SpeculativeStats
from draftsmith.eval.gates import Gates
from draftsmith.eval.metrics import acceptance_summary


def run(rounds, k=3, overlap_sum=None):
    """Stats of one decode from (drafted, accepted, kept) per round, as the loop records them."""
    stats = SpeculativeStats(k=k, drafted_per_position=[0] * k, accepted_per_position=[0] * k, overlap_sum=overlap_sum)
    for drafted, accepted, kept in rounds:
        stats.record_round(drafted, accepted, kept)
    return stats


def test_a_rejection_in_the_middle_of_a_block():
    """K=3: round 1 accepts d1, rejects d2 (d3 drafted, never tested); round 2 accepts all three plus the bonus."""
    counts = run([(3, 1, None), (3, 3, None)]).counts()
    assert (counts.drafted, counts.accepted, counts.rounds, counts.rejected) == (6, 4, 2, 1)
    assert counts.round_tokens == (1 + 1) + (3 + 1)
    assert counts.acceptance_rate == pytest.approx(4 / 6)  # d3 of round 1 counts as drafted
    assert counts.token_acceptance == pytest.approx(4 / 5)  # ... but not as tested
    assert counts.mean_accepted_tokens == pytest.approx(6 / 2)
    assert counts.drafted_per_position == [2, 2, 2] and counts.accepted_per_position == [2, 1, 1]
    assert counts.per_position_acceptance == [1.0, 0.5, 0.5]
    assert counts.expected_acceptance is None  # greedy


def test_an_eos_cut_round_produces_fewer_tokens_than_accepted_plus_one():
    """Two of three accepted, but the second accepted draft is EOS: the round kept 2 tokens, not 3."""
    counts = run([(3, 2, 2)]).counts()
    assert counts.round_tokens == 2 and counts.mean_accepted_tokens == 2.0
    derived = AcceptanceCounts(drafted=3, accepted=2, rounds=1)  # no EOS cut known (vLLM): accepted + rounds
    assert derived.mean_accepted_tokens == 3.0


def test_pooling_two_runs_equals_one_run_over_both():
    a = run([(3, 1, None), (3, 3, None)], overlap_sum=4.5)
    b = run([(2, 0, None), (3, 2, 2)], overlap_sum=1.25)
    both = run([(3, 1, None), (3, 3, None), (2, 0, None), (3, 2, 2)], overlap_sum=5.75)
    pooled = AcceptanceCounts.pooled([a.counts(), b.counts()])
    assert pooled == both.counts() == a.counts() + b.counts()
    assert pooled.figures() == both.counts().figures()
    # by hand: drafted 11, accepted 6, rejected 3 (rounds 1, 3, 4), 4 rounds making 2 + 4 + 1 + 2 tokens
    assert pooled.acceptance_rate == pytest.approx(6 / 11) and pooled.token_acceptance == pytest.approx(6 / 9)
    assert pooled.mean_accepted_tokens == pytest.approx(9 / 4)
    assert pooled.expected_acceptance == pytest.approx(5.75 / 11)
    assert pooled.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 3])
    summary = acceptance_summary(3, [a, b])
    assert {name: summary[name] for name in pooled.figures()} == pooled.figures()
    assert a.counts() == run([(3, 1, None), (3, 3, None)], overlap_sum=4.5).counts()  # the inputs are untouched


def test_per_position_counts_pad_to_the_longer_list():
    short = AcceptanceCounts(drafted=3, accepted=2, rounds=2, drafted_per_position=[2, 1], accepted_per_position=[1, 1])
    long = AcceptanceCounts(drafted=6, accepted=3, rounds=3, drafted_per_position=[3, 2, 1],
                            accepted_per_position=[2, 1, 0])
    total = short + long
    assert total.drafted_per_position == [5, 3, 1] and total.accepted_per_position == [3, 2, 0]
    assert total.per_position_acceptance == pytest.approx([3 / 5, 2 / 3, 0.0])
    assert (long + short) == total
    assert short.drafted_per_position == [2, 1]  # not padded in place


def test_figures_are_none_when_undefined_or_unknown():
    empty = AcceptanceCounts()
    assert empty.figures() == {"acceptance_rate": None, "token_acceptance": None, "expected_acceptance": None,
                               "mean_accepted_tokens": None, "per_position_acceptance": []}
    assert AcceptanceCounts.pooled([]) == empty
    known = AcceptanceCounts(drafted=4, accepted=2, rounds=2, rejected=1, overlap_sum=3.0)
    unknown = AcceptanceCounts(drafted=4, accepted=3, rounds=2)  # rejected and overlap not counted
    pooled = known + unknown
    assert pooled.rejected is None and pooled.token_acceptance is None  # unknown stays unknown
    assert pooled.overlap_sum is None and pooled.expected_acceptance is None
    assert pooled.acceptance_rate == pytest.approx(5 / 8)
    nothing = AcceptanceCounts(rejected=0, overlap_sum=0.0, drafted_per_position=[0])  # known, nothing drafted
    assert nothing.acceptance_rate is None and nothing.per_position_acceptance == [None]
    assert nothing.figures(undefined=0.0) == {"acceptance_rate": 0.0, "token_acceptance": 0.0,
                                              "expected_acceptance": 0.0, "mean_accepted_tokens": 0.0,
                                              "per_position_acceptance": [0.0]}
    assert empty.figures(undefined=0.0)["token_acceptance"] is None  # unknown is not "nothing drafted"


def test_vllm_style_counts_without_rejections():
    """4 drafts of K=3 (vLLM's counters): 12 draft tokens, 7 accepted, 4 / 2 / 1 at positions 0 / 1 / 2."""
    counts = AcceptanceCounts(drafted=12.0, accepted=7.0, rounds=4.0, drafted_per_position=[4.0] * 3,
                              accepted_per_position=[4.0, 2.0, 1.0])
    assert counts.acceptance_rate == pytest.approx(7 / 12)
    assert counts.token_acceptance is None  # vLLM does not count rejected rounds
    assert counts.mean_accepted_tokens == pytest.approx(1 + 7 / 4)  # (accepted + rounds) / rounds
    assert counts.per_position_acceptance == [1.0, 0.5, 0.25]
    later = AcceptanceCounts(drafted=3.0, accepted=3.0, rounds=1.0, drafted_per_position=[1.0] * 3,
                             accepted_per_position=[1.0] * 3)
    assert (counts + later).round_tokens is None  # still derived: accepted + rounds
    assert (counts + later).mean_accepted_tokens == pytest.approx((10 + 5) / 5)
    ours = run([(3, 2, 2)]).counts()  # a loop's counts with an EOS cut, pooled with vLLM-style ones
    assert (ours + later).round_tokens == 2 + (3 + 1)


def test_speculative_stats_keep_their_zero_conventions():
    stats = SpeculativeStats(k=2, drafted_per_position=[0, 0], accepted_per_position=[0, 0])
    assert (stats.acceptance_rate, stats.token_acceptance, stats.mean_accepted_tokens) == (0.0, 0.0, 0.0)
    assert stats.per_position_acceptance == [0.0, 0.0] and stats.expected_acceptance is None
    stats.overlap_sum = 0.0
    assert stats.expected_acceptance == 0.0
    done = run([(3, 1, None)], overlap_sum=2.4)
    assert done.to_dict()["token_acceptance"] == 0.5 and done.expected_acceptance == pytest.approx(0.8)
    assert acceptance_summary(2, []) == {"acceptance_rate": 0.0, "token_acceptance": 0.0, "expected_acceptance": 0.0,
                                         "mean_accepted_tokens": 0.0, "per_position_acceptance": [0.0, 0.0],
                                         "target_forwards": 0, "draft_forwards": 0}


def test_the_floor_is_one_constant():
    assert ACCEPTANCE_FLOOR == 0.5 and Gates().min_acceptance_rate == ACCEPTANCE_FLOOR


def test_the_acceptance_module_needs_no_torch():
    code = "import sys, draftsmith.decode.acceptance; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
