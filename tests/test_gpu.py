"""GPU checks of the decode loop (skipped without CUDA)."""

import pytest
import torch

from conftest import make_model, perturbed_copy, prompts
from decode import autoregressive_generate, speculative_generate


@pytest.mark.gpu
def test_greedy_matches_on_cuda():
    target = make_model("llama", seed=0).to("cuda")
    draft = perturbed_copy(make_model("llama", seed=0), 0.15).to("cuda")
    for p in prompts(10, seed=2):
        p = p.to("cuda")
        ref = autoregressive_generate(target, p, max_new_tokens=24).sequences
        for k in (1, 4, 7):
            assert torch.equal(speculative_generate(target, draft, p, k=k, max_new_tokens=24).sequences, ref)


@pytest.mark.gpu
def test_sampling_is_reproducible_on_cuda():
    target = make_model("qwen2", seed=0).to("cuda")
    draft = make_model("qwen2", seed=1, layers=1).to("cuda")
    p = prompts(1)[0].to("cuda")
    run = lambda: speculative_generate(target, draft, p, k=3, max_new_tokens=16, temperature=0.8,  # noqa: E731
                                       generator=torch.Generator("cuda").manual_seed(0)).sequences
    assert torch.equal(run(), run())
