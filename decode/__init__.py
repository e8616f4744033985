"""The speculative decoding engine: model pairs, sampling, verification, KV-cache rollback, loops,
and a lean cached forward for Llama-family models (decode/lean.py).

No hydra, no wandb: plain functions on models and tensors. The names below are imported on first
use, so that light modules of this package (``draftsmith.artifacts.errors``, ``decode.settings``) load without
torch (the command line and config schemas import them).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "autoregressive_generate": "draftsmith.decode.loop",
    "speculative_generate": "draftsmith.decode.loop",
    "eagle_generate": "draftsmith.decode.loop",
    "EagleHead": "draftsmith.decode.eagle",
    "load_eagle": "draftsmith.decode.eagle",
    "eagle3_generate": "draftsmith.decode.loop",
    "ngram_generate": "draftsmith.decode.loop",
    "suffix_generate": "draftsmith.decode.loop",
    "NGram": "draftsmith.decode.ngram",
    "Eagle3Head": "draftsmith.decode.eagle3",
    "load_eagle3": "draftsmith.decode.eagle3",
    "save_eagle3": "draftsmith.decode.eagle3",
    "ModelPair": "draftsmith.decode.pair",
    "PairError": "draftsmith.decode.pair",
    "check_tokenizers": "draftsmith.decode.pair",
    "load_pair": "draftsmith.decode.pair",
    "DecodeStats": "draftsmith.decode.stats",
    "GenerateOutput": "draftsmith.decode.stats",
    "SpeculativeStats": "draftsmith.decode.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'draftsmith.decode' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
