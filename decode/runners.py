"""The cached-forward runners of the decode loops: their interface, and the choice between them.

A runner holds one model's KV cache for one decode (:class:`Runner`): ``forward(input_ids [1, T],
keep) -> logits [keep, V]`` of the last `keep` positions after the cached prefix, ``crop(length)``
to roll the cache back, ``len()`` (cached positions) and a ``forwards`` counter. Two of them:
"lean" (:class:`~draftsmith.decode.lean.LeanModel`: Llama-family models run by hand over
preallocated KV buffers) and "hf" (:class:`~draftsmith.decode.cache.CachedModel`: the model's own
forward with a ``DynamicCache``); :func:`make_runner` picks one for a backend name.

A reduced draft vocabulary (decode/vocab.py) is decided here, once: the lean forward computes only
the kept rows of the head (the saving), the hf forward's full logits are masked (same values, no
saving); either way :class:`RestrictedRunner` returns logits over the full width, -inf outside the
kept ids, so the loops, the sampling filters and verification are the same code with or without it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from draftsmith.decode.cache import CachedModel
from draftsmith.decode.lean import LeanModel, lean_unsupported, unsupported_error
from draftsmith.decode.settings import BACKENDS  # the choices of make_runner's backend
from draftsmith.decode.vocab import check_vocab, scatter_logits


class Runner(Protocol):
    """One model with its KV cache, as the decode loops and the cost timing drive it."""

    forwards: int  # forward calls so far

    def __len__(self) -> int: ...

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor: ...

    def crop(self, length: int) -> None: ...


class RestrictedRunner:
    """A runner whose logits keep only the token ids `ids`: [keep, width], -inf at every other id.

    Args:
        runner: the runner of the model.
        ids: sorted, distinct LongTensor of the kept ids (decode/vocab.py's check_vocab).
        width: the model's logit width (:func:`logit_width`).
        sliced: `runner` computes only the kept rows of its head (logits [keep, len(ids)]: the lean
            forward); otherwise its full logits [keep, width] are masked (the hf forward).
    """

    def __init__(self, runner: Runner, ids: torch.Tensor, width: int, sliced: bool):
        self.runner = runner
        self.ids = ids
        self.width = width
        self.sliced = sliced

    def __len__(self) -> int:
        return len(self.runner)

    @property
    def forwards(self) -> int:
        return self.runner.forwards

    def crop(self, length: int) -> None:
        self.runner.crop(length)

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        logits = self.runner.forward(input_ids, keep)  # [keep, len(ids)] when sliced, else [keep, width]
        return scatter_logits(logits if self.sliced else logits[:, self.ids], self.ids, self.width)  # [keep, width]


def make_runner(model: torch.nn.Module, backend: str = "auto", capacity: int = 256,
                vocab: torch.Tensor | None = None) -> Runner:
    """The cached-forward runner for `model`.

    Args:
        backend: "lean" (:class:`LeanModel`, a ConfigError if it does not cover the model), "hf" (the
            model's own forward with a ``DynamicCache``) or "auto" (lean when covered, else hf).
        capacity: positions the lean forward preallocates (it grows when a decode needs more).
        vocab: optional token ids (decode/vocab.py): logits are -inf outside them; the lean forward
            computes only their head rows, the hf one masks its full logits (same values, no saving).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    reason = None if backend == "hf" else lean_unsupported(model)  # walks every module: done once per runner
    if backend == "lean" and reason is not None:
        raise unsupported_error(reason)
    lean = backend != "hf" and reason is None
    ids = None if vocab is None else check_vocab(vocab, logit_width(model))
    if not lean:
        runner = CachedModel(model)
        return runner if ids is None else RestrictedRunner(runner, ids, logit_width(model), sliced=False)
    runner = LeanModel(model, capacity, check=False, rows=ids)  # the reduced head: only the kept rows
    return runner if ids is None else RestrictedRunner(runner, runner.rows, logit_width(model), sliced=True)


def logit_width(model: torch.nn.Module) -> int:
    """Number of logits the model produces (rows of its output embedding)."""
    return model.get_output_embeddings().weight.shape[0]


def runner_name(runner: Runner) -> str:
    """'lean' or 'hf': which forward `runner` runs (through a reduced vocabulary)."""
    inner = runner.runner if isinstance(runner, RestrictedRunner) else runner
    return "lean" if isinstance(inner, LeanModel) else "hf"
