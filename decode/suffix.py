"""vLLM's suffix decoding in draftsmith's loop: the same proposer the serving A/B serves as ``method: suffix``.

Arctic Inference's suffix tree over one request (its prompt, then every token it has written) is asked as vLLM 0.32
asks it (``vllm/v1/spec_decode/suffix_decoding.py`` ``SuffixDecodingProposer.propose``): the prompt starts the
request, the tokens written since the last round are added, and the last ``DEPTH`` tokens are the pattern the tree
continues, up to K tokens where their probability stays above ``MIN_TOKEN_PROB`` (none elsewhere: the round is then
a plain decode step). vLLM's defaults throughout, and no tree of other requests' responses
(decode/free.py ``vllm_config``: ``suffix_decoding_max_cached_requests: 0``), so batch 1 and the serving A/B measure
one proposer. A proposal is deterministic: as a draft distribution it is one-hot, as prompt lookup's (decode/ngram.py),
so rejection sampling keeps the target's distribution exactly.

Arctic Inference is a source package (``pip install --no-deps arctic-inference==0.3.0``: it builds its suffix-tree
extension, C++, in about a minute); it is imported only when suffix decoding is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftsmith.decode.free import SUFFIX

if TYPE_CHECKING:  # no torch at import: the config schemas read the spec strings
    import torch

DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth
SPEC_FACTOR = 1.0  # vLLM's suffix_decoding_max_spec_factor
MIN_TOKEN_PROB = 0.1  # vLLM's suffix_decoding_min_token_prob
INSTALL = "pip install --no-deps arctic-inference==0.3.0"


def suffix_cache_class():
    """Arctic Inference's ``SuffixDecodingCache``; an ImportError with the install line when it is not installed."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(f"suffix decoding needs Snowflake's Arctic Inference, which does not import here "
                          f"({exc}): {INSTALL} (a source package; it builds in about a minute)") from None
    return SuffixDecodingCache


def available() -> bool:
    """Whether Arctic Inference imports here."""
    try:
        suffix_cache_class()
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Suffix:
    """The method as the batch-1 eval holds it where a draft would be (spec string ``suffix``, decode/free.py): its
    settings are vLLM's defaults (module docstring); each decode grows its own :class:`SuffixTree`."""

    spec: str = SUFFIX


class SuffixTree:
    """One request's suffix tree: ``propose(text, k)`` -> up to `k` token ids continuing `text` (the prompt given at
    construction, then what was written: each call adds the tokens since the last one)."""

    def __init__(self, prompt: list[int]):
        self.cache = suffix_cache_class()(max_tree_depth=DEPTH, max_cached_requests=0)
        self.cache.start_request(0, list(prompt))
        self.known = len(prompt)

    def propose(self, text: "torch.Tensor", k: int) -> "torch.Tensor":
        import torch

        n = text.shape[0]
        if n > self.known:  # the tokens written since the last round (vLLM: the step's sampled ids)
            self.cache.add_active_response(0, text[self.known:].tolist())
            self.known = n
        if k <= 0:
            return torch.zeros(0, dtype=torch.long)
        # vLLM caps max_spec_tokens by the model length only; the loop's k is K, or fewer at the decode's end
        draft = self.cache.speculate(0, text[-DEPTH:].tolist(), max_spec_tokens=k, max_spec_factor=SPEC_FACTOR,
                                     min_token_prob=MIN_TOKEN_PROB)
        return torch.tensor(list(draft.token_ids), dtype=torch.long)
