"""The settings of the eval stage: the schema the pipeline's Hydra config nests.

``eval.*`` keys are :class:`EvalSettings`, ``decode.*`` keys are :class:`DecodeSettings`; each
setting is declared once, here, with its one default, and checked in ``__post_init__`` with a
message naming the key. ``eval.runner.EvalConfig`` extends both with the paths the pipeline wires
in. Light to import (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from decode.errors import check, check_choice
from decode.settings import BACKENDS


@dataclass(kw_only=True)
class DecodeSettings:
    """How eval decodes: the schema of the pipeline's ``decode.*`` keys.

    The sampling filters of the temperature > 0 cells (target and draft alike) and the cached-forward
    backend of both loops and of the cost timing (decode/lean.py).
    """

    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    backend: str = "auto"  # auto (lean where it covers the model) | lean | hf

    def __post_init__(self):
        check_choice("decode.backend", self.backend, BACKENDS)
        check(self.top_k >= 0, f"decode.top_k must be >= 0 (0 = off), got {self.top_k}")
        check(0.0 < self.top_p <= 1.0, f"decode.top_p must be in (0, 1], got {self.top_p}")


@dataclass(kw_only=True)
class EvalSettings:
    """The eval settings: the schema of the pipeline's ``eval.*`` keys (one declaration, one default)."""

    k: list[int] = field(default_factory=lambda: [2, 4])  # draft tokens per round, one cell per K
    temperature: list[float] = field(default_factory=lambda: [0.0])  # 0 = greedy; > 0: rejection sampling
    max_new_tokens: int = 64
    max_prompts: int = 8
    warmup: int = 1
    hf_ab: bool = False  # also time HF assisted generation beside draftsmith's loop (greedy cells)
    cost_repeats: int = 5

    def __post_init__(self):
        bad_k = [k for k in self.k if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        check(bool(self.k) and not bad_k, f"eval.k must be a non-empty list of integers >= 1, got {list(self.k)}")
        bad_t = [t for t in self.temperature if not t >= 0]
        check(bool(self.temperature) and not bad_t,
              f"eval.temperature must be a non-empty list of values >= 0, got {list(self.temperature)}")
        check(self.max_new_tokens >= 1, f"eval.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check(self.max_prompts >= 1, f"eval.max_prompts must be >= 1, got {self.max_prompts}")
        check(self.warmup >= 0, f"eval.warmup must be >= 0, got {self.warmup}")
        check(self.cost_repeats >= 1, f"eval.cost_repeats must be >= 1, got {self.cost_repeats}")
