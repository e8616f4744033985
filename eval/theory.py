"""Speculative decoding speedup theory (Leviathan et al. 2023, section 3): pure functions.

`alpha` here is always the **token acceptance** α: the probability that a draft token the target
tests is accepted, measured as accepted / tested (`token_acceptance` in decode stats and
metrics.json). It is not the `acceptance_rate` (accepted / drafted), which also counts the drafted
tokens after a rejection that are never tested; see docs/ARCHITECTURE.md, "Metrics".
"""

from __future__ import annotations


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[new tokens per target forward] = (1 - alpha^(k+1)) / (1 - alpha), for i.i.d. token acceptance alpha."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, c_v: float) -> float:
    """Wall-time speedup over plain decoding: (1 - alpha^(k+1)) / ((1 - alpha)(k*c + c_v)).

    Args:
        alpha: token acceptance α, P(a tested draft token is accepted) = accepted / tested
            (`token_acceptance`; not `acceptance_rate`).
        k: draft tokens per round.
        c: cost of one draft step / cost of one target step.
        c_v: cost of one target forward over k+1 positions / cost of one target step
            (about 1 on a GPU for small k; larger on a CPU).
    """
    if c < 0 or c_v <= 0:
        raise ValueError(f"cost ratios must be c >= 0 and c_v > 0, got c={c}, c_v={c_v}")
    return expected_tokens_per_step(alpha, k) / (k * c + c_v)
