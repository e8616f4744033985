"""Greedy speculative decoding reproduces the target's own greedy output, token for token, on tiny real models."""

import pytest
import torch

from conftest import make_model, perturbed_copy, prompts
from draftsmith.decode import autoregressive_generate, speculative_generate

N_PROMPTS, MAX_NEW = 20, 20
DRAFTS = ["same", "random", "partial"]


@pytest.fixture(scope="module")
def setup(arch):
    """Target, its three drafts, the prompts and the target's reference greedy outputs (HF generate)."""
    target = make_model(arch, seed=0, layers=2)
    drafts = {"same": target, "random": make_model(arch, seed=7, layers=1), "partial": perturbed_copy(target, 0.15)}
    ps = prompts(N_PROMPTS, seed=1)
    refs = [target.generate(p, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0) for p in ps]
    return target, drafts, ps, refs


@pytest.mark.parametrize("draft_name", DRAFTS)
def test_greedy_matches_target_for_every_k(setup, arch, draft_name):
    target, drafts, ps, refs = setup
    rates = []
    for p, ref in zip(ps, refs):
        assert torch.equal(autoregressive_generate(target, p, max_new_tokens=MAX_NEW).sequences, ref)
        for k in range(1, 9):
            out = speculative_generate(target, drafts[draft_name], p, k=k, max_new_tokens=MAX_NEW)
            assert torch.equal(out.sequences, ref), f"k={k} prompt={p.tolist()}"
            assert out.stats.new_tokens == MAX_NEW
            # llama / qwen2 run the lean forward (decode/lean.py), gpt2 the HF one: both paths covered
            assert out.stats.backend == out.stats.draft_backend == ("hf" if arch == "gpt2" else "lean")
            rates.append(out.stats.acceptance_rate)
    rate = sum(rates) / len(rates)
    expected = {"same": (0.99, 1.0), "random": (0.0, 0.1), "partial": (0.2, 0.9)}[draft_name]
    assert expected[0] <= rate <= expected[1], f"{draft_name}: mean acceptance rate {rate:.3f}"


@pytest.mark.parametrize("k", [3, 5])
def test_eos_inside_a_draft_block(setup, k):
    """EOS = a token the target emits mid-output: spec must stop exactly where HF generate stops."""
    target, drafts, ps, refs = setup
    checked = 0
    for p, ref in zip(ps, refs):
        new = ref[0, p.shape[1]:].tolist()
        # the first token whose first occurrence is at new-token index >= 2 (so it lands inside a block)
        cands = [t for i, t in enumerate(new) if i >= 2 and t not in new[:i]]
        if not cands:
            continue
        eos = cands[0]
        ref_eos = target.generate(p, do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=0)
        assert ref_eos[0, -1].item() == eos and ref_eos.shape[1] < ref.shape[1]
        for name in DRAFTS:
            out = speculative_generate(target, drafts[name], p, k=k, max_new_tokens=MAX_NEW, eos_token_id=eos)
            assert torch.equal(out.sequences, ref_eos), name
        checked += 1
    assert checked >= N_PROMPTS // 2


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_ending_mid_block(setup, max_new):
    target, drafts, ps, refs = setup
    for p, ref in zip(ps[:5], refs[:5]):
        for k in (4, 6):
            out = speculative_generate(target, drafts["same"], p, k=k, max_new_tokens=max_new)
            assert torch.equal(out.sequences, ref[:, : p.shape[1] + max_new])
            assert out.stats.new_tokens == max_new
