"""vLLM's suffix decoding in draftsmith's loop (decode/suffix.py, decode/loop.py suffix_generate): greedy output equal
to the target's, sampling exact, a repeating target speculated through, nothing to continue costs nothing. Skipped,
saying why, where Arctic Inference is not installed (.ci/run installs it)."""

import pytest
import torch

from conftest import make_model
from draftsmith.decode import autoregressive_generate, suffix_generate
from draftsmith.decode import suffix as suffix_mod
from stubs import random_table, scripted
from test_ngram import greedy_equal_on_looping_prompts
from test_sampling_distribution import N_TOKENS, PROMPT, V, chi_square_p, exact_first, pair, sample_first, tv

pytestmark = pytest.mark.skipif(not suffix_mod.available(),
                                reason=f"Arctic Inference is not installed here: {suffix_mod.INSTALL}")


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_output_equals_the_targets_across_k(k):
    """A tiny random Llama falls into loops, so the tree proposes often: its output must still be the target's."""
    greedy_equal_on_looping_prompts(lambda target, prompt: suffix_generate(target, prompt, k=k, max_new_tokens=40),
                                    "suffix")


def test_a_repeating_target_is_speculated_through_and_text_that_never_repeats_costs_nothing():
    phrase = [3, 4, 5, 6, 7, 8]
    script = [1, 2] + phrase * 6
    target = scripted(script, vocab=16)
    prompt = torch.tensor([script[:2]])
    ref = autoregressive_generate(target, prompt, max_new_tokens=30)
    out = suffix_generate(target, prompt, k=4, max_new_tokens=30)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.target_forwards < ref.stats.target_forwards / 2
    fresh = list(range(40))
    target = scripted(fresh, vocab=48)
    ref = autoregressive_generate(target, torch.tensor([fresh[:3]]), max_new_tokens=20)
    out = suffix_generate(target, torch.tensor([fresh[:3]]), k=3, max_new_tokens=20)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.drafted == 0 and out.stats.target_forwards == ref.stats.target_forwards == 20


@pytest.mark.parametrize("temperature, top_k, top_p, k", [(1.0, 0, 1.0, 2), (0.7, 5, 0.9, 1)], ids=["plain", "filters"])
def test_sampling_follows_the_target(temperature, top_k, top_p, k):
    """A one-hot proposal under rejection sampling: the first three new tokens' joint is the target's, with both
    acceptance and rejection happening."""
    target = random_table(V, seed=22)
    exact = exact_first(target, PROMPT, temperature, top_k, top_p)
    counts, stats = sample_first(lambda g: suffix_generate(target, PROMPT, k=k, max_new_tokens=k + 2,
                                                           temperature=temperature, top_k=top_k, top_p=top_p,
                                                           generator=g), n=3500, seed=0)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 500 and 0 < accepted < drafted
    assert chi_square_p(counts, exact) > 1e-3
    assert tv(pair(counts, 0), pair(exact, 0)) < 0.05
    other = random_table(V, seed=23)  # power: plain samples from another table are rejected by the same test
    wrong, _ = sample_first(lambda g: autoregressive_generate(other, PROMPT, max_new_tokens=N_TOKENS,
                                                              temperature=temperature, top_k=top_k, top_p=top_p,
                                                              generator=g), n=1500, seed=0)
    assert chi_square_p(wrong, exact) < 1e-6


def test_its_in_loop_cost_is_timed_as_its_rounds_ask_the_tree():
    """eval's cost ratios (decode/timing.py) for suffix decoding: no forward, the tree's proposal over the context."""
    from conftest import prompts
    from draftsmith.decode.suffix import Suffix
    from draftsmith.decode.timing import cost_ratios

    target = make_model("llama", seed=0, layers=2)
    context = prompts(1, seed=2, min_len=8, max_len=8)[0]
    costs = cost_ratios(target, Suffix(), context, [1, 2], repeats=2)
    assert costs["target_step_s"] > 0 and all(costs["c"][k] >= 0 and costs["c_v"][k] > 0 for k in (1, 2))
    assert costs["c"][2] < 0.5  # a lookup in a tree, not a model's forward
