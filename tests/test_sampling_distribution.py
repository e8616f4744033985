"""Rejection-sampling speculative decoding reproduces the target's distribution (statistical tests).

On an 8-token vocab, the exact joint distribution of the first three new tokens is enumerated from
the target's (filtered) conditionals; many seeded speculative samples are then compared with it by
a chi-square test. The first new token comes from the target's prefill, so the first round's
tokens are the second and third: the runs draft k tokens in that round (max_new_tokens = k + 2),
and with k = 1 the third token is the bonus token whenever the draft token is accepted. The test's
power is checked too: the draft's own samples must be rejected.
"""

from types import SimpleNamespace

import pytest
import torch
from scipy import stats as sps

from conftest import make_model
from draftsmith.decode import autoregressive_generate, speculative_generate
from draftsmith.decode.sampling import logits_to_probs
from stubs import random_table

V = 8
PROMPT = torch.tensor([[3, 1, 4]])


N_TOKENS = 3  # the joint of the first three new tokens is tested


@torch.inference_mode()
def exact_first(model, prompt, temperature, top_k, top_p, n_tokens=N_TOKENS, width=V) -> torch.Tensor:
    """P(t1 .. t_n | prompt) [width] * n_tokens under the filtered sampling distribution of `model`."""
    p = logits_to_probs(model(input_ids=prompt).logits[0, -1], temperature, top_k, top_p).double()  # [width]
    if n_tokens == 1:
        return p
    rest = [exact_first(model, torch.cat([prompt, torch.tensor([[t]])], dim=1), temperature, top_k, top_p,
                        n_tokens - 1, width) for t in range(width)]
    return p.view(-1, *[1] * (n_tokens - 1)) * torch.stack(rest)


def sample_first(gen_fn, n: int, seed: int, width=V) -> tuple[torch.Tensor, list]:
    """Counts [width] * N_TOKENS of the first new tokens over `n` seeded calls of gen_fn(generator), and their stats."""
    counts = torch.zeros(*[width] * N_TOKENS)
    generator = torch.Generator().manual_seed(seed)
    stats = []
    for _ in range(n):
        out = gen_fn(generator)
        counts[tuple(out.sequences[0, PROMPT.shape[1]: PROMPT.shape[1] + N_TOKENS].tolist())] += 1
        stats.append(out.stats)
    return counts.double(), stats


def pair(joint: torch.Tensor, first: int) -> torch.Tensor:
    """The marginal of new tokens (first, first + 1) of a [V, V, V] joint (counts or probabilities) -> [V, V]."""
    return joint.sum(dim=2 if first == 0 else 0)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of a chi-square goodness-of-fit test; cells with expected count < 5 are pooled.

    Samples on cells of probability 0 give p-value 0 (the hypothesis is impossible).
    """
    n = counts.sum()
    expected, observed = (probs.flatten() / probs.sum() * n).numpy(), counts.flatten().numpy()
    small = expected < 5
    exp_cells = list(expected[~small]) + ([expected[small].sum()] if small.any() else [])
    obs_cells = list(observed[~small]) + ([observed[small].sum()] if small.any() else [])
    if small.any() and exp_cells[-1] == 0:
        if obs_cells[-1] > 0:
            return 0.0
        exp_cells, obs_cells = exp_cells[:-1], obs_cells[:-1]
    exp_cells = [e * sum(obs_cells) / sum(exp_cells) for e in exp_cells]  # equal totals, to rounding
    return float(sps.chisquare(obs_cells, exp_cells).pvalue)


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


SETTINGS = [
    # (draft seed, temperature, top_k, top_p, k, samples)
    pytest.param(11, 1.0, 0, 1.0, 3, 6000, id="plain"),
    pytest.param(11, 0.7, 5, 0.9, 2, 6000, id="filters"),
    pytest.param(99, 1.0, 0, 1.0, 4, 6000, id="strongly-disagreeing-draft"),
    pytest.param(11, 1.0, 0, 1.0, 1, 4000, id="k1-bonus-token"),  # t3 is the bonus token when d1 is accepted
]


@pytest.mark.parametrize("draft_seed, temperature, top_k, top_p, k, samples", SETTINGS)
def test_stub_speculative_samples_follow_the_target(draft_seed, temperature, top_k, top_p, k, samples):
    target = random_table(V, seed=10)
    scale = 4.0 if draft_seed == 99 else 1.5  # seed 99: a sharp draft far from the target
    draft = random_table(V, seed=draft_seed, scale=scale)
    exact = exact_first(target, PROMPT, temperature, top_k, top_p)  # [V, V, V]
    draft_exact = exact_first(draft, PROMPT, temperature, top_k, top_p)
    settings = dict(max_new_tokens=k + 2, temperature=temperature, top_k=top_k, top_p=top_p)
    counts, stats = sample_first(lambda g: speculative_generate(target, draft, PROMPT, k=k, generator=g, **settings),
                                 n=samples, seed=0)
    # tokens 2 and 3 come from the first round, which drafted k tokens; count the bonus tokens it produced
    assert all(s.drafted_per_position[k - 1] == 1 for s in stats)
    bonus = sum(s.accepted_per_position[k - 1] for s in stats)
    if k == 1:
        assert bonus > samples / 5  # the bonus token is reached often: this setting tests it
    assert chi_square_p(counts, exact) > 1e-3
    assert tv(pair(counts, 0), pair(exact, 0)) < 0.05 and tv(pair(counts, 1), pair(exact, 1)) < 0.05
    # power: the same test rejects the draft's own distribution when it differs enough
    assert 0.5 * float((pair(exact, 1) - pair(draft_exact, 1)).abs().sum()) > 0.1
    assert chi_square_p(counts, draft_exact) < 1e-6


def test_the_chi_square_test_rejects_samples_from_the_draft():
    """Guard against a test that cannot fail: plain draft samples must not pass as target samples."""
    target, draft = random_table(V, seed=10), random_table(V, seed=11)
    exact = exact_first(target, PROMPT, 1.0, 0, 1.0)
    counts, _ = sample_first(lambda g: autoregressive_generate(draft, PROMPT, max_new_tokens=N_TOKENS, temperature=1.0,
                                                               generator=g), n=3000, seed=0)
    assert chi_square_p(counts, exact) < 1e-6


@pytest.mark.parametrize("target_width, draft_width", [(12, V), (V, 12)], ids=["wider-target", "wider-draft"])
def test_real_tiny_models_with_different_logit_widths(target_width, draft_width):
    """A tiny Llama target and a GPT-2 draft whose logit tables differ in width (padded vocab).

    Both distributions are taken over the shared range [0, 8): the output follows the target's
    distribution restricted to it, and no id outside it (which one model cannot embed) appears.
    The tokens are near-uniform here, so the pairs (t1, t2) and (t2, t3) are tested, not all 512 triples.
    """
    target = make_model("llama", seed=3, layers=1, hidden=16, vocab_size=target_width)
    draft = make_model("gpt2", seed=4, layers=1, hidden=16, vocab_size=draft_width)
    with torch.no_grad():  # soften both: every token has mass, the extra ones included
        target.lm_head.weight.mul_(0.15)
        draft.lm_head.weight.mul_(0.15)
    exact = exact_first(lambda input_ids: SimpleNamespace(logits=target(input_ids=input_ids).logits[..., :V]),
                        PROMPT, 1.0, 0, 1.0)
    counts, _ = sample_first(lambda g: speculative_generate(target, draft, PROMPT, k=2, max_new_tokens=4,
                                                            temperature=1.0, generator=g), n=2500, seed=1)
    assert chi_square_p(pair(counts, 0), pair(exact, 0)) > 1e-3
    assert chi_square_p(pair(counts, 1), pair(exact, 1)) > 1e-3


def test_greedy_with_different_logit_widths_matches_the_target():
    target = make_model("qwen2", seed=5, layers=1, hidden=16, vocab_size=80)  # padded: 64 real tokens
    with torch.no_grad():
        target.lm_head.weight[64:] = 0.0  # like a trained padded table: the extra logits never win
    draft = make_model("llama", seed=6, layers=1, hidden=16, vocab_size=64)
    for p in [torch.tensor([[5, 9, 30]]), torch.tensor([[40]])]:
        ref = autoregressive_generate(target, p, max_new_tokens=16).sequences
        assert torch.equal(speculative_generate(target, draft, p, k=3, max_new_tokens=16).sequences, ref)
