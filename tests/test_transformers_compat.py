"""The "hf" backend hands its KV cache over under the name the installed transformers accepts.

transformers 5.24 renamed the forward's cache keyword from ``past_key_values`` to ``cache``; before
that, ``cache=`` is swallowed by ``**kwargs`` and the model silently runs without the cache. Both
conventions are emulated here on the installed release with subclasses of a tiny Llama that take the
cache under one keyword only and drop the other (exactly what 5.19 does with ``cache=``), so these
tests run under any 5.x. The lowest supported release itself is tested by .ci/run (README, Set-up).
"""

import inspect
import re
from pathlib import Path

import pytest
import torch
import transformers
from packaging.specifiers import SpecifierSet
from transformers import LlamaForCausalLM

from conftest import make_model, perturbed_copy, prompts
from draftsmith.decode import autoregressive_generate, speculative_generate
from draftsmith.decode.cache import CachedModel

# the keyword the installed LlamaForCausalLM takes its cache under
NATIVE = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
MAX_NEW = 12


class PastKeyValuesLlama(LlamaForCausalLM):
    """A transformers 5.0-5.23 style forward: the cache is `past_key_values`; `cache=` is swallowed."""

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
        kwargs.pop("cache", None)  # what **kwargs does with an unknown keyword in 5.19
        return super().forward(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
                               **{NATIVE: past_key_values}, **kwargs)


class CacheLlama(LlamaForCausalLM):
    """A transformers 5.24+ style forward (after the deprecated alias is gone): `cache` only."""

    def forward(self, input_ids=None, cache=None, use_cache=None, logits_to_keep=0, **kwargs):
        kwargs.pop("past_key_values", None)
        return super().forward(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
                               **{NATIVE: cache}, **kwargs)


class CacheIgnoringLlama(LlamaForCausalLM):
    """Names both keywords and uses neither: the model builds a fresh cache of its own every call."""

    def forward(self, input_ids=None, cache=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
        return super().forward(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)


def as_class(model: LlamaForCausalLM, cls: type, seed: int = 0) -> LlamaForCausalLM:
    """A `cls` instance with `model`'s config and weights (same logits, other forward signature)."""
    torch.manual_seed(seed)
    other = cls(model.config)
    other.load_state_dict(model.state_dict())
    other.generation_config = model.generation_config
    return other.eval()


@pytest.fixture(scope="module")
def llama():
    """A tiny Llama target, a partly agreeing draft, prompts and the target's greedy outputs (HF generate)."""
    target = make_model("llama", seed=0, layers=2)
    draft = perturbed_copy(target, 0.15)
    ps = prompts(4, seed=3)
    refs = [target.generate(p, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0) for p in ps]
    return target, draft, ps, refs


def test_cache_keyword_follows_the_forward_signature():
    from draftsmith.decode.cache import cache_arg  # absent before the fix

    assert cache_arg(PastKeyValuesLlama) == "past_key_values"
    assert cache_arg(CacheLlama) == "cache"
    assert cache_arg(LlamaForCausalLM) == NATIVE  # 5.24+ names both ("past_key_values" deprecated): "cache" wins


def test_the_old_keyword_is_silently_swallowed(llama):
    """The failure being guarded against: `cache=` into a past_key_values forward leaves the cache empty
    and the next token is computed as if the prompt were not there (a wrong logit, no error)."""
    target, _, ps, _ = llama
    model, prompt = as_class(target, PastKeyValuesLlama), ps[0]
    with torch.inference_mode():
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=prompt[:, :-1], cache=cache, use_cache=True)
        step = model(input_ids=prompt[:, -1:], cache=cache, use_cache=True).logits[0, -1]
        full = model(input_ids=prompt).logits[0, -1]
    assert cache.get_seq_length() == 0
    assert not torch.allclose(step, full, atol=1e-4)


@pytest.mark.parametrize("cls", [PastKeyValuesLlama, CacheLlama])
def test_greedy_output_is_the_targets_under_either_cache_keyword(llama, cls):
    """Before the fix the "hf" backend passed `cache=` only: wrong tokens for a past_key_values forward."""
    target, draft, ps, refs = llama
    model, drafter = as_class(target, cls), as_class(draft, cls)
    for p, ref in zip(ps, refs):
        out = autoregressive_generate(model, p, max_new_tokens=MAX_NEW, backend="hf")
        assert torch.equal(out.sequences, ref), f"{cls.__name__}: autoregressive, prompt={p.tolist()}"
        for k in (1, 3):
            out = speculative_generate(model, drafter, p, k=k, max_new_tokens=MAX_NEW, backend="hf")
            assert torch.equal(out.sequences, ref), f"{cls.__name__}: speculative k={k}, prompt={p.tolist()}"
            assert out.stats.backend == out.stats.draft_backend == "hf"


def test_a_forward_that_drops_the_cache_raises_a_clear_error(llama):
    target, draft, ps, _ = llama
    model = as_class(target, CacheIgnoringLlama)
    pattern = rf"CacheIgnoringLlama\.forward did not store .*transformers {re.escape(transformers.__version__)}.*pip install"
    with pytest.raises(RuntimeError, match=pattern):
        autoregressive_generate(model, ps[0], max_new_tokens=MAX_NEW, backend="hf")
    with pytest.raises(RuntimeError, match=pattern):  # as the target: caught at its first forward too
        speculative_generate(model, as_class(draft, PastKeyValuesLlama), ps[0], k=3, max_new_tokens=MAX_NEW, backend="hf")
    runner = CachedModel(model)
    with pytest.raises(RuntimeError, match=r"cache length 0 -> 0, expected 2"):
        runner.forward(ps[0][:, :2], keep=1)


def test_declared_transformers_range_is_the_supported_one():
    """pyproject.toml declares the range decode/cache.py names in its error, and the installed release is in it."""
    from draftsmith.decode.cache import SUPPORTED_TRANSFORMERS

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    declared = re.search(r'"transformers([^"]*)"', pyproject).group(1)
    assert declared == SUPPORTED_TRANSFORMERS
    assert transformers.__version__ in SpecifierSet(declared), f"installed {transformers.__version__}, declared {declared}"


def test_ci_tests_the_lowest_declared_transformers():
    """The README's lowest-version command pins pyproject.toml's lower bounds (transformers and torch), and .ci/run
    runs it verbatim."""
    from draftsmith.decode.cache import SUPPORTED_TRANSFORMERS

    root = Path(__file__).resolve().parent.parent
    lowest = re.match(r">=([0-9.]+),", SUPPORTED_TRANSFORMERS).group(1)
    commands = [line for line in (root / "README.md").read_text().splitlines() if ".venv-lowest" in line and "pytest" in line]
    assert len(commands) == 1, "README.md: one command that tests the lowest transformers (Set-up)"
    pinned = re.search(r"'transformers==([0-9.]+)'", commands[0]).group(1)
    assert [int(x) for x in pinned.split(".")][:2] == [int(x) for x in lowest.split(".")][:2]
    torch_lowest = re.search(r'"torch>=([0-9.]+)"', (root / "pyproject.toml").read_text()).group(1)
    torch_pins = set(re.findall(r"torch==([0-9.]+)", commands[0]))
    assert len(torch_pins) == 1, "one torch release in the lowest-version command (pinned again where pip resolves)"
    assert [int(x) for x in torch_pins.pop().split(".")][:2] == [int(x) for x in torch_lowest.split(".")][:2]
    assert commands[0] in (root / ".ci/run").read_text()
    assert "tests/test_greedy_equivalence.py" in commands[0]
    assert "tests/test_suffix_loop.py" in commands[0] and "arctic-inference" in commands[0]  # suffix decoding's equality
