"""Measured forward costs of a model pair: the c and c_v of the speedup formula.

c   = draft forward of 1 token / target forward of 1 token,
c_v = target forward of k+1 tokens / target forward of 1 token,
both at the context length of a real prompt, with the KV cache, medians over repeats.
"""

from __future__ import annotations

import statistics
import time

import torch

from decode.cache import CachedModel


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def forward_seconds(model: torch.nn.Module, context: torch.Tensor, tokens: int, repeats: int = 20) -> float:
    """Median wall time of one cached forward of `tokens` new tokens after `context` [1, P]."""
    runner = CachedModel(model)
    runner.forward(context, keep=1)
    new = context[:, -1:].repeat(1, tokens)  # [1, tokens]; values do not change the cost
    times = []
    for _ in range(repeats + 2):  # two warm-up calls
        _sync(context.device)
        start = time.perf_counter()
        runner.forward(new, keep=tokens)
        _sync(context.device)
        times.append(time.perf_counter() - start)
        runner.crop(context.shape[1])
    return statistics.median(times[2:])


def cost_ratios(target, draft, context: torch.Tensor, ks: list[int], repeats: int = 20) -> dict:
    """{"target_step_s", "draft_step_s", "c", "c_v": {k: ratio}} measured at `context` [1, P]."""
    target_step = forward_seconds(target, context, 1, repeats)
    draft_step = forward_seconds(draft, context, 1, repeats)
    c_v = {k: forward_seconds(target, context, k + 1, repeats) / target_step for k in ks}
    return {"target_step_s": target_step, "draft_step_s": draft_step, "c": draft_step / target_step, "c_v": c_v}
