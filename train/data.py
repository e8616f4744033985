"""Batches for draft training: prompt + completion rows, the loss mask, and cached teacher top-k.

Position convention: for a row ``x = prompt + completion`` the model's logits at position i predict
token i+1. Completion token j sits at ``len(prompt) + j``, so it is predicted at position
``len(prompt) + j - 1``; the loss mask is true exactly there. Cached top-k teacher entries of
completion position j go to the same place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """A right-padded training batch.

    Attributes:
        input_ids: [B, T] prompt + completion, padded with `pad_id`.
        attention_mask: [B, T] 1 on real tokens.
        loss_mask: [B, T-1] True where position i predicts a completion token.
        topk_ids / topk_logprobs: [B, T-1, k] cached teacher signal at masked positions, or None.
        prompt_lens: [B] prompt lengths (for on-policy sampling from the prompts).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    topk_ids: torch.Tensor | None
    topk_logprobs: torch.Tensor | None
    prompt_lens: list[int]

    def to(self, device) -> "Batch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(move(self.input_ids), move(self.attention_mask), move(self.loss_mask), move(self.topk_ids),
                     move(self.topk_logprobs), self.prompt_lens)


def collate(rows: list[dict], pad_id: int, max_len: int | None = None, with_topk: bool = False) -> Batch:
    """Build a :class:`Batch` from datagen rows (dicts with prompt_ids, completion_ids[, topk_*])."""
    seqs = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in rows]
    width = max(len(s) for s in seqs)
    if max_len is not None:
        width = min(width, max_len)
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, width - 1), dtype=torch.bool)
    k = len(rows[0]["topk_ids"][0]) if with_topk and rows[0]["topk_ids"] else 0
    topk_ids = torch.zeros((b, width - 1, max(k, 1)), dtype=torch.long) if with_topk else None
    topk_lp = torch.zeros((b, width - 1, max(k, 1))) if with_topk else None
    for i, (row, seq) in enumerate(zip(rows, seqs)):
        seq = seq[:width]
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        p = len(row["prompt_ids"])
        n_comp = max(0, min(len(row["completion_ids"]), width - p))
        if p >= 1 and n_comp:
            loss_mask[i, p - 1 : p - 1 + n_comp] = True
            if with_topk:
                topk_ids[i, p - 1 : p - 1 + n_comp] = torch.tensor(row["topk_ids"][:n_comp])
                topk_lp[i, p - 1 : p - 1 + n_comp] = torch.tensor(row["topk_logprobs"][:n_comp])
    return Batch(input_ids, attention, loss_mask, topk_ids, topk_lp, [len(r["prompt_ids"]) for r in rows])


def batch_indices(n_rows: int, batch_size: int, step: int, seed: int, rank: int = 0, world: int = 1) -> list[int]:
    """Row indices of micro-batch `step` for process `rank`: a seeded permutation per epoch, sharded by rank.

    Pure function of its arguments, so a resumed run sees exactly the batches it would have seen.
    """
    global_batch = batch_size * world
    per_epoch = max(1, n_rows // global_batch)
    epoch, pos = divmod(step, per_epoch)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n_rows, generator=gen)
    start = pos * global_batch + rank * batch_size
    return perm[start : start + batch_size].tolist()
