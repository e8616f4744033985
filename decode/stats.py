"""What one decode call measured: token counts, forward counts and wall times.

Forward counts sit next to wall times on purpose: a change in speed with unchanged counts is
machine noise or kernel cost, a change in counts is the algorithm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from draftsmith.decode.acceptance import AcceptanceCounts


@dataclass
class DecodeStats:
    """Statistics of a plain autoregressive decode (and the common part of a speculative one).

    Attributes:
        new_tokens: tokens generated after the prompt (EOS included when it ended the output).
        target_forwards: forward calls of the target, prefill included.
        prefill_s: wall time of the target's prompt forward and the choice of the first token
            (both loops take the first token from the target's prefill: prefill_s == ttft_s).
        ttft_s: wall time from the call to the first new token being known.
        total_s: wall time of the whole call.
        backend: which cached forward ran the target: "lean" or "hf" (see decode/runners.py).
    """

    new_tokens: int = 0
    target_forwards: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0
    backend: str = "hf"

    @property
    def decode_s(self) -> float:
        """Wall time after the prefill."""
        return self.total_s - self.prefill_s

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first one (0 when fewer than two tokens)."""
        if self.new_tokens < 2:
            return 0.0
        return (self.total_s - self.ttft_s) / (self.new_tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of the whole call."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        """Plain dict with the derived values, ready for JSON."""
        out = asdict(self)
        out.update(decode_s=self.decode_s, tpot_s=self.tpot_s, tokens_per_s=self.tokens_per_s)
        return out


@dataclass
class SpeculativeStats(DecodeStats):
    """Statistics of a speculative decode.

    Attributes:
        k: the requested number of draft tokens per round (rounds near the end may draft fewer).
        rounds: verification forwards of the target (each yields 1 .. k+1 tokens). The first new
            token comes from the target's prefill, before any round, as in plain decoding:
            target_forwards = 1 + rounds, new_tokens = 1 + round_tokens (when any token was made).
        round_tokens: new tokens produced by the rounds (EOS included when it ended the output).
        drafted / accepted: draft tokens proposed / accepted by verification.
        rejected: rounds that ended with a rejected draft token (the tokens after it in the block
            were drafted but never tested).
        draft_forwards: forward calls of the draft, prefill included.
        drafted_per_position / accepted_per_position: [k] counts for draft position i = 1..k.
        draft_backend: which cached forward ran the draft: "lean" or "hf".
        timed_rounds / timed_draft_forwards: the rounds after the first, and the draft steps in them, whose
            seconds are summed: draft_s (the draft steps), verify_s (the verification forwards) and rounds_s
            (the whole rounds: the rest is verification, cache crops and bookkeeping). Round 1 is left out
            because its first draft step is the draft's prefill.
    """

    k: int = 0
    rounds: int = 0
    round_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    draft_forwards: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_backend: str = "hf"
    overlap_sum: float | None = None  # sampling only: sum over drafted positions of sum_x min(p(x), q(x))
    timed_rounds: int = 0
    timed_draft_forwards: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    rounds_s: float = 0.0

    def counts(self) -> AcceptanceCounts:
        """The acceptance counts of this decode (decode/acceptance.py derives every figure from them)."""
        return AcceptanceCounts(
            drafted=self.drafted, accepted=self.accepted, rounds=self.rounds, round_tokens=self.round_tokens,
            rejected=self.rejected, drafted_per_position=list(self.drafted_per_position),
            accepted_per_position=list(self.accepted_per_position), overlap_sum=self.overlap_sum,
        )

    @property
    def acceptance_rate(self) -> float:
        """Acceptance rate = accepted / drafted (0 when nothing was drafted); the α of the speedup formula is
        token acceptance (accepted / tested, eval.metrics)."""
        return self.counts().figures(undefined=0.0)["acceptance_rate"]

    @property
    def token_acceptance(self) -> float:
        """Per-token acceptance probability: accepted / (accepted + rejected) over the tokens actually tested.

        This is the alpha of the speedup formula (Leviathan et al. 2023). `acceptance_rate` is lower
        because it also counts the drafted tokens after a rejection, which are never tested.
        """
        return self.counts().figures(undefined=0.0)["token_acceptance"]

    @property
    def expected_acceptance(self) -> float | None:
        """Mean sum_x min(p, q) over drafted positions (= 1 - TV); sampling mode only, else None."""
        return self.counts().figures(undefined=0.0)["expected_acceptance"]  # None: overlap_sum is None

    @property
    def mean_accepted_tokens(self) -> float:
        """tau = new tokens per verification forward of the target, in [1, k+1].

        The prefill's forward and the first token it yields are left out of both counts: plain
        decoding pays the same prefill for the same token, and the formula's E[tokens per step]
        (eval/theory.py) is per verification round; counting them would pull tau towards 1 on
        short outputs.
        """
        return self.counts().figures(undefined=0.0)["mean_accepted_tokens"]

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft token i accepted | it was drafted), i = 1..k (0 at a position never drafted)."""
        return self.counts().figures(undefined=0.0)["per_position_acceptance"]

    def record_round(self, k_round: int, n_accepted: int, n_kept: int | None = None) -> None:
        """Count one verification round that drafted `k_round` tokens and accepted `n_accepted`.

        `n_kept` is the number of tokens the round added to the output: n_accepted + 1 (the
        default), fewer when an EOS among them ended the output.
        """
        self.rounds += 1
        self.round_tokens += n_accepted + 1 if n_kept is None else n_kept
        self.drafted += k_round
        self.accepted += n_accepted
        self.rejected += int(n_accepted < k_round)
        for i in range(k_round):
            self.drafted_per_position[i] += 1
            if i < n_accepted:
                self.accepted_per_position[i] += 1

    def record_costs(self, draft_steps: int, draft_s: float, verify_s: float, round_s: float) -> None:
        """Add one timed round: `draft_steps` draft forwards taking `draft_s`, the verification forward `verify_s`,
        the whole round `round_s` seconds."""
        self.timed_rounds += 1
        self.timed_draft_forwards += draft_steps
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.rounds_s += round_s

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(
            acceptance_rate=self.acceptance_rate,
            token_acceptance=self.token_acceptance,
            expected_acceptance=self.expected_acceptance,
            mean_accepted_tokens=self.mean_accepted_tokens,
            per_position_acceptance=self.per_position_acceptance,
        )
        return out


@dataclass
class GenerateOutput:
    """Result of a decode call: `sequences` [1, prompt + new] and its `stats`."""

    sequences: torch.Tensor
    stats: DecodeStats
