"""Eval metric arithmetic by hand (eval/metrics.py)."""

import math

import pytest

from draftsmith.decode.stats import DecodeStats, SpeculativeStats
from draftsmith.eval.metrics import cell_record, slowdown_warning
from draftsmith.eval.theory import predicted_speedup


def spec_stats(rounds, k=3):
    """SpeculativeStats from (k_round, n_accepted) pairs; 1 s per round, tokens = n+1 each."""
    s = SpeculativeStats(k=k, drafted_per_position=[0] * k, accepted_per_position=[0] * k)
    for k_r, n in rounds:
        s.record_round(k_r, n)
    s.new_tokens = sum(n + 1 for _, n in rounds)
    s.total_s, s.ttft_s = float(len(rounds)), 0.5
    s.target_forwards, s.draft_forwards = len(rounds) + 1, sum(k for k, _ in rounds) + 1
    return s


def plain_stats(tokens, seconds):
    return DecodeStats(new_tokens=tokens, target_forwards=tokens, ttft_s=0.2, total_s=seconds)


def test_cell_record_by_hand():
    a = spec_stats([(3, 3), (3, 1)])  # 4 accepted of 6 drafted; tested 3 + 2 = 5 (one rejection)
    b = spec_stats([(3, 0), (2, 2)])  # 2 accepted of 5 drafted; tested 1 + 2 = 3
    base = [plain_stats(6, 4.0), plain_stats(4, 4.0)]
    rec = cell_record(3, 0.0, base, [a, b], c=0.1, c_v=1.2, outputs_equal=[True, True])
    assert rec.acceptance_rate == 6 / 11
    assert rec.token_acceptance == 6 / 8  # accepted / (accepted + 2 rejections)
    assert rec.mean_accepted_tokens == (6 + 4) / 4  # new tokens / rounds
    assert rec.per_position_acceptance == [3 / 4, 2 / 4, 1 / 3]
    assert rec.speedup == 8.0 / 4.0
    assert math.isclose(rec.predicted_speedup, predicted_speedup(0.75, 3, 0.1, 1.2))
    assert rec.greedy_match == 1.0 and rec.expected_acceptance is None  # greedy cell
    assert rec.baseline["tokens_per_s"] == 10 / 8 and rec.speculative["tokens_per_s"] == 10 / 4
    assert rec.baseline["ttft_ms"] == pytest.approx(200.0) and rec.speculative["ttft_ms"] == pytest.approx(500.0)
    assert rec.target_forwards == 6 and rec.draft_forwards == 6 + 5 + 2


def test_greedy_match_counts_prompts():
    s = spec_stats([(3, 3)])
    rec = cell_record(3, 0.0, [plain_stats(4, 1.0)] * 4, [s] * 4, 0.1, 1.0, outputs_equal=[True, False, True, True])
    assert rec.greedy_match == 0.75
    assert cell_record(3, 0.7, [plain_stats(4, 1.0)], [s], 0.1, 1.0).greedy_match is None


def test_a_cell_carries_its_speedups_interval():
    # two prompts, paired: 2 s vs 1 s and 1 s vs 1 s -> speedup 1.5, interval [1.0, 2.0] (hand-computed bootstrap)
    rec = cell_record(3, 0.0, [plain_stats(4, 2.0), plain_stats(4, 1.0)], [spec_stats([(3, 3)]), spec_stats([(3, 3)])],
                      0.1, 1.0)
    assert rec.speedup == pytest.approx(1.5) and rec.repeats == 1
    assert rec.speedup_ci95 == [pytest.approx(1.0), pytest.approx(2.0)]
    one = cell_record(3, 0.0, [plain_stats(4, 2.0)], [spec_stats([(3, 3)])], 0.1, 1.0)
    assert one.speedup_ci95 is None  # one run: nothing to resample
    units = [[(2.0, 1.0), (2.2, 1.0)], [(1.0, 1.0), (1.1, 1.0)]]  # given as [prompt][repeat]
    rec = cell_record(3, 0.0, [plain_stats(4, 1.0)] * 4, [spec_stats([(3, 3)])] * 4, 0.1, 1.0, units=units, repeats=2)
    assert rec.repeats == 2 and rec.speedup_ci95[0] >= 1.0 and rec.speedup_ci95[1] <= 2.2


def test_acceptance_intervals_resample_the_prompts_by_hand():
    """Prompt A: 4 of 5 tested accepted, B: 2 of 3 (test_cell_record_by_hand's runs). Two prompts resample to AA,
    AB/BA, BB: α 4/5, 6/8, 2/3, and the expanded interval for two units spans them all: [2/3, 4/5]. Per position
    (A drafted 2, 2, 2 and accepted 2, 1, 1; B drafted 2, 2, 1 and accepted 1, 1, 0) the same way."""
    from draftsmith.eval.metrics import acceptance_intervals

    a, b = spec_stats([(3, 3), (3, 1)]), spec_stats([(3, 0), (2, 2)])
    base = [plain_stats(6, 4.0), plain_stats(4, 4.0)]
    rec = cell_record(3, 0.0, base, [a, b], c=0.1, c_v=1.2, outputs_equal=[True, True])
    assert rec.token_acceptance_ci95 == [pytest.approx(2 / 3), pytest.approx(4 / 5)]
    assert rec.per_position_acceptance_ci95 == [[pytest.approx(0.5), pytest.approx(1.0)],
                                                [pytest.approx(0.5), pytest.approx(0.5)],
                                                [pytest.approx(0.0), pytest.approx(0.5)]]
    # two greedy passes over the same two prompts repeat their counts: the same interval (pass-major runs)
    alpha, positions = acceptance_intervals([a, b, a, b], prompts=2)
    assert alpha == rec.token_acceptance_ci95 and positions == rec.per_position_acceptance_ci95
    # runs are pass-major: [A, A, B, B] over two prompts is prompt 0 = (A, B), prompt 1 = (A, B), no spread
    assert acceptance_intervals([a, a, b, b], prompts=2)[0] == [pytest.approx(0.75), pytest.approx(0.75)]
    # one prompt is no sample of the prompts, however many passes
    assert acceptance_intervals([a, a], prompts=1) == (None, [None, None, None])
    assert cell_record(3, 0.0, [base[0]], [a], 0.1, 1.2).token_acceptance_ci95 is None


def test_acceptance_intervals_need_the_counts():
    """A producer that keeps no rejection count (vLLM's) has no α, so no interval either; nothing tested: none."""
    from draftsmith.decode.acceptance import AcceptanceCounts
    from draftsmith.eval.metrics import acceptance_intervals

    class Untested:
        def __init__(self, counts):
            self._counts = counts

        def counts(self):
            return self._counts

    vllm_like = Untested(AcceptanceCounts(drafted=4, accepted=3, rounds=2, rejected=None,
                                          drafted_per_position=[2, 2], accepted_per_position=[2, 1]))
    alpha, positions = acceptance_intervals([vllm_like, vllm_like], prompts=2)
    assert alpha is None and len(positions) == 2 and all(p is not None for p in positions)
    nothing = Untested(AcceptanceCounts(rejected=0, drafted_per_position=[0], accepted_per_position=[0]))
    assert acceptance_intervals([nothing, nothing], prompts=2) == (None, [None])


def test_prompts_that_tested_nothing_are_left_out_of_the_resampling():
    """Prompt lookup finds no match on some prompts: they test no token and add nothing to α. Resampled, a draw of
    only such prompts would read 0 and drag the lower bound there; left out, the interval is the tested prompts'."""
    from draftsmith.eval.metrics import acceptance_intervals

    a, b = spec_stats([(3, 3), (3, 1)]), spec_stats([(3, 0), (2, 2)])  # 4 of 5 and 2 of 3 (as above)
    idle = SpeculativeStats(k=3, drafted_per_position=[0] * 3, accepted_per_position=[0] * 3)  # no round
    alpha, positions = acceptance_intervals([a, b] + [idle] * 9, prompts=11)
    assert alpha == [pytest.approx(2 / 3), pytest.approx(4 / 5)]  # as with A and B alone
    assert positions == acceptance_intervals([a, b], prompts=2)[1]
    assert acceptance_intervals([a, idle, idle], prompts=3) == (None, [None, None, None])  # one prompt tested


def test_acceptance_intervals_need_whole_passes():
    from draftsmith.eval.metrics import acceptance_intervals

    a = spec_stats([(3, 3)])
    with pytest.raises(ValueError, match="3 speculative runs are not whole passes over 2 prompts"):
        acceptance_intervals([a, a, a], prompts=2)


def test_slowdown_warning_says_whether_the_interval_is_below_one():
    sure = cell_record(3, 0.0, [plain_stats(4, 0.8), plain_stats(4, 0.7)], [spec_stats([(3, 0)]), spec_stats([(3, 0)])],
                       0.1, 1.0)
    assert sure.speedup_ci95[1] < 1 and "slowed decoding down here" in slowdown_warning(sure)
    unsure = cell_record(3, 0.0, [plain_stats(4, 0.6), plain_stats(4, 1.2)], [spec_stats([(3, 0)]), spec_stats([(3, 0)])],
                         0.1, 1.0)
    assert unsure.speedup < 1 < unsure.speedup_ci95[1] and "may have slowed" in slowdown_warning(unsure)


def test_slowdown_warning_follows_the_measured_speedup():
    good = cell_record(3, 0.0, [plain_stats(4, 2.0)], [spec_stats([(3, 3)])], 0.1, 1.0)
    assert slowdown_warning(good) is None
    bad = cell_record(3, 0.0, [plain_stats(4, 0.5)], [spec_stats([(3, 0), (3, 1)])], 0.1, 1.0)
    msg = slowdown_warning(bad)
    assert "measured speedup 0.25 < 1" in msg and "acceptance rate 0.17" in msg
    # a low acceptance rate yet a measured speedup above 1 (as a sampled demo cell can read): no warning contradicts it
    cheap = cell_record(3, 0.7, [plain_stats(4, 1.36 * 2)], [spec_stats([(3, 0), (3, 1)])], 0.1, 1.0)
    assert cheap.acceptance_rate < 0.5 and cheap.speedup == pytest.approx(1.36)
    assert slowdown_warning(cheap) is None
    # a speedup just below 1 with a high acceptance rate still warns
    slow = cell_record(3, 0.0, [plain_stats(4, 0.9)], [spec_stats([(3, 3)])], 0.1, 1.0)
    assert "measured speedup 0.90 < 1" in slowdown_warning(slow)


def test_slowdown_warning_without_a_measured_speedup_uses_the_acceptance_rule():
    unmeasured = spec_stats([(3, 0), (3, 1)])
    unmeasured.total_s = 0.0  # no speculative time: cell_record reports speedup 0.0
    rec = cell_record(3, 0.0, [plain_stats(4, 1.0)], [unmeasured], 0.1, 1.0)
    assert rec.speedup == 0.0
    assert "no speedup measured; acceptance rate 0.17 < 0.5" in slowdown_warning(rec)
    high = spec_stats([(3, 3)])
    high.total_s = 0.0
    assert slowdown_warning(cell_record(3, 0.0, [plain_stats(4, 1.0)], [high], 0.1, 1.0)) is None


def test_empty_cell_or_other_k_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        cell_record(3, 0.0, [], [], 0.1, 1.0)
    with pytest.raises(ValueError, match=r"k=\[2\] given for a cell with k=3"):
        cell_record(3, 0.0, [plain_stats(4, 1.0)], [spec_stats([(2, 2)], k=2)], 0.1, 1.0)


def test_report_names_each_acceptance_quantity_once(tmp_path):
    """report.md: "acceptance rate" is accepted / drafted, "token acceptance α" accepted / tested; no bare α column."""
    from dataclasses import asdict

    from draftsmith.eval.report import LEGEND, write_report

    rec = cell_record(3, 0.0, [plain_stats(6, 4.0)], [spec_stats([(3, 3), (3, 1)])], 0.1, 1.2, outputs_equal=[True])
    summary = {"best_k": 3, "temperature": 0.0, "speedup": rec.speedup, "acceptance_rate": rec.acceptance_rate,
               "token_acceptance": rec.token_acceptance, "mean_accepted_tokens": rec.mean_accepted_tokens,
               "greedy_match": rec.greedy_match}
    metrics = {"prompts": 1, "config": {"max_new_tokens": 6, "target": "t"}, "summary": {"trained": summary},
               "records": [{"draft": "trained", **asdict(rec)}], "warnings": []}
    write_report(metrics, tmp_path)
    report = (tmp_path / "report.md").read_text()
    headers = [line for line in report.splitlines() if line.startswith("| draft |")]
    assert len(headers) == 2
    for header in headers:
        cols = [c.strip() for c in header.strip("|").split("|")]
        assert "acceptance rate" in cols and "token acceptance α" in cols
        assert "α" not in cols and "acceptance" not in cols
    assert LEGEND in report and "Token acceptance α: accepted / tested" in LEGEND
    assert f"| {rec.acceptance_rate:.3f} | {rec.token_acceptance:.3f} |" in report  # 4/6 then 4/5 (one prompt: no interval)
    two = cell_record(3, 0.0, [plain_stats(6, 4.0), plain_stats(4, 4.0)],
                      [spec_stats([(3, 3), (3, 1)]), spec_stats([(3, 0), (2, 2)])], 0.1, 1.2, outputs_equal=[True, True])
    metrics["summary"]["trained"].update(token_acceptance=two.token_acceptance,
                                         token_acceptance_ci95=two.token_acceptance_ci95)
    metrics["records"] = [{"draft": "trained", **asdict(two)}]
    write_report(metrics, tmp_path)
    assert (tmp_path / "report.md").read_text().count("| 0.750 [0.667, 0.800] |") == 2  # the summary and the cell


def test_in_loop_costs_by_hand():
    """Plain runs step at 0.5 s (after the first token); the speculative rounds after the first paid 0.1 s a draft
    step and 0.6 s a verification forward, and 10% of their time went elsewhere."""
    from draftsmith.eval.metrics import in_loop_costs

    plain = [DecodeStats(new_tokens=5, ttft_s=1.0, total_s=3.0), DecodeStats(new_tokens=3, ttft_s=1.0, total_s=2.0)]
    spec = []
    for rounds in (2, 3):
        s = SpeculativeStats(k=2)
        for _ in range(rounds):
            s.record_costs(2, 0.2, 0.6, 0.8 / 0.9)
        spec.append(s)
    costs = in_loop_costs(0.6, 2, plain, spec)
    assert costs["plain_step_ms"] == pytest.approx(500.0)  # (2 + 1) s over (4 + 2) steps
    assert costs["c"] == pytest.approx(0.2)  # 0.1 s / 0.5 s
    assert costs["c_v"] == pytest.approx(1.2)
    assert costs["other"] == pytest.approx(0.1)
    assert costs["predicted_speedup"] == pytest.approx(predicted_speedup(0.6, 2, 0.2, 1.2))


def test_in_loop_costs_are_none_without_a_timed_round():
    from draftsmith.eval.metrics import in_loop_costs

    plain = [DecodeStats(new_tokens=5, ttft_s=1.0, total_s=3.0)]
    assert in_loop_costs(0.5, 2, plain, [spec_stats([(2, 1)], k=2)]) is None  # one round: nothing after the first
    assert in_loop_costs(0.5, 2, [DecodeStats(new_tokens=1, ttft_s=1.0, total_s=1.0)], []) is None
