"""The speculative decoding engine: model pairs, sampling, verification, KV-cache rollback, loops,
and a lean cached forward for Llama-family models (decode/lean.py).

No hydra, no wandb: plain functions on models and tensors. The names below are imported on first
use, so that light modules of this package (``decode.errors``, ``decode.settings``) load without
torch (the command line and config schemas import them).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "autoregressive_generate": "decode.loop",
    "speculative_generate": "decode.loop",
    "ModelPair": "decode.pair",
    "PairError": "decode.pair",
    "check_tokenizers": "decode.pair",
    "load_pair": "decode.pair",
    "DecodeStats": "decode.stats",
    "GenerateOutput": "decode.stats",
    "SpeculativeStats": "decode.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'decode' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
