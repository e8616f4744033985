"""GPU checks of the decode loop (skipped without CUDA)."""

import pytest
import torch

from conftest import make_model, perturbed_copy, prompts
from draftsmith.decode import autoregressive_generate, speculative_generate


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["lean", "hf"])
def test_greedy_matches_on_cuda(backend):
    target = make_model("llama", seed=0).to("cuda")
    draft = perturbed_copy(make_model("llama", seed=0), 0.15).to("cuda")
    for p in prompts(10, seed=2):
        p = p.to("cuda")
        ref = target.generate(p, do_sample=False, max_new_tokens=24, pad_token_id=0)
        assert torch.equal(autoregressive_generate(target, p, max_new_tokens=24, backend=backend).sequences, ref)
        for k in (1, 4, 7):
            out = speculative_generate(target, draft, p, k=k, max_new_tokens=24, backend=backend)
            assert torch.equal(out.sequences, ref) and out.stats.backend == backend


@pytest.mark.gpu
def test_lean_logits_match_hf_logits_on_cuda():
    """Off CPU the lean forward multiplies blocks as nn.Linear does; CUDA's SDPA may still pick other
    kernels than HF's call (GQA packing, causal flag vs mask), so: equal up to float rounding."""
    from draftsmith.decode.cache import CachedModel
    from draftsmith.decode.lean import LeanModel

    model = make_model("qwen2", seed=0).to("cuda")
    ids = torch.randint(4, 40, (1, 30), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    hf, lean = CachedModel(model), LeanModel(model, capacity=8)
    assert lean.block_form == "F.linear"  # nn.Linear's own product off CPU
    with torch.inference_mode():
        for a, b, keep in ((0, 9, 2), (9, 10, 1), (10, 15, 5), ("crop", 11, 0), (11, 30, 3)):
            if a == "crop":
                hf.crop(b)
                lean.crop(b)
                continue
            got, ref = lean.forward(ids[:, a:b], keep), hf.forward(ids[:, a:b], keep)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_sampling_is_reproducible_on_cuda():
    target = make_model("qwen2", seed=0).to("cuda")
    draft = make_model("qwen2", seed=1, layers=1).to("cuda")
    p = prompts(1)[0].to("cuda")
    run = lambda: speculative_generate(target, draft, p, k=3, max_new_tokens=16, temperature=0.8,  # noqa: E731
                                       generator=torch.Generator("cuda").manual_seed(0)).sequences
    assert torch.equal(run(), run())
