"""Speedup theory by hand, and the cost-ratio measurement on tiny models."""

import math

import pytest
import torch

from conftest import make_model
from draftsmith.decode.timing import cost_ratios
from draftsmith.eval.theory import expected_tokens_per_step, predicted_speedup


def test_expected_tokens_by_hand():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert math.isclose(expected_tokens_per_step(0.5, 2), 1 + 0.5 + 0.25)  # (1 - 0.125) / 0.5
    assert math.isclose(expected_tokens_per_step(0.8, 4), (1 - 0.8**5) / 0.2)


def test_predicted_speedup_by_hand():
    # alpha 0.8, K 4: tau = 3.3616; cost 4 * 0.1 + 1.5 = 1.9
    assert math.isclose(predicted_speedup(0.8, 4, 0.1, 1.5), 3.3616 / 1.9, rel_tol=1e-9)
    # a draft that is never accepted costs k*c + c_v per token: a slowdown
    assert math.isclose(predicted_speedup(0.0, 3, 0.2, 1.0), 1 / 1.6)


@pytest.mark.parametrize("args", [(1.5, 4, 0.1, 1.0), (0.5, 0, 0.1, 1.0), (0.5, 4, -0.1, 1.0), (0.5, 4, 0.1, 0.0)])
def test_theory_rejects_bad_inputs(args):
    with pytest.raises(ValueError):
        predicted_speedup(*args)


def test_cost_ratios_on_tiny_models():
    target, draft = make_model("llama", seed=0, layers=4, hidden=64), make_model("llama", seed=1, layers=1)
    context = torch.randint(4, 64, (1, 16))
    costs = cost_ratios(target, draft, context, ks=[1, 4], repeats=5)
    assert costs["target_step_s"] > 0 and costs["draft_step_s"] > 0
    assert costs["c_isolated"] == costs["draft_step_s"] / costs["target_step_s"]
    for k in (1, 4):
        assert costs["c"][k] == costs["draft_step_in_round_s"][k] / costs["target_step_s"] > 0
        assert costs["c_v"][k] == costs["verify_s"][k] / costs["target_step_s"] > 0
