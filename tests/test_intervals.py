"""The paired bootstrap and the verdicts on its intervals (eval/intervals.py), on hand-made samples."""

import random

import pytest

from draftsmith.eval.intervals import (ABOVE, BELOW, STRADDLES, UNKNOWN, choose_k, difference_ci, format_ci, ratio,
                                       ratio_ci, units_from_passes, verdict)


def noisy_units(speedup: float, n_units: int, n_repeats: int, noise: float, seed: int = 1):
    """Units whose plain time is 1 s (+ noise) and spec time 1 / speedup s (+ noise)."""
    rng = random.Random(seed)
    return [[(1.0 + rng.uniform(-noise, noise), 1.0 / speedup + rng.uniform(-noise, noise))
             for _ in range(n_repeats)] for _ in range(n_units)]


def test_two_units_give_the_hand_computed_interval():
    # resamples of {(2, 1), (1, 1)}: both first -> 2.0 (p 1/4), one of each -> 1.5 (p 1/2), both second -> 1.0 (p 1/4)
    units = [[(2.0, 1.0)], [(1.0, 1.0)]]
    assert ratio(units) == pytest.approx(1.5)
    assert ratio_ci(units) == [pytest.approx(1.0), pytest.approx(2.0)]


def test_one_pair_has_no_interval_and_zero_variance_a_zero_width_one():
    assert ratio_ci([[(2.0, 1.0)]]) is None
    assert ratio_ci([[(2.0, 1.0)] * 3] * 4) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_one_prompt_with_repeats_resamples_the_repeats():
    ci = ratio_ci([[(2.0, 1.0), (1.0, 1.0)]])
    assert ci == [pytest.approx(1.0), pytest.approx(2.0)]


def test_a_units_repeats_stay_together():
    # two prompts, each with a fast and a slow pass: the prompts' sums are equal (3 / 2), so resampling prompts
    # moves nothing; resampling the passes inside them as well would (it counted the noise twice)
    units = [[(2.0, 1.0), (1.0, 1.0)], [(1.0, 1.0), (2.0, 1.0)]]
    assert ratio_ci(units) == [pytest.approx(1.5), pytest.approx(1.5)]


def test_interval_contains_the_estimate_and_narrows_with_repeats():
    few = noisy_units(1.5, 8, 1, 0.2)
    many = noisy_units(1.5, 8, 16, 0.2)
    for units in (few, many):
        lo, hi = ratio_ci(units)
        assert lo <= ratio(units) <= hi
    assert (ratio_ci(many)[1] - ratio_ci(many)[0]) < (ratio_ci(few)[1] - ratio_ci(few)[0]) / 2


def test_the_interval_is_seeded():
    units = noisy_units(1.2, 6, 2, 0.3)
    assert ratio_ci(units, seed=3) == ratio_ci(units, seed=3)
    assert ratio_ci(units, seed=3) != ratio_ci(units, seed=4)


def test_units_from_passes_pairs_by_position_and_drops_missing_sides():
    units = units_from_passes([[1.0, 2.0, None], [3.0, 4.0, 5.0]], [[0.5, 1.0, 1.0], [1.5, None, 2.5]])
    assert units == [[(1.0, 0.5), (3.0, 1.5)], [(2.0, 1.0)], [(5.0, 2.5)]]
    assert units_from_passes([[1.0, None]], [[0.5, 1.0]]) == [[(1.0, 0.5)], []]
    with pytest.raises(ValueError, match="passes"):
        units_from_passes([[1.0]], [])


def test_verdict_against_a_bar():
    assert verdict([1.12, 1.3], 1.1) == ABOVE
    assert verdict([1.1, 1.3], 1.1) == ABOVE  # the lower bound clears the bar when it reaches it
    assert verdict([0.8, 1.05], 1.1) == BELOW
    assert verdict([1.0, 1.2], 1.1) == STRADDLES
    assert verdict(None, 1.1) == UNKNOWN


def test_difference_of_identical_cells_is_zero_and_of_shifted_cells_excludes_zero():
    a = noisy_units(1.5, 8, 2, 0.05)  # the units are resampled jointly: the same data differ by exactly 0
    assert difference_ci(a, a) == [pytest.approx(0.0), pytest.approx(0.0)]
    b = [[(p, s * 1.5) for p, s in unit] for unit in a]  # every spec time 1.5x longer: ratio 1.5 -> 1.0
    lo, hi = difference_ci(a, b)
    assert 0.4 < lo <= hi < 0.6
    lo2, hi2 = difference_ci(a, [[]] + b[1:])  # a prompt lost on one side: the others still pair by index
    assert 0.4 < lo2 <= hi2 < 0.6
    assert difference_ci(a[:1], b[:1]) is not None  # one prompt, two passes each: the passes pair up
    assert difference_ci([[(1.0, 1.0)]], [[(1.0, 0.5)]]) is None  # one pair: nothing to resample


def test_units_keep_their_index_when_a_request_failed():
    units = units_from_passes([[1.0, None, 3.0]], [[0.5, 1.0, 1.5]])
    assert units == [[(1.0, 0.5)], [], [(3.0, 1.5)]]  # unit 2 is still request 2
    assert ratio(units) == pytest.approx(2.0) and ratio_ci(units) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_a_k_too_noisy_to_tell_apart_is_not_chosen_over_one_that_clearly_pays():
    steady = {4: [[(1.31, 1.0)] for _ in range(8)]}
    noisy = [[(p, 1.0)] for p in (0.6, 1.6, 0.7, 1.5, 0.8, 1.4, 0.9, 1.14)]  # 1.08, interval ~[0.8, 1.3]
    choice = choose_k({**steady, 2: noisy})
    assert choice["k"] == 4 and choice["indistinguishable"] == [4]
    close = [[(1.30 + 0.02 * (i % 2), 1.0)] for i in range(8)]  # 1.31 give or take 0.01: no different from K=4
    assert choose_k({**steady, 2: close})["k"] == 2


def test_choose_k_takes_the_smallest_k_whose_interval_overlaps_the_fastest():
    clear = {2: noisy_units(1.3, 8, 2, 0.05, seed=1), 4: noisy_units(1.8, 8, 2, 0.05, seed=2)}
    choice = choose_k(clear)
    assert (choice["k"], choice["leader"], choice["indistinguishable"]) == (4, 4, [4])
    close = {2: noisy_units(1.50, 8, 1, 0.3, seed=1), 4: noisy_units(1.52, 8, 1, 0.3, seed=2),
             6: noisy_units(0.9, 8, 1, 0.02, seed=3)}
    choice = choose_k(close)
    assert choice["k"] == 2 and 6 not in choice["indistinguishable"] and choice["indistinguishable"][0] == 2
    assert "smallest" in choice["rule"] and "overlaps" in choice["rule"]
    assert choose_k({3: [[(2.0, 1.0)]]})["k"] == 3


def test_choose_k_on_given_speedups_and_intervals():
    """Serving cells give their own throughput speedups and intervals: K=2 1.42x [1.21, 1.62] against K=4 1.69x
    [1.52, 1.87] (as a demo run on vLLM read) are tied and K=2 is taken — though identical requests would make
    their paired difference sure; parted intervals are not tied; a K without an interval is not; a smaller K that
    clears a bar the leader only straddles is, one that straddles a bar the leader clears is not."""
    units = {2: [[(1.42, 1.0)]] * 8, 4: [[(1.69, 1.0)]] * 8}  # identical requests: zero-width intervals
    assert choose_k(units)["k"] == 4
    speeds = {2: 1.42, 4: 1.69}
    tied = choose_k(units, speeds=speeds, intervals={2: [1.21, 1.62], 4: [1.52, 1.87]})
    assert (tied["k"], tied["indistinguishable"]) == (2, [2, 4])
    assert choose_k(units, speeds=speeds, intervals={2: [1.3, 1.5], 4: [1.52, 1.87]})["k"] == 4
    assert choose_k(units, speeds=speeds, intervals={2: None, 4: [1.52, 1.87]})["k"] == 4
    bars = (1.0, 1.1)
    assert choose_k(units, speeds=speeds, intervals={2: [1.2, 1.6], 4: [1.05, 2.3]}, bars=bars)["k"] == 2
    assert choose_k(units, speeds=speeds, intervals={2: [1.05, 1.8], 4: [1.2, 2.2]}, bars=bars)["k"] == 4


def test_format_ci():
    assert format_ci(1.1, [1.02, 1.18]) == "1.10x [1.02, 1.18]"
    assert format_ci(1.1, None) == "1.10x"
    assert format_ci(None, None) == "n/a"


def test_the_expanded_tail_shrinks_to_the_normal_one():
    from draftsmith.eval.intervals import expanded_tail, t975

    assert t975(5) == 2.571 and 2.042 < t975(25) < 2.086 and 1.96 < t975(1000) < 1.98
    assert expanded_tail(6) == pytest.approx(0.0024, abs=3e-4)  # z = sqrt(6/5) * 2.571 = 2.816
    assert 0.024 < expanded_tail(10_000) < 0.0251
    assert expanded_tail(4) < expanded_tail(8) < expanded_tail(32) < 0.025


def test_narrowing_by_hand():
    """More units narrow an interval by sqrt(n / after); a t-interval's quantile falls too (3 -> 5 lives:
    sqrt(3/5) x 2.776 / 4.303 = 0.500); nothing left to take narrows nothing."""
    import math

    from draftsmith.eval.intervals import narrowing

    assert narrowing(2, 8) == pytest.approx(0.5)
    assert narrowing(3, 5, t=True) == pytest.approx(math.sqrt(3 / 5) * 2.776 / 4.303, abs=1e-3)
    assert narrowing(3, 5, t=True) < narrowing(3, 5)
    assert narrowing(4, 4) == narrowing(6, 4) == narrowing(4, 4, t=True) == 1.0
    assert narrowing(1, 4, t=True) == pytest.approx(0.5)  # one unit has no t-interval yet: sqrt alone


def test_lives_ci_by_hand():
    """Three server lives whose speedups are 1.8, 2.0 and 2.2 (their logs' mean m and sd s): the interval is
    exp(m +- t_{0.975,2} s / sqrt(3)); identical lives give a zero-width one; one life gives none."""
    import math

    from draftsmith.eval.intervals import lives_ci, t975

    lives = [[[(1.8, 1.0)], [(3.6, 2.0)]], [[(2.0, 1.0)]], [[(2.2, 1.0)]]]  # [life][pass][request]
    logs = [math.log(1.8), math.log(2.0), math.log(2.2)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = t975(2) * sd / math.sqrt(3)
    lo, hi = lives_ci(lives)  # life 1's two passes weigh as one life
    assert lo == pytest.approx(math.exp(mean - half)) and hi == pytest.approx(math.exp(mean + half))
    assert lo < 1.8 and hi > 2.2  # three draws: wider than their range
    assert lives_ci([[[(2.0, 1.0)]]] * 3) == pytest.approx([2.0, 2.0])
    assert lives_ci([[[(2.0, 1.0)]]]) is None


def test_lives_ratio_ci_by_hand():
    """Two cells on their own server lives (a: 1.8, 2.0, 2.2; b: 1.5, 1.7): Welch's t-interval on the difference of
    the lives' mean log speedups, exp'd, df by Welch-Satterthwaite rounded down; fewer than two lives give none;
    lives without spread give the point ratio."""
    import math

    from draftsmith.eval.intervals import lives_ratio_ci, t975

    def lives(speedups):
        return [[[(s, 1.0)]] for s in speedups]

    la, lb = [math.log(x) for x in (1.8, 2.0, 2.2)], [math.log(x) for x in (1.5, 1.7)]
    ma, mb = sum(la) / 3, sum(lb) / 2
    va = sum((x - ma) ** 2 for x in la) / 2 / 3
    vb = sum((x - mb) ** 2 for x in lb) / 1 / 2
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 1)
    half = t975(int(df)) * math.sqrt(va + vb)
    lo, hi = lives_ratio_ci(lives([1.8, 2.0, 2.2]), lives([1.5, 1.7]))
    assert lo == pytest.approx(math.exp(ma - mb - half)) and hi == pytest.approx(math.exp(ma - mb + half))
    assert lo < 1.0 < hi  # two lives of b: too few to tell 2.0 from 1.6 apart
    assert lives_ratio_ci(lives([2.0, 2.0]), lives([1.6, 1.6])) == pytest.approx([1.25, 1.25])
    assert lives_ratio_ci(lives([1.8, 2.0, 2.2]), lives([1.6])) is None
