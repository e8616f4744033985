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
        assert costs["c"][k] > 0 and costs["c_v"][k] > 0
        assert costs["draft_step_in_round_s"][k] > 0 and costs["verify_s"][k] > 0


class _ClockedRunner:
    """A runner whose forward advances a fake clock by `unit` * (1 + tokens / 4) * the machine's current speed."""

    def __init__(self, clock, unit):
        self.clock, self.unit, self.length, self.forwards = clock, unit, 0, 0

    def __len__(self):
        return self.length

    def forward(self, input_ids, keep):
        self.clock.advance(self.unit * (1 + input_ids.shape[1] / 4))
        self.length += input_ids.shape[1]
        self.forwards += 1
        return torch.zeros(keep, 8)

    def crop(self, length):
        self.length = length


def test_cost_ratios_cancel_a_drifting_machine(monkeypatch):
    """The machine slows down 3x half way through (a neighbour starts): each repeat's ratios are taken within
    it, so c and c_v stay exact, where ratios of separately timed medians would not."""
    import draftsmith.decode.timing as timing

    class Clock:
        now, calls = 0.0, 0

        def advance(self, seconds):
            self.calls += 1
            self.now += seconds * (3.0 if self.calls > 60 else 1.0)

    clock = Clock()
    models = {"target": _ClockedRunner(clock, 1.0), "draft": _ClockedRunner(clock, 0.1)}
    monkeypatch.setattr(timing, "make_runner", lambda model, backend, capacity, vocab=None: models[model])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock.now)
    costs = timing.cost_ratios("target", "draft", torch.zeros(1, 8, dtype=torch.long), ks=[1, 3], repeats=20)
    # a target step of 1 token: 1.25 units; k+1 tokens: 1 + (k+1)/4; a draft step: 0.125
    assert costs["c"] == {1: pytest.approx(0.1), 3: pytest.approx(0.1)}
    assert costs["c_v"] == {1: pytest.approx(1.5 / 1.25), 3: pytest.approx(2.0 / 1.25)}
