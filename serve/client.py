"""The one client of vLLM's OpenAI-compatible server: probes, completions, streaming completions.

Used by datagen (``data.engine=vllm``: non-streaming completions with top-k log-probs), the serving
A/B's load generator (streaming, timed per token) and the monitor (``/metrics``, through
:mod:`draftsmith.serve.metrics`). Plain GETs (``/health``, ``/metrics``, ``/v1/models``,
``/version``) use urllib, so probing a server needs nothing installed; completions use httpx's
async client (the ``serving`` extra), many requests in flight. Errors name `key`, the setting the
caller's user typed for the server (``data.vllm.url``, ``serve.url``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Optional

from draftsmith.serve.errors import VllmError


# -- plain GETs -------------------------------------------------------------------------------------
def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """GET `url` -> (status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def served_model(url: str, key: str = "serve.url", timeout_s: float = 30.0) -> str:
    """The first model id of ``GET {url}/v1/models`` (the name requests must use)."""
    status, body = http_get(url.rstrip("/") + "/v1/models", timeout_s=timeout_s)
    try:
        return json.loads(body)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise VllmError(f"{url}/v1/models answered {status or 'nothing'} without a model id: is {key} a running "
                        "vLLM (OpenAI-compatible) server?") from None


def server_version(url: str) -> Optional[str]:
    """vLLM's version from ``GET {url}/version`` (None when it does not say)."""
    status, body = http_get(url.rstrip("/") + "/version", timeout_s=10.0)
    try:
        return json.loads(body).get("version") if status == 200 else None
    except (ValueError, AttributeError):
        return None


# -- completions ------------------------------------------------------------------------------------
def async_client(connections: int, timeout_s: float, what: str = "talking to vLLM"):
    """An ``httpx.AsyncClient`` for `connections` requests in flight; httpx's INFO line per request kept out of logs."""
    try:
        import httpx
    except ImportError as exc:
        raise VllmError(f"{what} needs httpx: pip install -e '.[serving]'") from exc
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(
        max_connections=connections + 2, max_keepalive_connections=connections + 2))


async def post_completion(client, url: str, body: dict, *, what: str, attempts: int = 3,
                          refusal_hint: Callable[[str], str] = lambda detail: "", timeout_key: str = "") -> dict:
    """POST one non-streaming ``/v1/completions`` request -> its JSON; transport errors and 5xx are retried
    (`attempts` in all), a 4xx is an error at once (with `refusal_hint(detail)` appended). `what` names the
    request in errors ("prompt 12"); `timeout_key` is the setting that bounds one request."""
    import httpx

    error = ""
    for attempt in range(attempts):
        try:
            resp = await client.post(url + "/v1/completions", json=body)
        except httpx.TransportError as exc:  # connection refused or reset, timeouts
            error = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code == 200:
                return resp.json()
            detail = resp.text[:400]
            if resp.status_code < 500:
                raise VllmError(f"{url}/v1/completions refused {what} (HTTP {resp.status_code}: {detail})"
                                + refusal_hint(detail))
            error = f"HTTP {resp.status_code}: {detail}"
        await asyncio.sleep(2.0 ** attempt)
    bound = f" ({timeout_key} bounds one request)" if timeout_key else ""
    raise VllmError(f"{url}/v1/completions failed for {what} after {attempts} attempts ({error}); is the "
                    f"server up?{bound}")


# -- streaming --------------------------------------------------------------------------------------
def stream_body(model: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> dict:
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


@dataclass
class Streamed:
    """One streamed completion; times in seconds from its send. A failed request has `error` set."""

    ttft_s: Optional[float]  # send -> first token-bearing chunk; None when no token arrived
    e2e_s: float  # send -> end of the stream
    output_tokens: int
    token_ids: Optional[list[int]]  # None when the server does not return token ids (vLLM < 0.10)
    text: str
    error: Optional[str] = None


async def stream_completion(client, url: str, body: dict) -> Streamed:
    """Stream one request, timing the first token-bearing chunk and the end of the stream (errors are recorded,
    not raised: a load level goes on)."""
    start = time.perf_counter()
    ttft, text, ids, usage_tokens, have_ids, error = None, [], [], None, False, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode("utf-8", "replace")[:300]
                raise VllmError(f"HTTP {resp.status_code}: {detail}")
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
    n = len(ids) if have_ids else (usage_tokens if usage_tokens is not None else 0)
    return Streamed(ttft_s=ttft, e2e_s=time.perf_counter() - start, output_tokens=int(n),
                    token_ids=ids if have_ids else None, text="".join(text), error=error)
