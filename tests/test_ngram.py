"""N-gram prompt lookup (decode/ngram.py) and its decode loop (decode/loop.py ngram_generate): the lookup rule
by hand and against its definition, greedy output equal to the target's, sampling exact, no match costs nothing."""

import random

import pytest
import torch

from conftest import make_model
from draftsmith.decode import autoregressive_generate, ngram_generate
from draftsmith.decode.ngram import DEFAULT, NGram, is_ngram_spec, parse_ngram
from stubs import random_table, scripted
from test_sampling_distribution import N_TOKENS, PROMPT, V, chi_square_p, exact_first, pair, sample_first, tv


def lookup(tokens: list[int], k: int, window: NGram = DEFAULT) -> list[int]:
    return window.propose(torch.tensor(tokens), k).tolist()


@pytest.mark.parametrize("tokens, k, window, expected", [
    ([1, 2, 3, 9, 1, 2], 3, NGram(2, 4), [3, 9, 1]),  # the bigram (1, 2) seen at the start
    ([5, 6, 7, 5, 6, 8, 5, 6], 3, NGram(2, 4), [7, 5, 6]),  # the earliest of two occurrences
    ([2, 3, 7, 1, 2, 3, 4, 1, 2, 3], 3, NGram(2, 4), [4, 1, 2]),  # the longest n-gram wins over an earlier bigram
    ([1, 2, 1, 2], 5, NGram(2, 4), [1, 2]),  # fewer than K when the text ends first
    ([7, 7, 7], 4, NGram(1, 2), [7]),  # an occurrence may overlap the n-gram itself
    ([1, 2, 3, 4], 3, NGram(1, 4), []),  # no repeat: nothing
    ([1, 2, 3, 1], 3, NGram(2, 4), []),  # only a unigram repeats, below the window
    ([4], 3, NGram(1, 1), []),  # one token: nothing before it
    ([1, 2, 1], 0, NGram(1, 1), []),  # K 0
])
def test_lookup_by_hand(tokens, k, window, expected):
    assert lookup(tokens, k, window) == expected


def reference_lookup(tokens: list[int], k: int, window: NGram) -> list[int]:
    """The rule as vLLM states it: the longest n in the window whose n-gram ending the text occurs earlier, the
    earliest such occurrence, and the (up to) k tokens after it."""
    for n in range(window.max_n, window.min_n - 1, -1):
        if n >= len(tokens):
            continue
        for s in range(len(tokens) - n):
            if tokens[s:s + n] == tokens[-n:]:
                return tokens[s + n:s + n + k]
    return []


def test_lookup_equals_its_definition_on_random_texts():
    rng = random.Random(0)
    found = 0
    for _ in range(400):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        window = NGram(rng.randint(1, 3), 3)
        window = NGram(window.min_n, rng.randint(window.min_n, 5))
        k = rng.randint(1, 5)
        expected = reference_lookup(tokens, k, window)
        assert lookup(tokens, k, window) == expected, (tokens, k, window)
        found += bool(expected)
    assert 50 < found < 400  # both outcomes were exercised


def test_spec_strings():
    assert parse_ngram("ngram") == DEFAULT and DEFAULT.spec == "ngram:2-4"
    assert parse_ngram("ngram:1-3") == NGram(1, 3) and parse_ngram(NGram(1, 3).spec) == NGram(1, 3)
    assert is_ngram_spec("ngram") and is_ngram_spec("ngram:1-3") and not is_ngram_spec("/models/ngram")
    assert not is_ngram_spec("ngrams") and not is_ngram_spec(None)
    for bad in ("ngram:3-1", "ngram:x", "ngram:0-2", "ngram:2"):
        with pytest.raises(ValueError, match="serve.baselines"):
            parse_ngram(bad, key="serve.baselines")
    assert NGram(1, 3).vllm_config(2) == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                          "prompt_lookup_max": 3}


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("window", [NGram(1, 1), NGram(2, 4)], ids=["1-1", "2-4"])
def test_greedy_output_equals_the_targets_across_k(k, window):
    """A tiny random Llama falls into loops, so the lookup proposes often: its output must still be the target's."""
    greedy_equal_on_looping_prompts(lambda target, prompt: ngram_generate(target, window, prompt, k=k,
                                                                          max_new_tokens=40), "ngram")


def greedy_equal_on_looping_prompts(generate, backend: str) -> None:
    """`generate(target, prompt)` (40 new tokens, a proposer with no model) on a tiny random Llama that falls into
    loops: outputs equal the target's greedy ones, the proposer (`backend`) ran no forward, and it proposed and was
    right some of the time."""
    target = make_model("llama", seed=7, layers=2, hidden=32, vocab_size=48)
    drafted = accepted = 0
    for prompt in (torch.tensor([[5, 9, 30, 5, 9]]), torch.tensor([[1, 2, 3, 4, 1, 2, 3]]), torch.tensor([[40]])):
        ref = autoregressive_generate(target, prompt, max_new_tokens=40)
        out = generate(target, prompt)
        assert torch.equal(out.sequences, ref.sequences)
        assert out.stats.draft_backend == backend and out.stats.draft_forwards == 0
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert drafted > 0 and accepted > 0


def test_a_repeating_target_takes_few_steps():
    """A target that repeats a phrase: after its first occurrence every round accepts K tokens."""
    phrase = [3, 4, 5, 6, 7, 8]
    script = [1, 2] + phrase * 6
    target = scripted(script, vocab=16)
    prompt = torch.tensor([script[:2]])
    ref = autoregressive_generate(target, prompt, max_new_tokens=30)
    out = ngram_generate(target, NGram(2, 4), prompt, k=4, max_new_tokens=30)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.target_forwards < ref.stats.target_forwards / 2


def test_no_match_proposes_nothing_and_costs_nothing():
    """Text that never repeats: every round is a plain step, as many target forwards as plain decoding."""
    script = list(range(40))
    target = scripted(script, vocab=48)
    prompt = torch.tensor([script[:3]])
    ref = autoregressive_generate(target, prompt, max_new_tokens=20)
    out = ngram_generate(target, NGram(1, 3), prompt, k=3, max_new_tokens=20)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.drafted == 0 and out.stats.rounds == 19
    assert out.stats.target_forwards == ref.stats.target_forwards == 20


@pytest.mark.parametrize("temperature, top_k, top_p, k", [(1.0, 0, 1.0, 2), (0.7, 5, 0.9, 1)], ids=["plain", "filters"])
def test_sampling_follows_the_target(temperature, top_k, top_p, k):
    """A one-hot proposal under rejection sampling: the first three new tokens' joint is the target's. The window
    1-1 finds the first new token in the prompt [3, 1, 4] whenever it is one of those, so the first round drafts
    often; both acceptance and rejection happen (the test has something to check)."""
    target = random_table(V, seed=22)  # its likely first tokens are in the prompt, and often followed as there
    exact = exact_first(target, PROMPT, temperature, top_k, top_p)
    counts, stats = sample_first(lambda g: ngram_generate(target, NGram(1, 1), PROMPT, k=k, max_new_tokens=k + 2,
                                                          temperature=temperature, top_k=top_k, top_p=top_p,
                                                          generator=g), n=3500, seed=0)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 1000 and 0 < accepted < drafted
    assert chi_square_p(counts, exact) > 1e-3
    assert tv(pair(counts, 0), pair(exact, 0)) < 0.05
    # power: plain samples from another table are rejected by the same test
    other = random_table(V, seed=23)
    wrong, _ = sample_first(lambda g: autoregressive_generate(other, PROMPT, max_new_tokens=N_TOKENS,
                                                              temperature=temperature, top_k=top_k, top_p=top_p,
                                                              generator=g), n=1500, seed=0)
    assert chi_square_p(wrong, exact) < 1e-6
