"""The token ids that end a completion: the one resolver of EOS, for the loops, datagen and eval.

A model's generation config names its EOS (``eos_token_id``: an id or a list, as in Llama 3's
``[128001, 128009]``); when it names none, the tokenizer's EOS token ends a completion. The decode
loops and HF ``generate`` take the id or list as it is (:func:`eos_token_id`); datagen trims
completions at the first token of the set (:func:`eos_ids`).
"""

from __future__ import annotations

from pathlib import Path


def eos_token_id(generation_config, tokenizer=None) -> int | list[int] | None:
    """EOS id(s) from `generation_config` (None: a model without one), else `tokenizer`'s (when given)."""
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return eos


def as_id_list(eos: int | list[int] | None) -> list[int]:
    """An EOS as the loops and ``generate`` take it (an id, a list of ids, or None) as a list of ids ([] for None)."""
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def eos_ids(generation_config, tokenizer) -> set[int]:
    """:func:`eos_token_id` as a set of ids (empty when neither names an EOS)."""
    return set(as_id_list(eos_token_id(generation_config, tokenizer)))


def pretrained_eos_ids(path: str | Path, tokenizer) -> set[int]:
    """:func:`eos_ids` of the model at `path` (a directory or hub id) without loading its weights: its generation
    config as ``from_pretrained`` builds it (generation_config.json, else derived from config.json)."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return eos_ids(generation_config, tokenizer)


def trim_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """(`tokens` up to and including the first EOS, whether there was one): where a completion ends, for both engines
    and for given responses."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), None)
    return (tokens[:end], True) if end is not None else (list(tokens), False)
