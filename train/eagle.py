"""Training an EAGLE-1 draft head (decode/eagle.py) on the target's own features.

- :func:`target_features`: the target's post-norm hidden states over given token rows (teacher forcing: one forward
  per batch), and its argmax for the rows the held-out figures read;
- :func:`shifted`: a batch of feature rows laid out for the head (input token x_{t+1}, feature h_t, the teacher's
  feature h_{t+1} and argmax at t+1);
- :func:`eagle_loss`: the head's loss (the target's next distribution, EAGLE's feature regression, optionally the
  second proposal as a K=2 round makes it).

The train stage runs them for ``method.finetune=eagle`` (train/eagle_objective.py); ``scripts/probe_eagle.py``
drives them apart, for experiments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.decode.eagle import EagleHead

# -- features and batches --------------------------------------------------------------------------
@torch.no_grad()
def target_features(target: torch.nn.Module, rows: list[tuple[list[int], list[int]]], batch: int = 16,
                    top: bool = True) -> list[dict]:
    """Teacher-forced target features of (prompt_ids, completion_ids) rows -> per row, in order: ``ids`` [L],
    ``h`` [L, H] (post-norm last hidden states), with `top` ``top`` [L] (the target's argmax over its full head:
    the held-out figures read it, the loss does not) and ``prompt_len``. Rows are batched by length, right-padded
    (causal attention: the padding never reaches a real position)."""
    out: list[dict | None] = [None] * len(rows)
    for idx, ids, mask in padded_batches(rows, batch, target.lm_head.weight.device):
        hs = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
        argmax = target.lm_head(hs).argmax(-1) if top else None
        for j, i in enumerate(idx):
            length = int(mask[j].sum())
            out[i] = {"ids": ids[j, :length].cpu(), "h": hs[j, :length].cpu(), "prompt_len": len(rows[i][0])}
            if top:
                out[i]["top"] = argmax[j, :length].cpu()
    return out  # type: ignore[return-value]


def padded_batches(rows: list[tuple[list[int], list[int]]], batch: int, device):
    """(row indices, ids [B, n], attention mask [B, n]) of (prompt_ids, completion_ids) rows, `batch` at a time,
    batched by length (less padding) and right-padded (causal attention: the padding never reaches a real
    position): the teacher-forced forwards over which the heads' features are read."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        seqs = [list(rows[i][0]) + list(rows[i][1]) for i in idx]
        n = max(map(len, seqs))
        ids = torch.zeros(len(seqs), n, dtype=torch.long, device=device)
        mask = torch.zeros(len(seqs), n, dtype=torch.long, device=device)
        for j, q in enumerate(seqs):
            ids[j, :len(q)] = torch.tensor(q, device=device)
            mask[j, :len(q)] = 1
        yield idx, ids, mask


@dataclass
class Shifted:
    """Feature rows laid out for the head, slot t of a row of length L (t < L-1): the input token x_{t+1}
    (``next_ids``), the feature h_t (``h``), the teacher's feature h_{t+1} (``h_next``) and argmax at t+1
    (``top_next``: the target's choice of x_{t+2}; -1 for rows without ``top``, the training
    rows); ``valid`` marks real slots, ``completion`` the slots a decode
    round proposes at (t >= P-1 for a prompt of P tokens: x_P, the first new token, comes from the prefill)."""

    next_ids: torch.Tensor
    h: torch.Tensor
    h_next: torch.Tensor
    top_next: torch.Tensor
    valid: torch.Tensor
    completion: torch.Tensor
    pos: torch.Tensor


def shifted(items: list[dict]) -> Shifted:
    """:class:`Shifted` of :func:`target_features` rows (right-padded to the longest)."""
    n = max(len(it["ids"]) for it in items) - 1
    b, width = len(items), items[0]["h"].shape[-1]
    s = Shifted(next_ids=torch.zeros(b, n, dtype=torch.long), h=torch.zeros(b, n, width),
                h_next=torch.zeros(b, n, width), top_next=torch.full((b, n), -1, dtype=torch.long),
                valid=torch.zeros(b, n, dtype=torch.bool), completion=torch.zeros(b, n, dtype=torch.bool),
                pos=torch.arange(n).unsqueeze(0).expand(b, n))
    for j, it in enumerate(items):
        length = len(it["ids"]) - 1
        s.next_ids[j, :length] = it["ids"][1:]
        s.h[j, :length] = it["h"][:-1]
        s.h_next[j, :length] = it["h"][1:]
        if "top" in it:  # the held-out rows' (target_features top=True); -1 elsewhere
            s.top_next[j, :length] = it["top"][1:]
        s.valid[j, :length] = True
        # a round's first proposal reads (x_P, h_{P-1}): slots t >= P-1 (x_P itself comes from the prefill)
        s.completion[j, max(0, it["prompt_len"] - 1):length] = True
    return s


@torch.no_grad()
def _teacher(h: torch.Tensor, head_w: torch.Tensor) -> torch.Tensor:
    """The target's distribution over the rows of `head_w` at features `h`, in float32 whatever autocast is on
    (a bf16 teacher would round the targets the head learns)."""
    with torch.autocast(h.device.type, enabled=False):
        return torch.softmax(h.float() @ head_w.float().T, dim=-1)


def _log_probs(out: torch.Tensor, head_w: torch.Tensor) -> torch.Tensor:
    """The head's log-probabilities over the rows of `head_w`: the product in autocast's precision (bf16 under
    ``method.mixed_precision=bf16``: most of a step's time), the normalisation in float32."""
    return torch.log_softmax((out @ head_w.T).float(), dim=-1)


def eagle_loss(head: EagleHead, s: Shifted, emb_w: torch.Tensor, head_w: torch.Tensor,
               w_reg: float = 1.0, second: float = 0.0, on: str = "all",
               noise: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The head's training loss on a :class:`Shifted` batch -> (loss, parts).

    Soft cross-entropy to the target's distribution at t+1 over the rows of `head_w` (the target's head, or its
    rows on the draft vocabulary: the target's distribution renormalised there), plus `w_reg` x smooth-L1 of the
    head's output against h_{t+1} (EAGLE's feature regression), at every real slot (`on` "all") or at the
    completion slots only (`on` "completion": where decode rounds propose; EAGLE's own loss mask covers the
    assistant's turns only); the head reads every slot before either way. With `second` > 0, plus
    `second` x the same cross-entropy of the second proposal (:meth:`EagleHead.second`, reading the head's own
    output at the slot before, gradients flowing through it): the proposal a K >= 2 round makes, trained where it
    is made rather than hoped for from the regression alone (HASS, EAGLE-3's training-time test). With `noise` > 0,
    the features the head reads (not the targets it learns) get uniform noise in [-noise, noise] (EAGLE-1's data
    augmentation: a head that tolerates features a little off, and sees each row a little differently per pass)."""
    if on not in ("all", "completion"):
        raise ValueError(f"eagle_loss: on={on!r}, expected 'all' or 'completion'")
    mask = s.valid & s.completion if on == "completion" else s.valid
    emb = F.embedding(s.next_ids, emb_w)
    h = s.h + (torch.rand_like(s.h) * 2 - 1) * noise if noise > 0 else s.h
    out, kv = head(emb, h, s.pos)
    zero = out.sum() * 0.0  # a batch without a slot to score (every completion cut off): no gradient, no NaN
    if mask.any():
        teacher = _teacher(s.h_next[mask], head_w)
        ce = -(teacher * _log_probs(out[mask], head_w)).sum(-1).mean()
        reg = F.smooth_l1_loss(out[mask].float(), s.h_next[mask])
    else:
        ce = reg = zero
    loss, parts = ce + w_reg * reg, {"ce": float(ce.detach()), "reg": float(reg.detach())}
    if second > 0:
        own = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # slot t+1 reads the output at t
        out2 = head.second(emb, own, s.pos, kv)
        # a second proposal at slot t reads the first one's output at t-1: both scored slots (slot 0 has none before)
        later = torch.zeros_like(mask)
        later[:, 1:] = mask[:, 1:] & mask[:, :-1]
        if later.any():
            teacher2 = _teacher(s.h_next[later], head_w)
            ce2 = -(teacher2 * _log_probs(out2[later], head_w)).sum(-1).mean()
        else:
            ce2 = out2.sum() * 0.0
        loss = loss + second * ce2
        parts["ce2"] = float(ce2.detach())
    return loss, parts
