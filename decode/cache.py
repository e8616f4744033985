"""A causal LM together with its KV cache: forward new tokens, roll the cache back exactly.

Uses the transformers 5 Cache API. The forward takes the cache as ``cache=`` from transformers
5.24 on and as ``past_key_values=`` before (5.0-5.23, where ``cache=`` is silently swallowed by
``**kwargs``); :func:`cache_arg` picks the keyword from the model's forward signature, and every
forward checks that the cache grew by the tokens fed, so a cache that is not handed over raises
instead of decoding without it. ``DynamicCache.crop(-n)`` drops the last n positions (in every
5.x release). Positions are derived by the model from the cache length, so after a crop the next
forward continues at the right position without any bookkeeping here.

This is the "hf" backend of the decode loops: any causal LM. decode/lean.py holds the "lean" one
(Llama-family models, same interface), decode/runners.py the interface and the choice between them.
"""

from __future__ import annotations

import functools
import inspect

import torch
import transformers
from transformers import DynamicCache

# The transformers releases this module is tested with; pyproject.toml declares the same range
# (tests/test_transformers_compat.py checks that they agree).
SUPPORTED_TRANSFORMERS = ">=5.0,<6"
CACHE_ARGS = ("cache", "past_key_values")  # the forward's cache keyword: 5.24+, then 5.0-5.23


@functools.cache
def _forward_params(model_class: type) -> frozenset[str]:
    """Named parameters of `model_class.forward` (decorators are seen through)."""
    return frozenset(inspect.signature(model_class.forward).parameters)


@functools.cache
def _takes_logits_to_keep(model_class: type) -> bool:
    """Whether the forward can skip the LM head on positions we do not need."""
    return "logits_to_keep" in _forward_params(model_class)


@functools.cache
def cache_arg(model_class: type) -> str:
    """The keyword under which `model_class.forward` takes its KV cache.

    "cache" or "past_key_values", whichever the forward names (the first of :data:`CACHE_ARGS`
    when both are, as in 5.24+ where the old name is a deprecated alias). A forward that names
    neither (a wrapper taking ``**kwargs``) gets the installed transformers' own convention, read
    off ``LlamaForCausalLM``.
    """
    for params in (_forward_params(model_class), _forward_params(transformers.LlamaForCausalLM)):
        for name in CACHE_ARGS:
            if name in params:
                return name
    return CACHE_ARGS[0]


def cache_handoff_error(model_class: type, arg: str, fed: int, before: int, after: int) -> RuntimeError:
    """The error for a forward that did not store its `fed` new tokens in the cache it was given."""
    return RuntimeError(
        f"{model_class.__module__}.{model_class.__qualname__}.forward did not store its {fed} new token(s) in "
        f"the KV cache passed as `{arg}=` (cache length {before} -> {after}, expected {before + fed}) under "
        f"transformers {transformers.__version__}: decoding would silently run without its cache and give "
        f"wrong tokens. draftsmith supports transformers{SUPPORTED_TRANSFORMERS}; install a release in that "
        f"range (`pip install 'transformers{SUPPORTED_TRANSFORMERS}'`). If it is installed, this model class "
        f"takes its cache under another keyword or ignores it: it is not supported by the 'hf' decode backend "
        f"(for Llama-family models use backend 'lean', config key decode.backend=lean)."
    )


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
        self._cache_arg = cache_arg(type(model))

    def __len__(self) -> int:
        """Number of positions held in the cache."""
        return self.cache.get_seq_length()

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Run the tokens `input_ids` [1, T] after the cached prefix; return logits [keep, V] of the last `keep` positions.

        Raises RuntimeError (:func:`cache_handoff_error`) when the cache did not grow by T.
        """
        kwargs = {self._cache_arg: self.cache, "use_cache": True}
        if self._keep_arg:
            kwargs["logits_to_keep"] = keep
        before = len(self)
        out = self.model(input_ids=input_ids, **kwargs)
        self.forwards += 1
        after = len(self)
        if after != before + input_ids.shape[1]:  # one integer comparison: checked on every forward
            raise cache_handoff_error(type(self.model), self._cache_arg, input_ids.shape[1], before, after)
        return out.logits[0, -keep:]  # [keep, V]

    def crop(self, length: int) -> None:
        """Drop cached positions beyond `length` (a no-op when the cache is not longer)."""
        extra = len(self) - length
        if extra > 0:
            self.cache.crop(-extra)
