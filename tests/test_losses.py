"""Distillation losses (train/losses.py): zero for identical inputs, symmetry, hand values, TV identity."""

import math

import pytest
import torch

from draftsmith.decode.verify import expected_acceptance
from draftsmith.train.losses import (ce_per_position, divergence_per_position, forward_kl_per_position, jsd_per_position,
                          masked_mean, reverse_kl_per_position, topk_buckets, tvd_per_position)

P = torch.tensor([0.5, 0.25, 0.25])
Q = torch.tensor([0.25, 0.5, 0.25])


def logp(x):
    return x.log()


def test_identical_distributions_give_zero():
    lp = torch.log_softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(0)), -1)
    for kind in ("fkl", "rkl", "jsd", "tvd"):
        assert torch.allclose(divergence_per_position(kind, lp, lp), torch.zeros(4), atol=1e-6), kind


def test_kl_by_hand():
    # KL(P||Q) = 0.5 log 2 + 0.25 log 0.5 = 0.25 log 2 ; symmetric pair, so KL(Q||P) equal here
    assert math.isclose(forward_kl_per_position(logp(P), logp(Q)).item(), 0.25 * math.log(2), rel_tol=1e-6)
    p2, q2 = torch.tensor([0.9, 0.1]), torch.tensor([0.5, 0.5])
    fkl = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    rkl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert math.isclose(forward_kl_per_position(logp(p2), logp(q2)).item(), fkl, rel_tol=1e-5)
    assert math.isclose(reverse_kl_per_position(logp(p2), logp(q2)).item(), rkl, rel_tol=1e-5)
    assert not math.isclose(fkl, rkl, rel_tol=1e-2)  # KL is not symmetric


def test_kl_handles_zero_teacher_mass():
    p = torch.tensor([1.0, 0.0])
    q = torch.tensor([0.5, 0.5])
    assert math.isclose(forward_kl_per_position(p.log(), q.log()).item(), math.log(2), rel_tol=1e-6)


def test_jsd_by_hand_symmetric_and_bounded():
    p, q = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert math.isclose(jsd_per_position(p.log(), q.log()).item(), math.log(2), rel_tol=1e-5)  # the maximum
    a = jsd_per_position(logp(P), logp(Q), 0.5)
    b = jsd_per_position(logp(Q), logp(P), 0.5)
    assert torch.isclose(a, b)
    # by hand: m = (0.375, 0.375, 0.25)
    m = torch.tensor([0.375, 0.375, 0.25])
    expected = 0.5 * (P * (P / m).log()).sum() + 0.5 * (Q * (Q / m).log()).sum()
    assert torch.isclose(a, expected)
    # generalized: beta swaps with the arguments
    assert torch.isclose(jsd_per_position(logp(P), logp(Q), 0.2), jsd_per_position(logp(Q), logp(P), 0.8))


def test_jsd_rejects_limits():
    with pytest.raises(ValueError, match="beta"):
        jsd_per_position(logp(P), logp(Q), 0.0)


def test_tvd_by_hand_and_acceptance_identity():
    assert math.isclose(tvd_per_position(logp(P), logp(Q)).item(), 0.25, rel_tol=1e-6)
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, 11, generator=gen), -1)
    q = torch.softmax(torch.randn(5, 11, generator=gen), -1)
    assert torch.allclose(tvd_per_position(p.log(), q.log()), 1 - expected_acceptance(p, q), atol=1e-6)
    assert torch.allclose(tvd_per_position(p.log(), q.log()), tvd_per_position(q.log(), p.log()))


def test_ce_and_masked_mean():
    lp = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))  # [1, 2, 2]
    ce = ce_per_position(lp, torch.tensor([[0, 1]]))
    assert torch.allclose(ce, torch.tensor([[math.log(2), -math.log(0.75)]]))
    assert math.isclose(masked_mean(ce, torch.tensor([[False, True]])).item(), -math.log(0.75), rel_tol=1e-6)
    assert masked_mean(ce, torch.tensor([[False, False]])).item() == 0.0


def test_unknown_loss_names_the_choices():
    with pytest.raises(ValueError, match="fkl, rkl, jsd, tvd"):
        divergence_per_position("kl", logp(P), logp(Q))


def test_topk_buckets_keep_the_tail_mass():
    teacher = torch.tensor([0.5, 0.3, 0.1, 0.1])
    student = torch.tensor([0.4, 0.2, 0.2, 0.2])
    ids = torch.tensor([0, 1])
    t_b, s_b = topk_buckets(student.log(), ids, teacher[ids].log())
    assert torch.allclose(t_b.exp(), torch.tensor([0.5, 0.3, 0.2]))
    assert torch.allclose(s_b.exp(), torch.tensor([0.4, 0.2, 0.4]))
    # a lower bound of the full divergence, exact when the tails are proportional
    full = forward_kl_per_position(teacher.log(), student.log())
    assert forward_kl_per_position(t_b, s_b) <= full + 1e-6
    student2 = torch.tensor([0.4, 0.2, 0.2, 0.2])
    teacher2 = torch.tensor([0.5, 0.3, 0.1, 0.1])  # tails (0.1, 0.1) vs (0.2, 0.2): proportional
    t2, s2 = topk_buckets(student2.log(), ids, teacher2[ids].log())
    assert torch.isclose(forward_kl_per_position(t2, s2), forward_kl_per_position(teacher2.log(), student2.log()))


def test_topk_uniform_tail_by_hand():
    from draftsmith.train.losses import topk_uniform_tail

    ids = torch.tensor([[3, 0]])
    logp = torch.tensor([[0.5, 0.2]]).log()
    full = topk_uniform_tail(ids, logp, vocab=5).exp()
    assert torch.allclose(full, torch.tensor([[0.2, 0.1, 0.1, 0.5, 0.1]]))  # tail 0.3 spread over 3 tokens


def test_uniform_tail_penalises_a_student_that_piles_the_tail_on_one_token():
    """Bucketed KL cannot tell these students apart; the uniform-tail KL prefers the spread one,
    and the piled-up student's argmax is a tail token (what collapsed top-1 agreement)."""
    from draftsmith.train.losses import topk_uniform_tail

    ids, logp = torch.tensor([[0]]), torch.tensor([[0.4]]).log()  # teacher: 0.4 on token 0, 0.6 in the tail
    spread = torch.tensor([[0.4, 0.15, 0.15, 0.15, 0.15]]).log()
    piled = torch.tensor([[0.4, 0.57, 0.01, 0.01, 0.01]]).log()
    bucket = [forward_kl_per_position(*topk_buckets(s, ids, logp)) for s in (spread, piled)]
    assert torch.allclose(bucket[0], bucket[1], atol=1e-6)
    teacher = topk_uniform_tail(ids, logp, vocab=5)
    assert forward_kl_per_position(teacher, spread) < forward_kl_per_position(teacher, piled)
    assert piled.argmax(-1).item() != 0
