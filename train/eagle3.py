"""Training an EAGLE-3 head (decode/eagle3.py) on the target's features at three layers, with the training-time test.

- :func:`target_aux_rows`: one teacher-forced forward of the target per batch of rows -> per row its token ids, the
  residual stream entering the head's three layers (``aux``), its final post-norm features (``h``: what its head
  reads, the teacher) and, for the rows the held-out figures read, its argmax;
- :func:`shifted3`: a batch of those rows laid out for the head (slot t: the token x_{t+1}, the features at t, the
  teacher's features and argmax at t+1);
- :func:`eagle3_loss`: the training-time test's loss — the head unrolled ``steps`` times (EAGLE-3, arXiv
  2503.01840, section 3.2; decode/eagle3.py ``Eagle3Head.ttt``), each step scored against the target's
  distribution at the same slot (restricted to the draft vocabulary), step j weighted ``decay**j`` (SpecForge's
  and EAGLE-3's 0.8);
- :func:`heldout_metrics`: the head's agreement with the target per unrolled position and the expected acceptance
  length it implies (sum over k of the probability that proposals 1..k are all accepted, greedy).

The train stage runs them for ``method.finetune=eagle3`` (train/eagle3_objective.py ``Eagle3Objective``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from draftsmith.decode.eagle3 import Eagle3Head, target_aux_features
from draftsmith.train.eagle import padded_batches


@torch.no_grad()
def target_aux_rows(target: torch.nn.Module, rows: list[tuple[list[int], list[int]]], layers: list[int],
                    batch: int = 16, top: bool = True) -> list[dict]:
    """Teacher-forced features of (prompt_ids, completion_ids) rows -> per row, in order: ``ids`` [L], ``aux``
    [L, 3H] (the stream entering each of `layers`), ``h`` [L, H] (final post-norm), with `top` ``top`` [L] (the
    target's argmax over its full head: the held-out figures read it, the loss does not) and ``prompt_len``. Rows
    are batched by length, right-padded (causal: padding never reaches a real position)."""
    out: list[dict | None] = [None] * len(rows)
    head_w = target.get_output_embeddings().weight
    for idx, ids, mask in padded_batches(rows, batch, head_w.device):
        aux, hs = target_aux_features(target, ids, mask, layers)
        argmax = F.linear(hs, head_w).argmax(-1) if top else None
        for j, i in enumerate(idx):
            length = int(mask[j].sum())
            out[i] = {"ids": ids[j, :length].cpu(), "aux": aux[j, :length].cpu(), "h": hs[j, :length].cpu(),
                      "prompt_len": len(rows[i][0])}
            if top:
                out[i]["top"] = argmax[j, :length].cpu()
    return out  # type: ignore[return-value]


@dataclass
class Shifted3:
    """Feature rows laid out for the head, slot t of a row of length L (t < L-1): the input token x_{t+1}
    (``next_ids``), the target's features at t (``aux``), its final features at t+1 (``h_next``: the teacher) and
    argmax at t+1 (``top_next``: its choice of x_{t+2}; -1 for rows without ``top``, the training
    rows); ``valid`` marks real slots, ``completion`` the slots a
    decode round's first proposal is made from (t >= P-1 for a prompt of P tokens)."""

    next_ids: torch.Tensor
    aux: torch.Tensor
    h_next: torch.Tensor
    top_next: torch.Tensor
    valid: torch.Tensor
    completion: torch.Tensor
    pos: torch.Tensor

    def to(self, device) -> "Shifted3":
        return Shifted3(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def shifted3(items: list[dict]) -> Shifted3:
    """:class:`Shifted3` of :func:`target_aux_rows` rows (right-padded to the longest)."""
    n = max(len(it["ids"]) for it in items) - 1
    b = len(items)
    a_width, h_width = items[0]["aux"].shape[-1], items[0]["h"].shape[-1]
    s = Shifted3(next_ids=torch.zeros(b, n, dtype=torch.long), aux=torch.zeros(b, n, a_width),
                 h_next=torch.zeros(b, n, h_width), top_next=torch.full((b, n), -1, dtype=torch.long),
                 valid=torch.zeros(b, n, dtype=torch.bool), completion=torch.zeros(b, n, dtype=torch.bool),
                 pos=torch.arange(n).unsqueeze(0).expand(b, n))
    for j, it in enumerate(items):
        length = len(it["ids"]) - 1
        s.next_ids[j, :length] = it["ids"][1:]
        s.aux[j, :length] = it["aux"][:-1]
        s.h_next[j, :length] = it["h"][1:]
        if "top" in it:  # the held-out rows' (target_aux_rows top=True); -1 elsewhere
            s.top_next[j, :length] = it["top"][1:]
        s.valid[j, :length] = True
        s.completion[j, max(0, it["prompt_len"] - 1):length] = True
    return s


def chain_mask(base: torch.Tensor, j: int) -> torch.Tensor:
    """[B, T] slots s where step j has a chain: `base` at s and at s-j (the slot whose real features start it)."""
    if j == 0:
        return base
    out = torch.zeros_like(base)
    out[:, j:] = base[:, j:] & base[:, :-j]
    return out


@torch.no_grad()
def teacher_probs(h: torch.Tensor, head_w: torch.Tensor) -> torch.Tensor:
    """The target's distribution over the rows of `head_w` (the draft vocabulary's) at final features `h`, in
    float32 whatever autocast is on."""
    with torch.autocast(h.device.type, enabled=False):
        return torch.softmax(h.float() @ head_w.float().T, dim=-1)


def eagle3_loss(head: Eagle3Head, s: Shifted3, emb_w: torch.Tensor, full_w: torch.Tensor, steps: int,
                decay: float = 0.8, on: str = "completion", forward=None) -> tuple[torch.Tensor, dict]:
    """The training-time test's loss on a :class:`Shifted3` batch -> (loss, parts).

    Sum over steps j = 0..steps-1 of ``decay**j`` x the soft cross-entropy of step j's proposal (its logits over
    the draft vocabulary) to the target's distribution at the slot's next position, renormalised over the draft
    vocabulary, at the slots where step j has a chain (:func:`chain_mask` over the completion's slots, or every
    real slot with `on` "all"). `emb_w`: the target's input embedding; `full_w`: its output head (the teacher);
    `forward`: what runs the head's forward (a data-parallel wrapper of `head`; default `head` itself)."""
    if on not in ("all", "completion"):
        raise ValueError(f"eagle3_loss: on={on!r}, expected 'all' or 'completion'")
    emb = F.embedding(s.next_ids, emb_w)
    if on == "completion" and bool((s.valid & s.completion).any()):  # every step scored there: run it there only
        window, s_w = completion_window(s)
        outs = (forward or head)(s.aux, emb, s.pos, steps, window)
        return ttt_loss(head, outs, s_w, full_w, decay, on)
    outs = (forward or head)(s.aux, emb, s.pos, steps)
    return ttt_loss(head, outs, s, full_w, decay, on)


def completion_window(s: Shifted3) -> tuple[torch.Tensor, Shifted3]:
    """(window [B, W], the batch at those slots) of the completions' slots: row b's W consecutive slots from its
    first completion slot (W the longest completion; a shorter row's extra slots repeat its last and are neither
    valid nor completion in the windowed batch). Chains stay inside it: step j's chain at slot s starts at s - j,
    a completion slot too (:func:`chain_mask`)."""
    base = s.valid & s.completion
    length = base.sum(1)
    start = base.float().argmax(1)  # the first completion slot (0 for a row without one: length 0)
    width = int(length.max())
    offsets = torch.arange(width, device=base.device)
    window = (start[:, None] + offsets[None]).clamp(max=base.shape[1] - 1)
    inside = offsets[None] < length[:, None]

    def at(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, window) if x.dim() == 2 else x.gather(1, window[..., None].expand(-1, -1, x.shape[-1]))

    return window, Shifted3(next_ids=at(s.next_ids), aux=at(s.aux), h_next=at(s.h_next), top_next=at(s.top_next),
                            valid=at(s.valid) & inside, completion=at(s.completion) & inside, pos=at(s.pos))


def ttt_loss(head: Eagle3Head, outs: list[torch.Tensor], s: Shifted3, full_w: torch.Tensor, decay: float,
             on: str) -> tuple[torch.Tensor, dict]:
    """:func:`eagle3_loss` of the unrolled steps' outputs `outs` (``Eagle3Head.ttt``'s). The teacher is computed
    once, at every slot a step scores (each step's chain slots are a subset of step 0's), in float32: the head's
    product over the draft vocabulary is most of a step, and the teacher is one such product per step otherwise."""
    base = s.valid & s.completion if on == "completion" else s.valid
    # a batch without a scored slot: zero, with every parameter in the graph (a data-parallel reducer waits for the
    # gradients of the final norm and head too, which only the logits below use)
    loss = outs[0].sum() * 0.0 + (head.norm.sum() + head.lm_head.sum()) * 0.0
    parts = {}
    if not base.any():
        return loss, {f"ce{j + 1}": 0.0 for j in range(len(outs))}
    p_all = teacher_probs(s.h_next[base], full_w[head.vocab])  # [N0, Vd] at step 0's slots, row-major
    index = torch.full(base.shape, -1, dtype=torch.long, device=base.device)
    index[base] = torch.arange(int(base.sum()), device=base.device)
    for j, out in enumerate(outs):
        m = chain_mask(base, j)
        if not m.any():
            parts[f"ce{j + 1}"] = 0.0
            continue
        p = p_all[index[m]]
        ce = -(p * torch.log_softmax(head.logits(out[m]).float(), dim=-1)).sum(-1).mean()
        loss = loss + decay ** j * ce
        parts[f"ce{j + 1}"] = float(ce.detach())
    return loss, parts


@torch.no_grad()
def heldout_metrics(head: Eagle3Head, items: list[dict], emb_w: torch.Tensor, full_w: torch.Tensor, steps: int,
                    batch_size: int, decay: float = 0.8, on: str = "completion") -> dict:
    """Held-out figures of `head` on :func:`target_aux_rows` rows, at the completion's slots (where rounds start):
    the loss; ``top1_agreement`` (the first proposal is the target's argmax); ``expected_acceptance`` (sum
    min(p, q) of the first proposal, p the target's full distribution); ``agreement_at_j`` (proposal j is the
    target's argmax given proposals 1..j-1 were: what greedy decoding accepts at position j) and
    ``acceptance_length`` (sum over k <= steps of P(proposals 1..k all accepted): accepted tokens per round of
    K = steps, the bonus token not counted)."""
    if any("top" not in it for it in items):
        raise ValueError("held-out figures need the target's argmax: compute these rows with target_aux_rows(top=True)")
    was_training = head.training
    head.eval()
    device = emb_w.device
    loss_sum = batches = 0.0
    overlap, first = 0.0, 0
    chained = [0] * steps  # rounds whose proposals 1..j+1 were all right
    rounds = [0] * steps  # rounds with a slot for proposal j+1
    for start in range(0, len(items), batch_size):
        s = shifted3(items[start:start + batch_size]).to(device)
        outs = head(s.aux, F.embedding(s.next_ids, emb_w), s.pos, steps)
        loss, _ = ttt_loss(head, outs, s, full_w, decay, on)
        loss_sum, batches = loss_sum + float(loss), batches + 1
        start_ok = s.valid & s.completion  # slots a round starts from
        ok_all = start_ok.clone()
        # a chain reads the row's tokens; greedy decoding reads its own accepted proposals, the target's argmax:
        # from step 1 on, a slot counts only where the row's token there is the target's argmax (rows the target
        # wrote greedily: every slot; sampled or given responses: where they agree)
        greedy_token = torch.zeros_like(s.valid)
        greedy_token[:, 1:] = s.next_ids[:, 1:] == s.top_next[:, :-1]
        for j, out in enumerate(outs):
            logits = head.logits(out)
            ok = (head.vocab[logits.argmax(-1)] == s.top_next) & s.valid  # [B, T]: step j right at slot
            if j:
                ok &= greedy_token
            if j == 0:
                q = torch.softmax(logits[start_ok].float(), -1)
                p = torch.softmax(s.h_next[start_ok] @ full_w.T, -1)[:, head.vocab]
                overlap += float(torch.minimum(p, q).sum())
                first += int(start_ok.sum())
            # round r's proposal j+1 is step j at slot r+j
            shifted_ok = torch.zeros_like(ok)
            shifted_ok[:, : ok.shape[1] - j] = ok[:, j:]
            has = torch.zeros_like(ok)
            has[:, : ok.shape[1] - j] = s.valid[:, j:]
            ok_all = ok_all & shifted_ok
            rounds[j] += int((start_ok & has).sum())
            chained[j] += int((ok_all & has).sum())
    head.train(was_training)
    reach = [chained[j] / max(rounds[j], 1) for j in range(steps)]  # P(proposals 1..j+1 all right)
    out = {"heldout/loss": loss_sum / max(batches, 1), "heldout/top1_agreement": reach[0],
           "heldout/expected_acceptance": overlap / max(first, 1), "heldout/acceptance_length": sum(reach),
           "heldout/positions": first}
    for j in range(steps):
        out[f"heldout/agreement_at_{j + 1}"] = reach[j] / reach[j - 1] if j and reach[j - 1] > 0 else \
            (reach[0] if j == 0 else 0.0)
    return out
