"""The lean cached forward (decode/lean.py) computes the HF model's logits, and refuses what it does not cover."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

from conftest import make_model, perturbed_copy, prompts
from draftsmith.decode import autoregressive_generate, speculative_generate
from draftsmith.decode.cache import CachedModel
from draftsmith.decode.lean import LeanModel, lean_unsupported
from draftsmith.decode.runners import make_runner
from draftsmith.decode.timing import cost_ratios

V = 64


def _llama(**extra):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, **extra)
    return LlamaForCausalLM(config).eval()


def _qwen3():
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    return Qwen3ForCausalLM(config).eval()


def _mistral():
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                           sliding_window=None)
    return MistralForCausalLM(config).eval()


MODELS = {
    "llama-gqa": lambda: make_model("llama", vocab_size=V),
    "qwen2-bias": lambda: make_model("qwen2", vocab_size=V),
    "qwen3-qk-norm": _qwen3,
    "mistral-mqa": _mistral,
    "llama-bias-llama3-rope": lambda: _llama(attention_bias=True, mlp_bias=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-bf16": lambda: _llama().to(torch.bfloat16),
}

def grouped_attention_is_exact() -> bool:
    """Whether this torch's scaled_dot_product_attention rounds grouped keys (enable_gqa, as the lean forward passes
    them) with a mask as it rounds the keys repeated per head (transformers' path whenever it passes a mask: a block
    after a prefix). torch 2.13 does, bit for bit; torch 2.5.1's grouped path with a mask rounds differently (logits
    within ~1e-6 of each other)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 5, 8, generator=gen) for n in (4, 2, 2))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    grouped = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    repeated = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask)
    return torch.equal(grouped, repeated)


def test_grouped_attention_is_exact_on_the_torch_ci_installs_first():
    """Where torch is 2.13 or later (README's test command), the bitwise claim below is not relaxed."""
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version >= (2, 13):
        assert grouped_attention_is_exact()


# (tokens fed, logits kept) or ("crop", length): prefill, single steps, a verify block, rollbacks,
# and enough tokens to outgrow the initial capacity of 16 (the buffers are reallocated).
SCRIPT = [(0, 9, 2), (9, 10, 1), (10, 15, 5), ("crop", 12), (12, 13, 1), (13, 18, 5), ("crop", 13),
          (13, 30, 3), (30, 31, 1), ("crop", 29), (29, 34, 5)]


@pytest.mark.parametrize("block_product", ["weight-first", "padded", "as-nn-linear", "measured"])
@pytest.mark.parametrize("name", list(MODELS))
def test_lean_logits_equal_hf_logits(name, block_product):
    """Bitwise equal with nn.Linear's product for blocks (the non-CPU path) where torch's attention rounds grouped
    keys as repeated ones (grouped_attention_is_exact); equal up to float rounding with the CPU's W @ x^T block
    product, and with nn.Linear's on a torch whose grouped attention rounds otherwise."""
    model = MODELS[name]()
    assert lean_unsupported(model) is None
    ids = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(3))
    hf, lean = CachedModel(model), LeanModel(model, capacity=16)
    assert lean.block_form is None  # CPU default: the fastest form per block size, measured
    lean.block_form = {"weight-first": "weight-first", "padded": "padded", "as-nn-linear": "F.linear",
                       "measured": None}[block_product]
    with torch.inference_mode():
        for step in SCRIPT:
            if step[0] == "crop":
                hf.crop(step[1])
                lean.crop(step[1])
                assert len(lean) == len(hf) == step[1]
                continue
            a, b, keep = step
            ref, got = hf.forward(ids[:, a:b], keep), lean.forward(ids[:, a:b], keep)
            assert got.shape == ref.shape == (keep, V)
            assert got.dtype == ref.dtype
            # float rounding: a block's keys/values feed the later steps too; bf16 rounds at 2^-8
            rounding = dict(rtol=2e-2, atol=2e-2) if ref.dtype == torch.bfloat16 else {}
            exact = lean.block_form == "F.linear" and grouped_attention_is_exact()
            tol = dict(rtol=0, atol=0) if exact else rounding
            torch.testing.assert_close(got, ref, **tol, msg=lambda m: f"{name} after {step}: {m}")
            assert len(lean) == len(hf) == b
    assert lean.capacity >= 34 and lean.forwards == hf.forwards == 8


def test_the_block_form_is_measured_once_per_shape_and_size(monkeypatch):
    from draftsmith.decode import lean as lean_module

    monkeypatch.setattr(lean_module, "_BLOCK_FORM", {})
    weights = [torch.randn(48, 32), torch.randn(32, 48)]
    first = lean_module.fastest_form(weights, 3)
    assert first in lean_module.FORMS and len(lean_module._BLOCK_FORM) == 1
    other = next(f for f in lean_module.FORMS if f != first)
    lean_module._BLOCK_FORM[next(iter(lean_module._BLOCK_FORM))] = other  # remembered, not re-timed
    assert lean_module.fastest_form(weights, 3) == other
    assert lean_module.fastest_form(weights, 1) in ("F.linear", "padded")  # one token: two forms
    assert len(lean_module._BLOCK_FORM) == 2
    for t in (33, 40, 64):  # longer blocks (prefills) share one timing per power of two, padding not a candidate
        assert lean_module.fastest_form(weights, t) in ("F.linear", "weight-first")
    assert len(lean_module._BLOCK_FORM) == 3
    lean = LeanModel(MODELS["llama-gqa"](), capacity=16)
    chosen = {3: "padded", 4: "F.linear", 5: "weight-first", 1: "padded"}
    monkeypatch.setattr(lean_module, "fastest_form", lambda w, n: chosen[n])
    assert lean.block_product(3, "layer") is lean_module._linear_padded
    assert lean.block_product(4, "layer") is torch.nn.functional.linear
    assert lean.block_product(5, "head") is lean_module._linear_block
    assert lean.block_product(1, "layer") is lean_module._linear_one  # one token: W @ [x; 0]^T where measured faster
    lean.block_form = "F.linear"
    assert lean.block_product(1, "layer") is lean.block_product(3, "head") is torch.nn.functional.linear
    with pytest.raises(ValueError, match="unknown block product 'fast'"):
        lean_module.product("fast", 3)


def test_the_measured_forms_are_kept_for_the_record(monkeypatch):
    """measured_forms: each timing's block size, matrices, the form taken and every candidate's milliseconds (the
    taken form the fastest of them), what eval/metrics.json keeps as ``block_forms``."""
    from draftsmith.decode import lean as lean_module

    monkeypatch.setattr(lean_module, "_BLOCK_FORM", {})
    monkeypatch.setattr(lean_module, "_BLOCK_MS", {})
    weights = [torch.randn(48, 32), torch.randn(32, 48), torch.randn(48, 32)]
    rng = torch.get_rng_state()
    lean_module.fastest_form(weights, 1)
    lean_module.fastest_form(weights, 3)
    assert torch.equal(torch.get_rng_state(), rng)  # timed on its own generator: a decode's sampling draws unmoved
    forms = lean_module.measured_forms()
    assert [(f["tokens"], f["matrices"], f["device"], f["dtype"]) for f in forms] == [(1, 3, "cpu", "float32"),
                                                                                     (3, 3, "cpu", "float32")]
    assert set(forms[0]["ms"]) == {"F.linear", "padded"} and set(forms[1]["ms"]) == set(lean_module.FORMS)
    for f in forms:
        assert f["form"] == min(f["ms"], key=f["ms"].get) and all(ms > 0 for ms in f["ms"].values())
        assert f["threads"] == torch.get_num_threads()


def test_a_block_padded_with_a_zero_column_is_f_linear():
    from draftsmith.decode.lean import _linear_padded

    torch.manual_seed(0)
    w, b = torch.randn(48, 32), torch.randn(48)
    for t in (2, 3, 5):
        x = torch.randn(1, t, 32)
        for bias in (None, b):
            got = _linear_padded(x, w, bias)
            assert got.shape == (1, t, 48) and got.is_contiguous()
            torch.testing.assert_close(got, torch.nn.functional.linear(x, w, bias))


def test_one_token_as_a_two_column_product_is_f_linear():
    from draftsmith.decode.lean import _linear_one

    torch.manual_seed(0)
    x, w, b = torch.randn(1, 1, 32), torch.randn(48, 32), torch.randn(48)
    for bias in (None, b):
        got = _linear_one(x, w, bias)
        assert got.shape == (1, 1, 48)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, bias))


def test_the_forms_are_timed_on_the_matrices_a_forward_streams(monkeypatch):
    from draftsmith.decode import lean as lean_module

    lean = LeanModel(MODELS["llama-gqa"](), capacity=16)
    per_layer = [w for w, _ in (*lean.layers[0].qkv_o, *lean.layers[0].mlp)]
    assert len(lean._timed_weights("layer", 3)) == len(per_layer) * len(lean.layers)  # a small model: all of them
    assert len(lean._timed_weights("layer", 64)) == len(per_layer)  # prefill-sized: one layer's
    assert lean._timed_weights("head", 1)[0] is lean.head[0]
    one_layer = sum(w.numel() * w.element_size() for w in per_layer)
    monkeypatch.setattr(lean_module, "STREAMED_BYTES", one_layer)  # a large model: stop once enough is read
    assert len(lean._timed_weights("layer", 3)) == len(per_layer)


def test_unsupported_models_are_named_and_auto_falls_back():
    gpt2 = make_model("gpt2")
    assert "gpt2" in lean_unsupported(gpt2)
    assert isinstance(make_runner(gpt2, "auto"), CachedModel)
    assert isinstance(make_runner(gpt2, "hf"), CachedModel)
    with pytest.raises(ValueError, match="does not cover this model: model type 'gpt2'.*backend='hf'"):
        make_runner(gpt2, "lean")
    with pytest.raises(ValueError, match="backend must be one of"):
        make_runner(gpt2, "fast")

    llama = make_model("llama")
    assert isinstance(make_runner(llama, "auto"), LeanModel)
    assert isinstance(make_runner(llama, "hf"), CachedModel)

    sliding = make_model("qwen2")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in lean_unsupported(sliding)

    hooked = make_model("llama")
    handle = hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "hooks" in lean_unsupported(hooked)
    handle.remove()
    assert lean_unsupported(hooked) is None

    quantized = make_model("llama")
    quantized.model.layers[1].self_attn.o_proj = torch.nn.Sequential(quantized.model.layers[1].self_attn.o_proj)
    assert "layer 1 self_attn.o_proj is Sequential" in lean_unsupported(quantized)


def test_a_lora_wrapped_draft_is_not_run_lean():
    """LoRA deltas live outside the base weights: running the base weights would silently drop them."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_model("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert lean_unsupported(model) is not None
    assert lean_unsupported(model.base_model.model) is not None  # the inner model holds lora.Linear layers
    assert isinstance(make_runner(model, "auto"), CachedModel)
    merged = model.merge_and_unload()
    assert lean_unsupported(merged) is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_both_backends_give_the_same_decodes_and_say_which_ran(arch):
    target = make_model(arch, seed=0)
    draft = perturbed_copy(target, 0.15)
    for p in prompts(6, seed=5):
        outs = {}
        for backend in ("lean", "hf"):
            plain = autoregressive_generate(target, p, max_new_tokens=16, backend=backend)
            spec = speculative_generate(target, draft, p, k=3, max_new_tokens=16, backend=backend)
            sampled = speculative_generate(target, draft, p, k=3, max_new_tokens=16, temperature=1.0, backend=backend,
                                           generator=torch.Generator().manual_seed(1))
            assert plain.stats.backend == spec.stats.backend == spec.stats.draft_backend == backend
            assert torch.equal(plain.sequences, spec.sequences)
            outs[backend] = (plain.sequences, sampled.sequences, spec.stats.accepted)
        assert torch.equal(outs["lean"][0], outs["hf"][0])
        assert torch.equal(outs["lean"][1], outs["hf"][1])  # same logits, same seed: the same samples
        assert outs["lean"][2] == outs["hf"][2]
    mixed = speculative_generate(target, make_model("gpt2"), prompts(1)[0], k=2, max_new_tokens=4)
    assert (mixed.stats.backend, mixed.stats.draft_backend) == ("lean", "hf")


def test_cost_ratios_time_the_requested_backend(monkeypatch):
    target, draft = make_model("llama", seed=0, layers=2), make_model("llama", seed=1, layers=1)
    context = prompts(1, seed=2, min_len=8, max_len=8)[0]
    calls = []
    for cls in (LeanModel, CachedModel):
        def spy(self, input_ids, keep, _orig=cls.forward, _name=cls.__name__):
            calls.append(_name)
            return _orig(self, input_ids, keep)
        monkeypatch.setattr(cls, "forward", spy)
    for backend, runner in (("lean", "LeanModel"), ("hf", "CachedModel")):
        calls.clear()
        costs = cost_ratios(target, draft, context, [2], repeats=2, backend=backend)
        assert costs["target_step_s"] > 0 and costs["c"][2] > 0 and costs["c_v"][2] > 0
        assert calls and set(calls) == {runner}  # every timed forward ran on the requested backend
    with pytest.raises(ValueError, match="backend must be one of"):
        cost_ratios(target, draft, context, [2], repeats=1, backend="nope")
