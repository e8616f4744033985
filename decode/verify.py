"""Verification of a drafted block against the target: which draft tokens survive, and what comes next.

Both functions take the K drafted tokens and the target's view of the K+1 positions that one
target forward over ``[last_token, d_1 .. d_K]`` produces, and return ``(n_accepted, next_token)``:
the first ``n_accepted`` drafts are kept and ``next_token`` is appended after them (a correction
after a rejection, or the bonus token when all K were accepted). Every round therefore yields
``n_accepted + 1`` tokens for one target forward.

References: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative
Decoding" (Algorithm 1); Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling" (Algorithm 2).
"""

from __future__ import annotations

import torch

from draftsmith.decode.sampling import sample


def verify_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: accept the longest prefix on which the draft equals the target's argmax.

    Args:
        draft_tokens: [K] drafted token ids.
        target_argmax: [K+1] the target's argmax at each verified position.
    """
    k = draft_tokens.shape[0]
    agree = draft_tokens == target_argmax[:k]  # [K]
    n_accepted = int(torch.cumprod(agree.to(torch.int8), 0).sum()) if k else 0
    return n_accepted, int(target_argmax[n_accepted])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dimension: what to sample after a rejection.

    When p <= q everywhere (only possible through rounding, since a rejection has probability
    sum(max(0, q - p)) = sum(max(0, p - q))), there is no residual mass and p itself is returned.
    """
    residual = torch.clamp(p - q, min=0.0)  # [..., V]
    mass = residual.sum(dim=-1, keepdim=True)
    safe = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p)
    return safe


def verify_sampling(
    draft_tokens: torch.Tensor,
    q_probs: torch.Tensor,
    p_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Rejection-sampling verification; the returned tokens are distributed exactly as the target's.

    Args:
        draft_tokens: [K] token ids sampled from ``q_probs``.
        q_probs: [K, V] the draft's (filtered) distribution at each drafted position.
        p_probs: [K+1, V] the target's (filtered) distribution at each verified position.
        generator: the random source; K uniforms and one categorical draw are taken per call,
            so a fixed seed gives a fixed output.
    Steps (Leviathan et al. 2023, Algorithm 1):
        1. accept draft i with probability min(1, p_i(d_i) / q_i(d_i)), in order;
        2. at the first rejection, sample the correction from norm(max(0, p_i - q_i));
        3. when all K are accepted, sample a bonus token from p_{K+1}.
    """
    k = draft_tokens.shape[0]
    if k:
        idx = draft_tokens.unsqueeze(-1)  # [K, 1]
        p_d = p_probs[:k].gather(-1, idx).squeeze(-1)  # [K] p_i(d_i)
        q_d = q_probs.gather(-1, idx).squeeze(-1)  # [K] q_i(d_i) > 0 since d_i ~ q_i
        u = torch.rand(k, generator=generator, device=p_probs.device)  # [K]
        # u < p/q written without the division: q_d > 0 for a token the draft sampled.
        accept = u * q_d < p_d  # [K]
        n_accepted = int(torch.cumprod(accept.to(torch.int8), 0).sum())
    else:
        n_accepted = 0
    if n_accepted < k:
        dist = residual_distribution(p_probs[n_accepted], q_probs[n_accepted])
    else:
        dist = p_probs[k]
    return n_accepted, int(sample(dist, generator))


def expected_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) over the last dimension = 1 - TV(p, q): P(a draft token is accepted)."""
    return torch.minimum(p, q).sum(dim=-1)
