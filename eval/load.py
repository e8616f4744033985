"""Load for the serving A/B: streaming ``/v1/completions`` requests against an OpenAI-compatible server.

Two arrival patterns (the terms of vLLM's own ``benchmark_serving``):

- **closed loop** at concurrency N: N clients, each sending its next request when its previous one
  finished, so N requests are in flight until the queue runs dry;
- **open loop** at a request rate λ: requests arrive as a Poisson process (exponential gaps of
  mean 1/λ, from a seeded generator) whatever the server's state.

Prompts are token ids (``"prompt": [ids]``) so that every engine sees the same tokens; decoding is
greedy (temperature 0). Per request: TTFT (send -> first token), TPOT (mean time per output token
after the first: (e2e - TTFT) / (tokens - 1), vLLM's definition), end-to-end latency, the output
token count and the output token ids (vLLM >= 0.10 returns them per chunk with
``"return_token_ids": true``; without them the text is kept and compared instead). One request is
streamed and timed by :func:`draftsmith.serve.client.stream_completion`; this module schedules them.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Optional

from draftsmith.serve.client import async_client, stream_body, stream_completion
from draftsmith.serve.errors import VllmError


class LoadError(VllmError):
    """The server did not serve the load (every request failed, or it has no model); the message says why."""


@dataclass
class RequestResult:
    """One streamed request; times in seconds, `start_s` from the start of its load level."""

    index: int  # position in the level's request schedule
    prompt_index: int  # which prompt (the schedule cycles through the prompts)
    start_s: float
    e2e_s: float
    ttft_s: Optional[float]  # None when no token arrived
    output_tokens: int
    token_ids: Optional[list[int]]  # None when the server does not return token ids
    text: str
    error: Optional[str] = None

    @property
    def tpot_s(self) -> Optional[float]:
        """Mean inter-token time after the first token (None with fewer than two tokens)."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class LoadResult:
    """All requests of one load level: closed loop at `concurrency` or open loop at `request_rate`."""

    concurrency: Optional[int]
    request_rate: Optional[float]
    wall_s: float  # first send -> last response
    requests: list[RequestResult] = field(default_factory=list)
    server: Optional[str] = None  # which server pair (one start of the spec and plain servers) ran it: eval/serving.py


async def send_one(client, url: str, body: dict, index: int, prompt_index: int, t0: float) -> RequestResult:
    """Stream one request (draftsmith.serve.client) and place it in its level's schedule."""
    start = time.perf_counter()
    done = await stream_completion(client, url, body)
    return RequestResult(index=index, prompt_index=prompt_index, start_s=start - t0, e2e_s=done.e2e_s,
                         ttft_s=done.ttft_s, output_tokens=done.output_tokens, token_ids=done.token_ids,
                         text=done.text, error=done.error)


def _client(connections: int, timeout_s: float):
    return async_client(connections, timeout_s, what="the serving A/B")


async def _closed_loop(url, model, prompts, concurrency, num_requests, max_tokens, ignore_eos, timeout_s):
    schedule = iter(range(num_requests))
    results: list[RequestResult] = []

    async with _client(concurrency, timeout_s) as client:
        t0 = time.perf_counter()  # after the client is built (~1 s: its TLS context)

        async def client_loop():
            for i in schedule:  # shared iterator: each client takes the next request when its last one is done
                p = i % len(prompts)
                body = stream_body(model, prompts[p], max_tokens, ignore_eos)
                results.append(await send_one(client, url, body, i, p, t0))

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return LoadResult(concurrency=concurrency, request_rate=None, wall_s=_wall(results),
                      requests=sorted(results, key=lambda r: r.index))


async def _open_loop(url, model, prompts, rate, num_requests, max_tokens, ignore_eos, timeout_s, seed):
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(num_requests):
        arrivals.append(t)
        t += rng.expovariate(rate)

    async with _client(num_requests, timeout_s) as client:
        t0 = time.perf_counter()

        async def arrive(i, at):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            p = i % len(prompts)
            return await send_one(client, url, stream_body(model, prompts[p], max_tokens, ignore_eos), i, p, t0)

        results = await asyncio.gather(*(arrive(i, at) for i, at in enumerate(arrivals)))
    return LoadResult(concurrency=None, request_rate=rate, wall_s=_wall(results), requests=list(results))


def _wall(results: list[RequestResult]) -> float:
    if not results:
        return 0.0
    return max(r.start_s + r.e2e_s for r in results) - min(r.start_s for r in results)


def run_load(url: str, model: str, prompts: list[list[int]], *, num_requests: int, max_tokens: int,
             concurrency: Optional[int] = None, request_rate: Optional[float] = None, ignore_eos: bool = True,
             timeout_s: float = 600.0, seed: int = 0) -> LoadResult:
    """Drive one load level against `url` and return every request's timings and outputs.

    Args:
        url: the server's base URL (``http://host:port``).
        model: the served model name (:func:`draftsmith.serve.client.served_model`).
        prompts: token-id lists; request i sends ``prompts[i % len(prompts)]``.
        num_requests: requests in this level.
        max_tokens: output tokens per request (exactly this many with `ignore_eos`).
        concurrency: closed loop with this many clients; or
        request_rate: open loop, Poisson arrivals at this many requests/s (seeded by `seed`).
        timeout_s: per-request timeout.
    """
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) or request_rate (open loop)")
    if concurrency is not None:
        coro = _closed_loop(url, model, prompts, concurrency, num_requests, max_tokens, ignore_eos, timeout_s)
    else:
        coro = _open_loop(url, model, prompts, request_rate, num_requests, max_tokens, ignore_eos, timeout_s, seed)
    result = asyncio.run(coro)
    failed = [r for r in result.requests if r.error]
    if result.requests and len(failed) == len(result.requests):
        raise LoadError(f"every request to {url}/v1/completions failed, e.g. {failed[0].error}")
    return result
