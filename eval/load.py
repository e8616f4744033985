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
``"return_token_ids": true``; without them the text is kept and compared instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Optional

from draftsmith.decode.errors import UserError


class LoadError(UserError, RuntimeError):
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


def request_body(model: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> dict:
    """The ``/v1/completions`` body of one greedy streaming request over token ids."""
    return {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": ignore_eos, "return_token_ids": True,
            "stream_options": {"include_usage": True}}


def sse_payloads(lines):
    """The JSON payloads of server-sent-event ``data:`` lines, up to ``[DONE]`` (async generator)."""

    async def gen():
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)

    return gen()


async def send_one(client, url: str, body: dict, index: int, prompt_index: int, t0: float) -> RequestResult:
    """Stream one request, timing the first token-bearing chunk and the end of the stream."""
    start = time.perf_counter()
    ttft, text, ids, usage_tokens, have_ids, error = None, [], [], None, False, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode("utf-8", "replace")[:300]
                raise LoadError(f"HTTP {resp.status_code}: {detail}")
            async for payload in sse_payloads(resp.aiter_lines()):
                if payload.get("usage"):
                    usage_tokens = payload["usage"].get("completion_tokens")
                for choice in payload.get("choices") or []:
                    chunk_ids = choice.get("token_ids")
                    if chunk_ids is not None:
                        have_ids = True
                        ids.extend(chunk_ids)
                    if (chunk_ids or choice.get("text")) and ttft is None:
                        ttft = time.perf_counter() - start
                    text.append(choice.get("text") or "")
    except Exception as exc:  # noqa: BLE001 - a failed request is recorded, the level goes on
        error = f"{type(exc).__name__}: {exc}"
    e2e = time.perf_counter() - start
    n = len(ids) if have_ids else (usage_tokens if usage_tokens is not None else 0)
    return RequestResult(index=index, prompt_index=prompt_index, start_s=start - t0, e2e_s=e2e, ttft_s=ttft,
                         output_tokens=int(n), token_ids=ids if have_ids else None, text="".join(text), error=error)


def _client(concurrency: int, timeout_s: float):
    try:
        import httpx
    except ImportError as exc:
        raise LoadError("the serving A/B needs httpx: pip install -e '.[serving]'") from exc
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one INFO line per request in the run's log
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(
        max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2))


async def _closed_loop(url, model, prompts, concurrency, num_requests, max_tokens, ignore_eos, timeout_s):
    schedule = iter(range(num_requests))
    results: list[RequestResult] = []

    async with _client(concurrency, timeout_s) as client:
        t0 = time.perf_counter()  # after the client is built (~1 s: its TLS context)

        async def client_loop():
            for i in schedule:  # shared iterator: each client takes the next request when its last one is done
                p = i % len(prompts)
                body = request_body(model, prompts[p], max_tokens, ignore_eos)
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
            return await send_one(client, url, request_body(model, prompts[p], max_tokens, ignore_eos), i, p, t0)

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
        model: the served model name (see :func:`served_model`).
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


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model id of ``GET {url}/v1/models`` (the name requests must use)."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # no INFO line for this request in the run's log
    try:
        resp = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise LoadError(f"{url}/v1/models did not name a model ({exc}): is this an OpenAI-compatible server?") from exc
