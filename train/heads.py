"""Where a training forward runs the draft's output head: only at the loss positions, and (with
``method.reduced_head``) only over the draft vocabulary's rows.

The head of a large-vocabulary draft is most of its cost (SmolLM2-135M's 2-layer draft: a 49152 x
576 matrix against 2 decoder layers). Two cuts, both exact:
- the prompt positions, usually most of a row, need no logits (:func:`head_at_loss_positions`);
- a draft that will propose only from a reduced vocabulary (``eval.draft_vocab``: the runners give
  -inf logits outside its ids) need not score the other rows either (:func:`reduced_head`). Training
  on the same ids puts the draft's mass where it will propose: its softmax is over those ids, and
  the teacher is renormalised over them (:func:`restrict`), so the loss is the full-head loss with
  the student's logits masked outside the set (tests/test_train_reduced_head.py).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from draftsmith.artifacts.errors import ConfigError


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """`model` without its DDP-style ``.module`` wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


@contextlib.contextmanager
def head_at_loss_positions(model: torch.nn.Module, mask: torch.Tensor):
    """Within the block, `model`'s output head runs only at the loss positions: logits come out [1, N, V].

    A forward pre-hook on ``get_output_embeddings()`` selects the hidden states at ``mask``
    (position i of [B, T-1] predicts token i+1) before the head, for any model family and through
    PEFT and accelerate wrappers.
    """
    head = unwrap(model).get_output_embeddings()

    def select(module, args):
        hidden = args[0]
        return (hidden[:, :-1][mask.to(hidden.device)].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def reduced_head(model: torch.nn.Module, ids: torch.Tensor | None):
    """Within the block, `model`'s output head computes only the rows `ids` (logits [..., len(ids)], column j
    for token ``ids[j]``); gradients reach those rows only. ``ids=None``: the full head, unchanged."""
    if ids is None:
        yield
        return
    head = unwrap(model).get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ConfigError(f"method.reduced_head needs the draft's output head to be a Linear layer; it is "
                        f"{type(head).__name__}: set method.reduced_head=false")

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        bias = head.bias[ids] if head.bias is not None else None
        return F.linear(hidden, head.weight[ids], bias)

    head.forward = forward  # an instance attribute: nn.Module.__call__ runs it after the pre-hooks
    try:
        yield
    finally:
        del head.forward


def restrict(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-probs [N, V] -> [N, len(ids)] renormalised over `ids`: the teacher a reduced-head draft can match."""
    sub = logp[:, ids]
    return sub - torch.logsumexp(sub, -1, keepdim=True)


def positions_in(ids: torch.Tensor, tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Column of each of `tokens` in the sorted vocabulary `ids`, -1 for a token outside it."""
    lookup = torch.full((width,), -1, dtype=torch.long, device=ids.device)
    lookup[ids] = torch.arange(ids.numel(), device=ids.device)
    return lookup[tokens.clamp(0, width - 1)].masked_fill(tokens >= width, -1)
