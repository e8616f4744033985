"""eval/shapes.py by hand: the ranking of draft shapes, their best K, ties, and the iso-speedup inverse."""

import ast
import math
from pathlib import Path

import pytest

from draftsmith.eval.shapes import Candidate, iso_curve, iso_speedup_alpha, rank, round_cost
from draftsmith.eval.theory import predicted_speedup

KS = [1, 2, 3]


def same_costs(name, alpha, c, c_v, ks=KS, **kw):
    return Candidate(name=name, layers=2, head=0, alpha=alpha, c={k: c for k in ks}, c_v={k: c_v for k in ks}, **kw)


def test_speedup_by_hand():
    # alpha 0.5, K 2: tau = 1 + 0.5 + 0.25 = 1.75; a round costs 2 * 0.1 + 1.2 = 1.4 target steps
    assert math.isclose(predicted_speedup(0.5, 2, 0.1, 1.2), 1.75 / 1.4) and math.isclose(1.75 / 1.4, 1.25)


def test_ranking_order_and_best_k_by_hand():
    mid = same_costs("mid", 0.5, 0.1, 1.2)
    # K=1: 1.5 / 1.3 = 1.154; K=2: 1.75 / 1.4 = 1.25; K=3: 1.875 / 1.5 = 1.25 -> K=2 (the smaller of two equals)
    deep = same_costs("deep", 0.8, 0.3, 1.2)
    # K=1: 1.8 / 1.5 = 1.2; K=2: 2.44 / 1.8 = 1.356; K=3: 2.952 / 2.1 = 1.406 -> K=3
    shallow = same_costs("shallow", 0.2, 0.05, 1.2)
    # K=1: 1.2 / 1.25 = 0.96; K=2: 1.24 / 1.3 = 0.954; K=3: 1.248 / 1.35 = 0.924 -> K=1
    rows = rank([shallow, mid, deep], KS)
    assert [r.candidate.name for r in rows] == ["deep", "mid", "shallow"]
    assert [r.rank for r in rows] == [1, 2, 3]
    assert [r.best_k for r in rows] == [3, 2, 1]
    assert [round(r.speedup, 4) for r in rows] == [round(2.952 / 2.1, 4), 1.25, 0.96]
    assert math.isclose(rows[0].predicted[2], 2.44 / 1.8)
    assert math.isclose(rows[1].round_cost, 1.4)  # at its best K=2
    assert rows[0].predicted == {k: predicted_speedup(0.8, k, 0.3, 1.2) for k in KS}


def test_costs_per_k_are_read_per_k():
    # the same draft whose verify cost grows with K: K=1 wins at 1.5 / (0.1 + 1.0) = 1.364 over K=2's 1.75 / 2.2
    cand = Candidate(name="x", layers=1, head=8, alpha=0.5, c={1: 0.1, 2: 0.1}, c_v={1: 1.0, 2: 2.0})
    (row,) = rank([cand], [2, 1])
    assert row.best_k == 1 and math.isclose(row.speedup, 1.5 / 1.1) and math.isclose(round_cost(cand, 2), 2.2)


def test_a_tie_goes_to_the_cheaper_round():
    # alpha 0, cost 1.0: 1 / 1 = 1.0; alpha 1, cost 0.5 + 1.5 = 2.0: tau 2 / 2 = 1.0 -> the same speedup
    costly = Candidate(name="a-costly", layers=4, head=0, alpha=1.0, c={1: 0.5}, c_v={1: 1.5})
    cheap = Candidate(name="b-cheap", layers=1, head=0, alpha=0.0, c={1: 0.0}, c_v={1: 1.0})
    rows = rank([costly, cheap], [1])
    assert rows[0].speedup == rows[1].speedup == 1.0
    assert [r.candidate.name for r in rows] == ["b-cheap", "a-costly"]  # cost first, not the name


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one candidate"):
        rank([], KS)
    with pytest.raises(ValueError, match="K values >= 1"):
        rank([same_costs("x", 0.5, 0.1, 1.0)], [])
    with pytest.raises(ValueError, match=r"'x' has no measured c / c_v at K=\[3\]"):
        rank([same_costs("x", 0.5, 0.1, 1.0, ks=[1, 2])], KS)
    with pytest.raises(ValueError, match="alpha must be in"):
        rank([same_costs("x", 1.5, 0.1, 1.0)], KS)


@pytest.mark.parametrize("alpha, k, c, c_v", [(0.5, 2, 0.1, 1.2), (0.8, 4, 0.1, 1.5), (0.05, 1, 0.0, 0.96),
                                              (0.99, 3, 0.2, 1.0), (0.0, 2, 0.0, 1.0), (1.0, 2, 0.1, 1.0)])
def test_iso_speedup_alpha_inverts_the_prediction(alpha, k, c, c_v):
    s = predicted_speedup(alpha, k, c, c_v)
    found = iso_speedup_alpha(s, k, c, c_v)
    assert found is not None and math.isclose(found, alpha, abs_tol=1e-9)
    assert math.isclose(predicted_speedup(found, k, c, c_v), s, rel_tol=1e-9)


def test_iso_speedup_alpha_by_hand_and_out_of_reach():
    # 1.25x at K=2 and a round of 1.4: tau = 1.75 = 1 + a + a^2 -> a = 0.5
    assert math.isclose(iso_speedup_alpha(1.25, 2, 0.1, 1.2), 0.5, abs_tol=1e-9)
    assert iso_speedup_alpha(0.5, 2, 0.1, 1.2) is None  # even alpha 0 gives 1 / 1.4 = 0.71x
    assert iso_speedup_alpha(3.0, 2, 0.1, 1.2) is None  # even alpha 1 gives only 3 / 1.4 = 2.14x
    with pytest.raises(ValueError):
        iso_speedup_alpha(0.0, 2, 0.1, 1.2)
    with pytest.raises(ValueError):
        iso_speedup_alpha(1.2, 2, 0.1, 0.0)
    # a curve over the round's cost: only k*c + c_v matters, and the points out of reach are left out
    curve = iso_curve(1.25, 2, [0.5, 1.4, 5.0])
    assert [x for x, _ in curve] == [1.4] and math.isclose(curve[0][1], 0.5, abs_tol=1e-9)


def test_shapes_is_pure():
    """No torch (the ranking runs anywhere the JSON is), no file or process access."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "eval" / "shapes.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing", "draftsmith.eval.theory"}, imported
