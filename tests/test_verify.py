"""Unit tests of verification (decode/verify.py): greedy prefix, residual, rejection sampling."""

import torch

from draftsmith.decode.verify import expected_acceptance, residual_distribution, verify_greedy, verify_sampling


def test_greedy_accepts_the_agreeing_prefix_and_corrects():
    drafts = torch.tensor([5, 6, 9, 8])
    target = torch.tensor([5, 6, 7, 8, 1])
    assert verify_greedy(drafts, target) == (2, 7)  # accepts 5, 6; 9 != 7 -> correction 7


def test_greedy_all_accepted_gives_the_bonus_token():
    assert verify_greedy(torch.tensor([5, 6, 7]), torch.tensor([5, 6, 7, 4])) == (3, 4)


def test_greedy_first_rejected():
    assert verify_greedy(torch.tensor([1, 6, 7]), torch.tensor([5, 6, 7, 4])) == (0, 5)


def test_greedy_zero_drafts_is_plain_decoding():
    assert verify_greedy(torch.tensor([], dtype=torch.long), torch.tensor([3])) == (0, 3)


def test_residual_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.2, 0.1])
    # max(0, p - q) = [0.3, 0, 0, 0] -> all mass on token 0
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    p = torch.tensor([0.4, 0.4, 0.2])
    q = torch.tensor([0.1, 0.2, 0.7])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([0.6, 0.4, 0.0]))


def test_residual_without_mass_falls_back_to_p():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual_distribution(p, p.clone()), p)


def test_residual_completes_the_target_distribution():
    # P(out = x) = min(p, q)(x) + (1 - sum min(p, q)) * residual(x) == p(x): the identity behind losslessness
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(16, generator=gen), 0)
    q = torch.softmax(torch.randn(16, generator=gen), 0)
    overlap = torch.minimum(p, q)
    assert torch.allclose(overlap + (1 - overlap.sum()) * residual_distribution(p, q), p, atol=1e-6)


def test_sampling_equal_distributions_accept_everything():
    p = torch.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(1)), -1)
    drafts = torch.tensor([1, 2, 3])
    for seed in range(20):
        n_acc, _ = verify_sampling(drafts, p[:3], p, torch.Generator().manual_seed(seed))
        assert n_acc == 3  # p/q == 1 always accepts


def test_sampling_token_the_target_forbids_is_always_rejected():
    q = torch.tensor([[0.0, 1.0, 0.0]])  # the draft is sure of token 1
    p = torch.tensor([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]])  # the target never says 1
    outs = {verify_sampling(torch.tensor([1]), q, p, torch.Generator().manual_seed(s)) for s in range(30)}
    assert {n for n, _ in outs} == {0}
    assert {t for _, t in outs} == {0, 2}  # corrections come from norm(max(0, p - q)) = p here


def test_sampling_accepts_with_probability_p_over_q():
    # p(d)/q(d) = 0.25: about a quarter of the seeds accept; the bonus comes from p[1] = one-hot(2)
    q = torch.tensor([[0.8, 0.2, 0.0]])
    p = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]])
    results = [verify_sampling(torch.tensor([0]), q, p, torch.Generator().manual_seed(s)) for s in range(4000)]
    accepted = [r for r in results if r[0] == 1]
    assert abs(len(accepted) / len(results) - 0.25) < 0.03
    assert all(t == 2 for _, t in accepted)  # bonus token from p_2
    assert all(t == 1 for n, t in results if n == 0)  # residual max(0, p - q) = [0, 0.6, 0]


def test_sampling_same_seed_same_result():
    gen_p = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(5, 7, generator=gen_p), -1)
    q = torch.softmax(torch.randn(4, 7, generator=gen_p), -1)
    drafts = torch.tensor([0, 1, 2, 3])
    a = [verify_sampling(drafts, q, p, torch.Generator().manual_seed(s)) for s in range(50)]
    b = [verify_sampling(drafts, q, p, torch.Generator().manual_seed(s)) for s in range(50)]
    assert a == b and len(set(a)) > 1


def test_expected_acceptance_is_one_minus_tv():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    assert torch.isclose(expected_acceptance(p, q), torch.tensor(0.7))  # TV = 0.3
    assert torch.isclose(expected_acceptance(p, p), torch.tensor(1.0))
