"""Speculation with nothing to train, named by a spec string where a draft's folder would be.

- ``ngram`` / ``ngram:MIN-MAX``: prompt lookup (decode/ngram.py), vLLM's ``method: ngram``; draftsmith's loop runs
  it too, so both the batch-1 eval (``eval.baselines``) and the serving A/B (``serve.baselines``) measure it.
- ``suffix``: vLLM's suffix decoding (``method: suffix``, Arctic Inference's suffix tree over each request's
  prompt and what it has written; it proposes up to K tokens where the tree says a continuation is likely, none
  elsewhere). It needs the ``arctic-inference`` package: beside vLLM for the serving A/B, in draftsmith's
  environment for the batch-1 eval (decode/suffix.py asks the tree as vLLM does).

The spec strings stand in serving.json's ``drafts`` and a registry version's ``training_free`` as text.
"""

from __future__ import annotations

from draftsmith.decode.ngram import is_ngram_spec, parse_ngram

SUFFIX = "suffix"


def is_suffix_spec(text) -> bool:
    """Whether `text` names vLLM's suffix decoding."""
    return isinstance(text, str) and text == SUFFIX


def is_free_spec(text) -> bool:
    """Whether `text` names a training-free method (rather than a draft's folder)."""
    return is_ngram_spec(text) or is_suffix_spec(text)


def canonical(text: str, key: str = "the proposer") -> str:
    """The method's one spec string (``ngram`` and ``ngram:2-4`` are one method); a ValueError naming `key` for
    anything that is not a training-free method."""
    if is_suffix_spec(text):
        return SUFFIX
    return parse_ngram(text, key=key).spec


def method(text: str) -> str:
    """vLLM's speculative ``method`` for the spec string `text`."""
    return SUFFIX if is_suffix_spec(text) else "ngram"


def vllm_config(text: str, k: int) -> dict:
    """vLLM's ``--speculative-config`` for the method `text` proposing up to `k` tokens per step.

    Suffix decoding keeps vLLM's defaults for its trees (depth 24, min token probability 0.1) but not its global
    tree of past responses (``suffix_decoding_max_cached_requests``, 10000 by default): the serving A/B sends the same
    prompts at every level and pass, greedy, so that tree would hold each request's exact answer from the time
    before and measure a replay, not the traffic. Each request's own tree (its prompt and what it has written so far)
    stays, as prompt lookup's window does."""
    if is_suffix_spec(text):
        return {"method": SUFFIX, "num_speculative_tokens": int(k), "suffix_decoding_max_cached_requests": 0}
    return parse_ngram(text).vllm_config(k)


def recordable(text: str) -> bool:
    """Whether promotion may record the method as a registry version ("no draft needed"): prompt lookup. Suffix
    decoding is measured (batch 1 and vLLM) and may refuse a draft, but is not recorded: the configuration it is
    measured in (no tree of past responses, for the A/B's replayed prompts: :func:`vllm_config`) is not the one a
    team would serve, and a version serving it would need Arctic Inference wherever it is measured again."""
    return is_ngram_spec(text)
