"""The settings of the eval stage: the schema the pipeline's Hydra config nests.

``eval.*`` keys are :class:`EvalSettings`, ``decode.*`` keys are :class:`DecodeSettings`, ``serve.*``
keys (the serving A/B, the pipeline's ``serve`` stage) are :class:`ServingSettings`; each
setting is declared once, here, with its one default, and checked in ``__post_init__`` with a
message naming the key. ``eval.runner.EvalConfig`` extends both with the paths the pipeline wires
in. Light to import (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.artifacts.errors import check, check_choice
from draftsmith.decode.settings import BACKENDS
from draftsmith.serve.settings import ServerSettings


@dataclass(kw_only=True)
class DecodeSettings:
    """How eval decodes: the schema of the pipeline's ``decode.*`` keys.

    The sampling filters of the temperature > 0 cells (target and draft alike) and the cached-forward
    backend of both loops and of the cost timing (decode/lean.py).
    """

    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    backend: str = "auto"  # auto (lean where it covers the model) | lean | hf

    def __post_init__(self):
        check_choice("decode.backend", self.backend, BACKENDS)
        check(self.top_k >= 0, f"decode.top_k must be >= 0 (0 = off), got {self.top_k}")
        check(0.0 < self.top_p <= 1.0, f"decode.top_p must be in (0, 1], got {self.top_p}")


@dataclass(kw_only=True)
class EvalSettings:
    """The eval settings: the schema of the pipeline's ``eval.*`` keys (one declaration, one default)."""

    k: list[int] = field(default_factory=lambda: [2, 4])  # draft tokens per round, one cell per K
    temperature: list[float] = field(default_factory=lambda: [0.0])  # 0 = greedy; > 0: rejection sampling
    max_new_tokens: int = 64
    max_prompts: int = 16  # held-out prompts; the batch-1 interval is mostly their spread (8 leave it too wide)
    warmup: int = 1
    repeats: int = 2  # passes over the prompts per cell, plain and speculative side by side (the interval's repeats)
    max_repeats: int = 6  # passes a cell may reach when its verdict is undecided (its interval straddles a gate) and
    # the promotion decides on this eval (not when it decides on the serving A/B)
    time_budget_s: float = 0.0  # seconds the eval may spend before it stops adding passes (0 = no limit)
    hf_ab: bool = False  # also time HF assisted generation beside draftsmith's loop (greedy cells)
    cost_repeats: int = 5
    draft_vocab: int = 0  # > 0: every draft proposes only the N tokens the target says most often in the datagen
    # train split (its head computes N rows instead of the whole vocabulary: decode/vocab.py); 0 = full vocabulary
    baselines: list[str] = field(default_factory=lambda: ["ngram"])  # speculation with nothing to train, measured
    # beside the drafts in the same passes: ngram (prompt lookup, window 2-4) or ngram:MIN-MAX, suffix (vLLM's suffix
    # decoding: pip install arctic-inference); [] = none

    def __post_init__(self):
        if "suffix" in training_free(self.baselines, "eval.baselines"):
            from draftsmith.decode.suffix import INSTALL, available

            check(available(), "eval.baselines lists suffix: vLLM's suffix decoding in draftsmith's loop needs "
                  f"Snowflake's Arctic Inference in this environment: {INSTALL} (a source package; it builds in "
                  "about a minute), or drop suffix from eval.baselines")
        bad_k = [k for k in self.k if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        check(bool(self.k) and not bad_k, f"eval.k must be a non-empty list of integers >= 1, got {list(self.k)}")
        bad_t = [t for t in self.temperature if not t >= 0]
        check(bool(self.temperature) and not bad_t,
              f"eval.temperature must be a non-empty list of values >= 0, got {list(self.temperature)}")
        check(self.max_new_tokens >= 1, f"eval.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check(self.max_prompts >= 1, f"eval.max_prompts must be >= 1, got {self.max_prompts}")
        check(self.warmup >= 0, f"eval.warmup must be >= 0, got {self.warmup}")
        check(isinstance(self.repeats, int) and self.repeats >= 1, f"eval.repeats must be an integer >= 1, got {self.repeats!r}")
        check(isinstance(self.max_repeats, int) and self.max_repeats >= self.repeats,
              f"eval.max_repeats must be an integer >= eval.repeats ({self.repeats}), got {self.max_repeats!r}")
        check(self.time_budget_s >= 0, f"eval.time_budget_s must be >= 0 (0 = no limit), got {self.time_budget_s}")
        check(self.cost_repeats >= 1, f"eval.cost_repeats must be >= 1, got {self.cost_repeats}")
        check(isinstance(self.draft_vocab, int) and self.draft_vocab >= 0,
              f"eval.draft_vocab must be an integer >= 0 (0 = the draft's full vocabulary), got {self.draft_vocab!r}")


def training_free(entries, key: str) -> dict[str, str]:
    """The training-free methods of `entries` (``eval.baselines`` / ``serve.baselines``; decode/free.py) as
    {name: spec}: "ngram" (the spec string, ``ngram:MIN-MAX``, when several windows are measured) and "suffix"
    (vLLM's suffix decoding); a ConfigError naming `key` for anything else. These names stand beside the drafts' in
    metrics.json and serving.json."""
    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.decode.free import SUFFIX, canonical, is_free_spec

    specs = []
    for entry in entries:
        if not is_free_spec(entry):
            raise ConfigError(f"{key}={list(entries)}: {entry!r} is not a training-free method; give ngram (prompt "
                              "lookup) or ngram:MIN-MAX, suffix (vLLM's suffix decoding), or [] for none")
        try:
            specs.append(canonical(entry, key=key))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    specs = list(dict.fromkeys(specs))
    ngrams = [spec for spec in specs if spec != SUFFIX]
    return {(spec if spec == SUFFIX or len(ngrams) > 1 else "ngram"): spec for spec in specs}


def with_training_free(drafts: dict, entries, key: str) -> dict:
    """`drafts` (name -> folder or spec) and the training-free methods of `entries` (:func:`training_free`), each
    measured as drafts are. A method a draft already is (the registry's production version "no draft needed",
    measured as ``production``) is not measured twice; a draft named like a method is a ConfigError naming `key`."""
    from draftsmith.artifacts.errors import ConfigError

    free = training_free(entries, key)
    clash = sorted(free.keys() & drafts.keys())
    if clash:
        raise ConfigError(f"the drafts are named {clash}, which {key} uses for a training-free method: rename the "
                          f"draft, or drop the method from {key}")
    taken = {str(spec) for spec in drafts.values()}
    return {**drafts, **{name: spec for name, spec in free.items() if spec not in taken}}


SERVABLE_DRAFTS = ("trained", "base", "production", "candidate")  # the eval's draft names; "candidate": the one
# promotion decides on (candidate_name)


def candidate_name(names) -> Optional[str]:
    """The draft a promotion decides on among the eval's (or the A/B's) drafts: the trained draft, else the base
    draft (None: neither)."""
    return "trained" if "trained" in names else ("base" if "base" in names else None)


@dataclass(kw_only=True)
class ServingSettings(ServerSettings):
    """The serving A/B on vLLM (eval/serving.py), run as the pipeline's ``serve`` stage: the schema of ``serve.*``.

    For the target and each draft x K, vLLM's OpenAI-compatible server runs with speculation on and
    off (or the user's servers at `url` / `baseline_url` are used) and is driven at each load level.
    How the servers are started (interpreter, memory, parallelism, timeouts) are the server settings
    shared with datagen (draftsmith/serve/settings.py).
    """

    KEY: ClassVar[str] = "serve"

    engine: str = "auto"  # auto (vllm when serve.python imports it: default .venv-vllm/bin/python, else this
    # interpreter; else none, said in the summary) | vllm (required) | none (no serving A/B)
    concurrency: list[int] = field(default_factory=lambda: [1, 8])  # closed-loop clients, one cell each
    drafts: list[str] = field(default_factory=lambda: ["candidate"])  # which of the eval's drafts to serve
    # (trained, base, production, candidate = the one promotion decides on, trained else base, with the production
    # draft beside it when the eval measured one: the champion gate); [] = all of them. Each is one vLLM server per
    # K: minutes on a CPU; the base draft is measured at batch 1
    k: list[int] = field(default_factory=list)  # the K of the spec servers; [] = eval.k
    request_rate: list[float] = field(default_factory=list)  # open-loop Poisson arrivals (requests/s); [] = none
    max_tokens: int = 64  # output tokens per request
    ignore_eos: bool = True  # every request produces exactly max_tokens tokens
    max_prompts: int = 16  # held-out prompts used; a level sends max(max_prompts, 2 x concurrency) requests (16: the
    # decision cell's three server lives stay short on a CPU)
    warmup: int = 2  # unrecorded requests after each server start
    repeats: int = 2  # passes over every level per server (the interval resamples passes, then requests)
    max_repeats: int = 5  # passes a decision cell may reach at the serving concurrency while its verdict is undecided
    # (the decision lives count; with serve.decision_servers each added pass is a new server life)
    interleave: bool = True  # keep the plain server up beside the spec servers (serve.k_at_once) and run their passes
    # in turn (eval/order.py), so that every speculative pass has a plain one in the same round (on a GPU the servers
    # up at once share 0.9 of its memory unless serve.gpu_memory_utilization says otherwise); false: one server at a
    # time, the plain passes first
    k_at_once: Optional[int] = None  # spec servers up at once beside the plain one (serve.interleave): every K of a
    # proposer (every proposer's cells when they come to at most two spec servers: eval/serving.py TOGETHER_UP_TO;
    # every cell of a decision life) starts together and each pass of a level runs the plain server
    # once and every spec server in turn (order rotated), so that one plain pass serves them all and one start-up
    # wait every server;
    # None: all of them on the CPU (host RAM holds many copies of a small model, and three servers start in the time
    # of two then one), one at a time on a GPU (each server takes its share of the GPU's memory:
    # 0.9 / servers up unless serve.gpu_memory_utilization says otherwise)
    fresh_servers: bool = False  # every pass of a draft x K on newly started plain and spec servers (side by side), so
    # that the interval also sees what changes from one server start to the next;
    # costs two server starts per pass
    decision_servers: int = 2  # more server lives (one pass each on a new plain server, shared, and a new spec server
    # per cell) for the chosen cell at the decision level of each proposer a verdict is taken on (the candidate, production, the fastest
    # training-free method unless it surely does not pay) (promote.serving_concurrency) and every K the choice could go to after the first
    # passes (eval/serving_stats.py contenders), so that their intervals, and the choice of K, hold the server-to-server spread (three lives or more:
    # eval/serving_stats.py); 0: the decision cells' passes all run on one server pair
    slo_tpot_ms: Optional[float] = None  # p95 TPOT target: the capacity at it (eval/capacity.py) in serving.json
    slo_ttft_ms: Optional[float] = None  # p95 TTFT target, likewise (both: both must hold)
    seed: int = 0  # the Poisson arrival times
    baseline_url: Optional[str] = None  # with url: the same target with speculation off (no launch)
    baselines: list[str] = field(default_factory=lambda: ["ngram"])  # speculation with nothing to train, served
    # beside the drafts on the same requests at every concurrency and K: ngram (vLLM's prompt lookup, window 2-4)
    # or ngram:MIN-MAX, suffix (vLLM's suffix decoding: pip install arctic-inference beside vLLM); [] = none. The
    # promotion asks whether the draft beats the best of them

    def __post_init__(self):
        super().__post_init__()
        training_free(self.baselines, "serve.baselines")
        check_choice("serve.engine", self.engine, ("none", "vllm", "auto"))
        bad_c = [c for c in self.concurrency if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        check(bool(self.concurrency) and not bad_c,
              f"serve.concurrency must be a non-empty list of integers >= 1, got {list(self.concurrency)}")
        bad_d = [d for d in self.drafts if d not in SERVABLE_DRAFTS]
        check(not bad_d, f"serve.drafts={list(self.drafts)}: {bad_d} is not one of the eval's drafts "
                         f"{list(SERVABLE_DRAFTS)}; give a subset, or [] for all")
        bad_k = [k for k in self.k if isinstance(k, bool) or not isinstance(k, int) or k < 1]
        check(not bad_k, f"serve.k must be a list of integers >= 1 ([] = eval.k), got {list(self.k)}")
        check(all(r > 0 for r in self.request_rate),
              f"serve.request_rate must hold request rates > 0 (requests/s), got {list(self.request_rate)}")
        check(self.max_tokens >= 1, f"serve.max_tokens must be >= 1, got {self.max_tokens}")
        check(self.max_prompts >= 1, f"serve.max_prompts must be >= 1, got {self.max_prompts}")
        check(self.warmup >= 0, f"serve.warmup must be >= 0, got {self.warmup}")
        check(isinstance(self.repeats, int) and self.repeats >= 1, f"serve.repeats must be an integer >= 1, got {self.repeats!r}")
        check(self.k_at_once is None or (isinstance(self.k_at_once, int) and not isinstance(self.k_at_once, bool)
                                         and self.k_at_once >= 1),
              f"serve.k_at_once must be an integer >= 1 (spec servers up at once beside the plain one) or null "
              f"(all on the CPU, one on a GPU), got {self.k_at_once!r}")
        up = 1 + (self.k_at_once or 1)
        check(not (self.interleave and self.url is None and (self.gpu_memory_utilization or 0) * up > 1.0),
              f"serve.gpu_memory_utilization={self.gpu_memory_utilization} with serve.interleave=true: {up} servers "
              f"run at once (plain beside {up - 1} spec), so each may take at most {1 / up:.2g}; lower it, lower "
              "serve.k_at_once, or set serve.interleave=false")
        check(not self.fresh_servers or self.interleave,
              "serve.fresh_servers=true starts a plain server beside each spec server: it needs serve.interleave=true")
        check(isinstance(self.decision_servers, int) and not isinstance(self.decision_servers, bool)
              and self.decision_servers >= 0,
              f"serve.decision_servers must be an integer >= 0 (0: no more server lives), got {self.decision_servers!r}")
        check(isinstance(self.max_repeats, int) and self.max_repeats >= self.repeats,
              f"serve.max_repeats must be an integer >= serve.repeats ({self.repeats}), got {self.max_repeats!r}")
        for key in ("slo_tpot_ms", "slo_ttft_ms"):
            value = getattr(self, key)
            check(value is None or value > 0, f"serve.{key} must be > 0 (milliseconds, p95) or unset, got {value}")
        check((self.url is None) == (self.baseline_url is None),
              "serve.url and serve.baseline_url go together: give the server with speculation on "
              "(url) and the same target without it (baseline_url), or neither to launch vLLM here")
        check(self.baseline_url is None or self.baseline_url.startswith(("http://", "https://")),
              f"serve.baseline_url={self.baseline_url!r} is not an http(s) URL (e.g. http://gpu-node:8001)")
