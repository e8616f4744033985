"""A causal LM together with its KV cache: forward new tokens, roll the cache back exactly.

Uses the transformers 5 Cache API: the forward takes ``cache=``, and ``DynamicCache.crop(-n)``
drops the last n positions. Positions are derived by the model from the cache length, so after a
crop the next forward continues at the right position without any bookkeeping here.

This is the "hf" backend of the decode loops: any causal LM. decode/lean.py holds the "lean" one
(Llama-family models, same interface) and the choice between them.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


@functools.cache
def _takes_logits_to_keep(model_class: type) -> bool:
    """Whether the forward can skip the LM head on positions we do not need."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


class CachedModel:
    """Wraps a causal LM and one `DynamicCache`; counts forwards.

    The cache always holds keys/values for a prefix of the sequence being decoded; the caller
    feeds the tokens after that prefix and crops back after a rejection.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache(config=getattr(model, "config", None))
        self.forwards = 0
        self._keep_arg = _takes_logits_to_keep(type(model))

    def __len__(self) -> int:
        """Number of positions held in the cache."""
        return self.cache.get_seq_length()

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Run the tokens `input_ids` [1, T] after the cached prefix; return logits [keep, V] of the last `keep` positions."""
        kwargs = {"logits_to_keep": keep} if self._keep_arg else {}
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, **kwargs)
        self.forwards += 1
        return out.logits[0, -keep:]  # [keep, V]

    def crop(self, length: int) -> None:
        """Drop cached positions beyond `length` (a no-op when the cache is not longer)."""
        extra = len(self) - length
        if extra > 0:
            self.cache.crop(-extra)
