"""N-gram prompt lookup: speculation that needs no trained draft (vLLM's ``method: ngram``).

The proposer looks for the longest n-gram (``min_n`` <= n <= ``max_n``) that ends the text so far and occurred
earlier in it (prompt and output alike), and proposes the tokens that followed its earliest occurrence, up to K
of them (fewer when the text ends first). No match: nothing is proposed, and the round is a plain decode step.
This is vLLM 0.32's rule (``vllm/v1/spec_decode/ngram_proposer.py``
``_find_longest_matched_ngram_and_propose_tokens``: longest match in the window, earliest position among equals),
so draftsmith's loop at batch 1 and the serving A/B measure the same proposer.

A proposal is deterministic: as a draft distribution it is one-hot (q(d) = 1), so rejection sampling keeps
the target's distribution exactly (accept with probability p(d), else resample from p with d taken out).

A training-free proposer stands where a draft's folder would, as a spec string ``ngram:MIN-MAX`` (``ngram``
alone: :data:`DEFAULT`): ``eval.baselines`` / ``serve.baselines`` list them, and serving.json's ``drafts`` (and
a registry version's copy of it) carries each beside the drafts' folders, as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch at import: the config schemas read the spec strings
    import torch

PREFIX = "ngram"


@dataclass(frozen=True)
class NGram:
    """The lookup window: the n-gram lengths tried, longest first."""

    min_n: int = 2
    max_n: int = 4

    def __post_init__(self):
        if not (isinstance(self.min_n, int) and isinstance(self.max_n, int) and 1 <= self.min_n <= self.max_n):
            raise ValueError(f"an n-gram window needs integers 1 <= min <= max, got min={self.min_n!r} "
                             f"max={self.max_n!r} (write it as ngram:MIN-MAX, e.g. ngram:2-4)")

    @property
    def spec(self) -> str:
        """The canonical spec string, ``ngram:2-4``."""
        return f"{PREFIX}:{self.min_n}-{self.max_n}"

    def propose(self, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """Up to `k` token ids [<= k] that followed the earliest occurrence of the longest n-gram ending `tokens` [T]
        (1-D), empty when none of the window's lengths occurs earlier."""
        total = tokens.shape[0]
        if k < 1:
            return tokens[:0]
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            # windows of tokens[:-1]: every start s < total - n, so each is followed by at least one token
            hits = (tokens[:-1].unfold(0, n, 1) == tokens[total - n:]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[0, 0]) + n
                return tokens[start:start + k]
        return tokens[:0]

    def vllm_config(self, k: int) -> dict:
        """vLLM's ``--speculative-config`` for this window at `k` tokens per step."""
        return {"method": PREFIX, "num_speculative_tokens": int(k), "prompt_lookup_min": self.min_n,
                "prompt_lookup_max": self.max_n}


DEFAULT = NGram()


def is_ngram_spec(text) -> bool:
    """Whether `text` names the n-gram proposer (``ngram`` or ``ngram:MIN-MAX``) rather than a draft's folder."""
    return isinstance(text, str) and (text == PREFIX or text.startswith(PREFIX + ":"))


def parse_ngram(text: str, key: str = "the proposer") -> NGram:
    """``ngram`` -> :data:`DEFAULT`; ``ngram:MIN-MAX`` -> that window; anything else a ValueError naming `key`."""
    if text == PREFIX:
        return DEFAULT
    body = text[len(PREFIX) + 1:] if is_ngram_spec(text) else None
    parts = body.split("-") if body else []
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{key}={text!r}: write the n-gram proposer as ngram (window {DEFAULT.min_n}-"
                         f"{DEFAULT.max_n}) or ngram:MIN-MAX, e.g. ngram:1-3")
    try:
        return NGram(int(parts[0]), int(parts[1]))
    except ValueError as exc:
        raise ValueError(f"{key}={text!r}: {exc}") from None
