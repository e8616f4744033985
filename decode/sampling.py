"""Turning logits into the distribution that decoding samples from.

Pure functions on tensors. Speculative sampling is only lossless when the draft's distribution q
and the target's distribution p are both processed by exactly the same filters, so both loops
call :func:`logits_to_probs` with the same settings.
"""

from __future__ import annotations

import torch


def check_sampling_args(temperature: float, top_p: float, top_k: int) -> None:
    """Raise ValueError naming the argument when a sampling setting is out of range."""
    if not temperature >= 0.0:  # also rejects NaN
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` largest logits of the last dimension, set the others to -inf.

    Ties at the k-th value are all kept (as in HF's TopKLogitsWarper). `top_k` 0 disables.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [..., 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches `top_p`.

    A token is dropped when the mass of the tokens strictly more likely than it already reaches
    `top_p`, so the most likely token is always kept. `top_p` 1.0 disables.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., V]
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [..., V]
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def logits_to_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Probabilities after temperature, then top-k, then top-p, over the last dimension.

    `temperature` must be > 0 here; greedy decoding (temperature 0) takes the argmax instead.
    Computed in float32 whatever the model's dtype, so that p/q ratios are stable.
    """
    if temperature <= 0:
        raise ValueError("logits_to_probs needs temperature > 0; use argmax for greedy decoding")
    scaled = logits.float() / temperature
    scaled = apply_top_p(apply_top_k(scaled, top_k), top_p)
    return torch.softmax(scaled, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw from each row of `probs` [..., V] -> LongTensor [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    draws = torch.multinomial(flat, 1, generator=generator)  # [N, 1]
    return draws.reshape(probs.shape[:-1])
