"""Acceptance figures from counts: the one home of their arithmetic (pure Python, no torch).

Every producer of speculative counts -- draftsmith's own loop (decode/stats.py), an eval cell pooled
over prompts (eval/metrics.py), vLLM's ``/metrics`` counters (serve/metrics.py) -- fills an
:class:`AcceptanceCounts`; pooling is adding counts, and the figures are divided out once, here:

- ``acceptance_rate`` = accepted / drafted (vLLM's "acceptance rate": the drafts after a rejection
  count as drafted);
- ``token_acceptance`` α = accepted / (accepted + rejected), over the draft tokens actually tested:
  the α of the speedup formula (Leviathan et al. 2023; eval/theory.py);
- ``mean_accepted_tokens`` τ = round_tokens / rounds, new tokens per verification round (1 .. K+1);
- ``per_position_acceptance``: accepted_i / drafted_i, draft position i = 1..K;
- ``expected_acceptance`` = overlap_sum / drafted, the mean Σ_x min(p, q) (= 1 − TV) of sampling.

A figure is None where it is undefined: nothing drafted (no rounds) or a count the producer does
not keep (vLLM counts no rejections). Callers that report 0.0 there convert at their edge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

ACCEPTANCE_FLOOR = 0.5  # the rule of thumb: below this acceptance rate speculation usually costs more than it saves


def _ratio(num: float | None, den: float | None, undefined: float | None = None) -> float | None:
    """num / den; None when either count is unknown, `undefined` when den is 0."""
    if num is None or den is None:
        return None
    return num / den if den else undefined


def _add_known(a: float | None, b: float | None) -> float | None:
    """a + b when both are known, else None (an unknown count stays unknown when pooled)."""
    return None if a is None or b is None else a + b


def _add_lists(a: list[float], b: list[float]) -> list[float]:
    """Elementwise sum, the shorter list padded with zeros."""
    return [_at(a, i) + _at(b, i) for i in range(max(len(a), len(b)))]


def _at(xs: list[float], i: int) -> float:
    """xs[i], 0 beyond its end."""
    return xs[i] if i < len(xs) else 0


@dataclass
class AcceptanceCounts:
    """The counts of speculative verification that every acceptance figure is derived from."""

    drafted: float = 0.0  # draft tokens proposed
    accepted: float = 0.0  # draft tokens accepted
    rounds: float = 0.0  # verification rounds (vLLM: its "drafts" counter)
    round_tokens: float | None = None  # new tokens the rounds produced; None = accepted + rounds (no EOS cut; vLLM)
    rejected: float | None = None  # rounds that ended with a rejection; None = unknown (vLLM does not count them)
    drafted_per_position: list[float] = field(default_factory=list)  # [K]: drafted at position i = 1..K
    accepted_per_position: list[float] = field(default_factory=list)  # [K]: accepted at position i = 1..K
    overlap_sum: float | None = None  # sampling: sum over drafted positions of sum_x min(p, q); None = greedy/unknown

    @property
    def produced(self) -> float:
        """New tokens the rounds produced: round_tokens, else one per round beyond the accepted drafts."""
        return self.accepted + self.rounds if self.round_tokens is None else self.round_tokens

    def __add__(self, other: AcceptanceCounts) -> AcceptanceCounts:
        """Pool two sets of counts: every count summed; an unknown count (None) stays unknown unless both know it."""
        if not isinstance(other, AcceptanceCounts):
            return NotImplemented
        both_derived = self.round_tokens is None and other.round_tokens is None
        return AcceptanceCounts(
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            rounds=self.rounds + other.rounds,
            round_tokens=None if both_derived else self.produced + other.produced,
            rejected=_add_known(self.rejected, other.rejected),
            drafted_per_position=_add_lists(self.drafted_per_position, other.drafted_per_position),
            accepted_per_position=_add_lists(self.accepted_per_position, other.accepted_per_position),
            overlap_sum=_add_known(self.overlap_sum, other.overlap_sum),
        )

    @classmethod
    def pooled(cls, counts: Iterable[AcceptanceCounts]) -> AcceptanceCounts:
        """The sum of `counts`, in order (empty counts, all figures None, when there are none)."""
        items = list(counts)
        if not items:
            return cls()
        first = items[0]  # copied: the pooled lists are never an input's own
        total = replace(first, drafted_per_position=list(first.drafted_per_position),
                        accepted_per_position=list(first.accepted_per_position))
        for c in items[1:]:
            total = total + c
        return total

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (None when nothing was drafted)."""
        return self.figures()["acceptance_rate"]

    @property
    def token_acceptance(self) -> float | None:
        """α = accepted / (accepted + rejected), over the tested draft tokens (None when none, or unknown)."""
        return self.figures()["token_acceptance"]

    @property
    def mean_accepted_tokens(self) -> float | None:
        """τ = new tokens per verification round (None without rounds)."""
        return self.figures()["mean_accepted_tokens"]

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """P(draft token i accepted | drafted), i = 1..K; None at a position never drafted."""
        return self.figures()["per_position_acceptance"]

    @property
    def expected_acceptance(self) -> float | None:
        """Mean sum_x min(p, q) over the drafted positions (None in greedy, unknown, or nothing drafted)."""
        return self.figures()["expected_acceptance"]

    def figures(self, undefined: float | None = None) -> dict:
        """The acceptance figures by their metrics.json names.

        Args:
            undefined: the value of a figure whose denominator is 0 (nothing drafted, no rounds, a
                position never drafted); a figure from a count that is not kept (None) is None whatever it is.
        """
        drafted, accepted = self.drafted_per_position, self.accepted_per_position
        tested = None if self.rejected is None else self.accepted + self.rejected
        return {
            "acceptance_rate": _ratio(self.accepted, self.drafted, undefined),
            "token_acceptance": _ratio(self.accepted, tested, undefined),
            "expected_acceptance": _ratio(self.overlap_sum, self.drafted, undefined),
            "mean_accepted_tokens": _ratio(self.produced, self.rounds, undefined),
            "per_position_acceptance": [_ratio(_at(accepted, i), _at(drafted, i), undefined)
                                        for i in range(max(len(drafted), len(accepted)))],
        }
