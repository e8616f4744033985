"""The speculative decoding engine: model pairs, sampling, verification, KV-cache rollback, loops,
and a lean cached forward for Llama-family models (decode/lean.py).

No hydra, no wandb: plain functions on models and tensors.
"""

from decode.loop import autoregressive_generate, speculative_generate
from decode.pair import ModelPair, PairError, check_tokenizers, load_pair
from decode.stats import DecodeStats, GenerateOutput, SpeculativeStats

__all__ = [
    "DecodeStats",
    "GenerateOutput",
    "ModelPair",
    "PairError",
    "SpeculativeStats",
    "autoregressive_generate",
    "check_tokenizers",
    "load_pair",
    "speculative_generate",
]
