"""Shared fixtures: a small local tokenizer and tiny random causal LMs built from configs.

No network anywhere: models are built from a config with a fixed seed, the tokenizer from a word
list. Target and draft share the one tokenizer.
"""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Never build into (or read from) the user's demo cache from a test.
os.environ["DRAFTSMITH_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="draftsmith-test-cache-"), "cache")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
WORDS = [f"w{i}" for i in range(60)]
VOCAB = SPECIALS + WORDS  # 64 tokens
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def make_tokenizer(words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over SPECIALS + `words` (default WORDS), split on whitespace."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + (WORDS if words is None else words))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = None  # tests pass eos explicitly
    return model.eval()


def make_model(arch: str, *, seed: int = 0, layers: int = 2, hidden: int = 32, vocab_size: int = len(VOCAB)):
    """A tiny random causal LM of family `arch` ("llama", "qwen2" (q/k/v biases), "qwen3" (q/k norms), "mistral" or
    "gpt2"), float32, eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    if arch == "llama":
        config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **common)
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **common)
        model = Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = Qwen3Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                             max_position_embeddings=256, **common)
        model = Qwen3ForCausalLM(config)
    elif arch == "mistral":
        config = MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                               sliding_window=None, **common)
        model = MistralForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    # Random init gives nearly uniform logits; sharpen them so greedy choices are clear-cut
    # (no near-ties) and a random draft disagrees with the target.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return _finish(model)


def perturbed_copy(model: torch.nn.Module, scale: float, seed: int = 123) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise of relative size `scale` on every weight (a partly agreeing draft)."""
    gen = torch.Generator().manual_seed(seed)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for param in other.parameters():
            noise = torch.randn(param.shape, generator=gen) * param.std().clamp(min=1e-3)
            param.add_(scale * noise)
    return other.eval()


def save_vllm_pair(root) -> tuple:
    """A tiny Llama target and a 1-layer draft cut from a perturbed copy of it, saved with the tokenizer under
    root/target and root/draft, for a real vLLM server (hidden 128: vLLM's smallest CPU head_dim, as in
    tests/test_serving_vllm.py) -> (target dir, draft dir)."""
    tokenizer = make_tokenizer()
    target = make_model("llama", seed=0, hidden=128)
    draft = make_model("llama", seed=0, hidden=128, layers=1)
    noisy = perturbed_copy(target, 0.3).state_dict()
    draft.load_state_dict({k: v for k, v in noisy.items() if k in draft.state_dict()})
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


ARCHS = ["llama", "qwen2", "gpt2"]


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="session", params=ARCHS)
def arch(request) -> str:
    return request.param


def prompts(n: int, seed: int = 0, min_len: int = 2, max_len: int = 12) -> list[torch.Tensor]:
    """`n` random prompts [1, L] over the word tokens (no special tokens), fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        out.append(torch.randint(len(SPECIALS), len(VOCAB), (1, length), generator=gen))
    return out


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skip them, saying so, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
