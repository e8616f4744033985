"""The draft's shape chosen by measurement: candidates ranked by the speedup their measured figures predict.

A draft's shape (how many of the target's decoder layers it keeps, or which sibling model it is, and how many
token ids its head scores) trades acceptance for cost: a deeper draft agrees with the target more often and costs
more per step; a reduced head costs less and cannot propose the tokens it leaves out. Neither side can be read
off the shape: the cost ratios c and c_v are measured on the machine (``decode/timing.py``), the token
acceptance α on held-out rows after a short distillation. This module turns those figures into a ranking with
the speedup formula (``eval/theory.py``), for ``scripts/search_draft_shape.py``.

Pure functions: no torch, no I/O. The costs of a candidate are per K because c and c_v are timed in a round's
call pattern for each K (c_v grows with the K+1 positions verified).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from draftsmith.eval.theory import predicted_speedup


@dataclass
class Candidate:
    """One draft shape with what was measured on it.

    ``head`` is the reduced head's size (0 = the full head); ``alpha`` the token acceptance α its held-out
    rows give; ``c`` / ``c_v`` the cost ratios per K. ``measured`` is a speedup measured by decoding, when
    one exists (for comparing the prediction with it; the ranking never reads it).
    """

    name: str
    layers: Optional[int]
    head: int
    alpha: float
    c: dict[int, float]
    c_v: dict[int, float]
    parameters: Optional[int] = None
    train_s: Optional[float] = None
    measured: Optional[float] = None
    info: dict = field(default_factory=dict)  # anything else the caller keeps beside the figures (paths, ...)


@dataclass
class Ranked:
    """A candidate's row of the ranking: its predicted speedup at each K, its best K, its place (1 = best)."""

    candidate: Candidate
    best_k: int
    predicted: dict[int, float]
    speedup: float  # predicted at best_k
    round_cost: float  # best_k * c + c_v at best_k, in target steps: the tie-breaker
    rank: int = 0


def round_cost(candidate: Candidate, k: int) -> float:
    """What one speculative round of `k` draft tokens costs, in target steps: k*c + c_v."""
    return k * candidate.c[k] + candidate.c_v[k]


def _check(candidate: Candidate, ks: Sequence[int]) -> None:
    """Every K has both cost ratios and α is a probability: a clear ValueError naming the candidate otherwise."""
    missing = [k for k in ks if k not in candidate.c or k not in candidate.c_v]
    if missing:
        raise ValueError(f"candidate {candidate.name!r} has no measured c / c_v at K={missing}; "
                         "measure its costs at every K that is ranked")
    if not 0.0 <= candidate.alpha <= 1.0:
        raise ValueError(f"candidate {candidate.name!r}: alpha must be in [0, 1], got {candidate.alpha}")


def score(candidate: Candidate, ks: Sequence[int]) -> Ranked:
    """A candidate's predicted speedup at every K and its best K (the fastest; among equals, the smaller K)."""
    _check(candidate, ks)
    predicted = {k: predicted_speedup(candidate.alpha, k, candidate.c[k], candidate.c_v[k]) for k in ks}
    best = max(ks, key=lambda k: (round(predicted[k], 9), -k))  # equal to 1e-9: the smaller K
    return Ranked(candidate, best, predicted, predicted[best], round_cost(candidate, best))


def rank(candidates: Sequence[Candidate], ks: Sequence[int]) -> list[Ranked]:
    """The candidates ranked by predicted speedup at their best K, best first; ranks 1..n.

    Equal speedups (to 1e-9) go to the cheaper round (smaller K*c + c_v): the same gain for less work leaves
    more room on the machine and is less exposed to a cost that was measured low; then by name, so the order
    never depends on the input's.
    """
    if not candidates:
        raise ValueError("rank needs at least one candidate (a depth or a sibling draft with its costs and alpha)")
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"rank needs K values >= 1, got {ks}")
    rows = sorted((score(c, ks) for c in candidates),
                  key=lambda r: (-round(r.speedup, 9), r.round_cost, r.candidate.name))
    for i, row in enumerate(rows, start=1):
        row.rank = i
    return rows


def _tau(alpha: float, k: int) -> float:
    """τ = 1 + α + ... + α^k by Horner: the value of theory.expected_tokens_per_step, without the cancellation of
    its (1 - α^(k+1)) / (1 - α) near α = 1 (which would leave the bisection ~1e-8 off there)."""
    tau = 1.0
    for _ in range(k):
        tau = 1.0 + alpha * tau
    return tau


def iso_speedup_alpha(s: float, k: int, c: float, c_v: float, tol: float = 1e-12) -> Optional[float]:
    """The token acceptance α at which the predicted speedup at K=`k` with costs (c, c_v) equals `s`.

    The formula is s = τ(α) / (k·c + c_v) with τ(α) = 1 + α + ... + α^k rising from 1 (α = 0) to k+1 (α = 1), so
    α solves τ(α) = s·(k·c + c_v), found by bisection. Only k·c + c_v matters: a curve over the round's cost x
    is ``iso_speedup_alpha(s, k, 0.0, x)``. None when no α in [0, 1] gives `s`: even α = 0 does better
    (s·cost < 1) or even α = 1 cannot reach it (s·cost > k+1).
    """
    if s <= 0:
        raise ValueError(f"the speedup must be > 0, got {s}")
    predicted_speedup(0.0, k, c, c_v)  # checks k, c and c_v
    need = s * (k * c + c_v)
    if need < 1.0 or need > k + 1:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if _tau(mid, k) < need:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def iso_curve(s: float, k: int, costs: Sequence[float]) -> list[tuple[float, float]]:
    """(round cost x, α) points of the iso-speedup line `s` at K=`k`, for the x in `costs` where it exists."""
    points = ((x, iso_speedup_alpha(s, k, 0.0, x)) for x in costs)
    return [(x, a) for x, a in points if a is not None]
