"""Distillation losses between a teacher (target) distribution p and a student (draft) distribution q.

Pure functions on log-probabilities, last dimension = vocabulary (or buckets, see
:func:`topk_buckets`). Each ``*_per_position`` function returns one value per position; the
:func:`masked_mean` reduction keeps the loss on completion tokens only.

Why these: the probability that a draft token is accepted under speculative sampling (the
"expected acceptance" of docs/ARCHITECTURE.md) is sum_x min(p(x), q(x)) = 1 - TV(p, q), so the
total variation distance is the loss that targets acceptance directly (DistillSpec, Zhou et al.
2024); forward KL, reverse KL and the generalized JSD (GKD, Agarwal et al. 2024) are its smoother
relatives.
"""

from __future__ import annotations

import math

import torch

from draftsmith.train.settings import LOSSES  # noqa: F401 - the names divergence_per_position accepts


def _kl(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) = sum a (log a - log b), with 0 log 0 = 0."""
    a = logp_a.exp()
    return torch.where(a > 0, a * (logp_a - logp_b), torch.zeros_like(a)).sum(-1)


def forward_kl_per_position(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q): mass-covering; the usual token-level KD loss."""
    return _kl(teacher_logp, student_logp)


def reverse_kl_per_position(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """KL(q || p): mode-seeking; penalises the student for mass where the teacher has little."""
    return _kl(student_logp, teacher_logp)


def jsd_per_position(teacher_logp: torch.Tensor, student_logp: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Generalized JSD: beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q, 0 < beta < 1.

    beta = 0.5 is the symmetric Jensen-Shannon divergence (at most log 2). Use fkl / rkl for the
    limits beta -> 0 / 1 (GKD's convention, as in TRL's generalized_jsd_loss).
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd beta must be in (0, 1), got {beta}; use loss fkl or rkl for the limits")
    mix_logp = torch.logsumexp(
        torch.stack([teacher_logp + math.log(beta), student_logp + math.log(1.0 - beta)]), dim=0)
    return beta * _kl(teacher_logp, mix_logp) + (1.0 - beta) * _kl(student_logp, mix_logp)


def tvd_per_position(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """Total variation 0.5 sum |p - q| = 1 - sum min(p, q) = 1 - expected acceptance of a draft token."""
    return 0.5 * (teacher_logp.exp() - student_logp.exp()).abs().sum(-1)


def ce_per_position(student_logp: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log q(label): sequence-level KD on the target's own tokens. labels [...], logp [..., V]."""
    return -student_logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is true (completion tokens); 0 when none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def topk_buckets(
    student_logp: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher and student log-probs over k+1 buckets: the teacher's top-k tokens plus "the rest".

    Cached teacher signal stores only the top-k log-probs; the tail mass 1 - sum(top-k) is kept as
    one extra bucket for both distributions instead of being dropped or spread. Bucketing is a
    coarsening, so every f-divergence here (KL both ways, JSD, TV) on the buckets is a lower bound
    of the full-vocabulary one (data processing inequality), and equal to it when p and q are
    proportional inside the tail (in particular when the teacher's tail mass is 0 and so is the
    student's).

    Args:
        student_logp: [..., V] student log-probs. topk_ids / topk_logp: [..., k] teacher's top-k.
    Returns:
        (teacher_bucket_logp, student_bucket_logp), each [..., k+1].
    """
    s_top = student_logp.gather(-1, topk_ids)  # [..., k]
    t_tail = torch.log1p(-topk_logp.exp().sum(-1, keepdim=True).clamp(max=1.0 - 1e-6))  # [..., 1]
    s_tail = torch.log1p(-s_top.exp().sum(-1, keepdim=True).clamp(max=1.0 - 1e-6))
    return torch.cat([topk_logp, t_tail], -1), torch.cat([s_top, s_tail], -1)


def topk_uniform_tail(topk_ids: torch.Tensor, topk_logp: torch.Tensor, vocab: int) -> torch.Tensor:
    """The teacher's full log-distribution [..., V] from its cached top-k, the tail mass spread evenly.

    The bucketed divergence (:func:`topk_buckets`) only constrains the student's *total* tail mass,
    so a student may pile it onto one tail token, which then becomes its argmax: with a flat
    (high-entropy) teacher whose tail holds much of the mass, top-1 agreement collapses while the
    bucketed loss keeps falling (seen on the demo pair). Spreading the tail evenly over the V - k
    other tokens makes any divergence penalise that.

    Args:
        topk_ids / topk_logp: [..., k] the teacher's top-k ids and log-probs. vocab: V (> k).
    Returns:
        [..., V] teacher log-probs: exact on the top-k, (1 - sum top-k) / (V - k) elsewhere.
    """
    k = topk_ids.shape[-1]
    if vocab <= k:
        raise ValueError(f"vocab size {vocab} must exceed the number of cached log-probs {k}")
    top = topk_logp.exp()
    tail = (1.0 - top.sum(-1, keepdim=True)).clamp(min=1e-12) / (vocab - k)  # [..., 1]
    probs = tail.expand(*topk_ids.shape[:-1], vocab).clone()
    probs.scatter_(-1, topk_ids, top)
    return probs.log()


def divergence_per_position(kind: str, teacher_logp: torch.Tensor, student_logp: torch.Tensor,
                            beta: float = 0.5) -> torch.Tensor:
    """Dispatch on the loss name: fkl, rkl, jsd or tvd (ce needs labels, see :func:`ce_per_position`)."""
    if kind == "fkl":
        return forward_kl_per_position(teacher_logp, student_logp)
    if kind == "rkl":
        return reverse_kl_per_position(teacher_logp, student_logp)
    if kind == "jsd":
        return jsd_per_position(teacher_logp, student_logp, beta)
    if kind == "tvd":
        return tvd_per_position(teacher_logp, student_logp)
    raise ValueError(f"unknown distillation loss {kind!r}: choose one of {', '.join(LOSSES)}")
