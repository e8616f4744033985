"""Unit tests of the sampling filters (decode/sampling.py), with hand-computed cases."""

import math

import pytest
import torch

from draftsmith.decode.sampling import apply_top_k, apply_top_p, check_sampling_args, logits_to_probs, sample

NEG = float("-inf")


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0])
    assert apply_top_k(logits, 2).tolist() == [NEG, 4.0, 3.0, NEG]


def test_top_k_zero_or_large_is_identity():
    logits = torch.tensor([1.0, 4.0, 3.0])
    assert torch.equal(apply_top_k(logits, 0), logits)
    assert torch.equal(apply_top_k(logits, 3), logits)


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([2.0, 1.0, 2.0, 0.0])
    assert apply_top_k(logits, 1).tolist() == [2.0, NEG, 2.0, NEG]


def test_top_p_by_hand():
    # probs 0.5, 0.3, 0.15, 0.05 (descending): mass before = 0, 0.5, 0.8, 0.95
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log()
    kept = lambda p: torch.isfinite(apply_top_p(logits, p)).tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]  # 0.5 reached by the top token alone
    assert kept(0.6) == [False, True, False, True]
    assert kept(0.8) == [False, True, False, True]
    assert kept(0.81) == [True, True, False, True]
    assert kept(1.0) == [True, True, True, True]
    assert kept(0.01) == [False, True, False, False]  # the top token is always kept


def test_top_p_batched_rows_are_independent():
    logits = torch.tensor([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    out = apply_top_p(logits, 0.9)
    assert torch.isfinite(out).tolist() == [[False, False, True], [True, False, False]]


def test_logits_to_probs_temperature_by_hand():
    logits = torch.tensor([0.0, math.log(4.0)])
    assert torch.allclose(logits_to_probs(logits, 1.0), torch.tensor([0.2, 0.8]))
    # temperature 2 halves the logits: ratio 4 -> 2
    assert torch.allclose(logits_to_probs(logits, 2.0), torch.tensor([1 / 3, 2 / 3]))


def test_logits_to_probs_applies_top_k_then_top_p_and_renormalises():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    out = logits_to_probs(probs.log(), 1.0, top_k=3, top_p=0.6)
    # top-3 renormalised: 4/9, 3/9, 2/9; nucleus 0.6 keeps the first two -> 4/7, 3/7
    assert torch.allclose(out, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


def test_logits_to_probs_is_float32_for_half_inputs():
    out = logits_to_probs(torch.tensor([1.0, 2.0], dtype=torch.bfloat16), 1.0)
    assert out.dtype == torch.float32 and torch.isclose(out.sum(), torch.tensor(1.0))


def test_logits_to_probs_rejects_greedy():
    with pytest.raises(ValueError, match="temperature > 0"):
        logits_to_probs(torch.zeros(3), 0.0)


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(temperature=-0.1, top_p=1.0, top_k=0), "temperature"), (dict(temperature=float("nan"), top_p=1.0, top_k=0), "temperature"),
     (dict(temperature=1.0, top_p=0.0, top_k=0), "top_p"), (dict(temperature=1.0, top_p=1.5, top_k=0), "top_p"),
     (dict(temperature=1.0, top_p=1.0, top_k=-1), "top_k")],
)
def test_check_sampling_args_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        check_sampling_args(**kwargs)


def test_sample_is_reproducible_and_respects_zeros():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 200)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (200,)
    assert set(a.tolist()) == {1, 2}
