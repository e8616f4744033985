"""The serving A/B on vLLM: does speculation pay on the deployed engine, at the concurrency served, with which K?

For the target, vLLM's OpenAI-compatible server runs once without speculation and once per draft x K
with ``--speculative-config`` (draftsmith.serve.server: one context manager that always stops it); each
server is warmed up and driven at every load level (eval/load.py: closed-loop concurrency levels,
optionally open-loop Poisson rates) with the same token-id prompts, greedy, ``serve.repeats`` passes;
the spec-decode counters are read from ``/metrics`` before and after every level. With
``serve.interleave`` (default) the plain server stays up beside each spec server and every pass of a
level runs on both back to back (order alternating), so each cell's on/off figures were measured side
by side in time. When the candidate draft's best K differs by concurrency, one more server serves the
measured batch-size K schedule (serve/schedule.py, the form a promoted version hands vLLM) at every
level: the ``scheduled`` column. Before a decision is taken on them, the chosen cells at the decision level
of the proposers a verdict is taken on (the candidate, production, the fastest training-free method of
``serve.baselines`` unless it surely does not pay) are measured on ``serve.decision_servers`` more server lives (a newly started plain and
spec server each, one pass): a server start moves a cell's figures by more than passes inside one
life show, and with three lives or more their spread enters the cell's interval
(eval/serving_stats.py ``speedup_interval``). Servers the user runs elsewhere can be given instead
(``url`` with speculation, ``baseline_url`` without).

The statistics (eval/serving_stats.py) go to ``serving.json``::

    {"schema_version", "engine", "vllm": {"version", "device"} | {"url", "baseline_url"}, "target",
     "drafts", "settings", "dtype", "prompts", "requests_per_level",
     "cells": [{"draft", "k", "concurrency", "request_rate": null, "spec": {...}, "plain": {...},
                "speedup", "tpot_ratio", "ttft_ratio", "acceptance_rate", "per_position_acceptance",
                "mean_accepted_tokens", "vllm_counters", "outputs_equal", "compared", "mismatches",
                "by", "first_mismatch", ["spec_equals_reference", "plain_equals_reference"],
                "repeats", "speedup_ci95", "timings": {"plain_s", "spec_s"} ([pass][request] e2e seconds),
                "servers" ([pass]: the server pair that ran it)}],
     "rate_cells": [the same, with "concurrency": null and "request_rate"],
     "boundary": {draft: {"per_k": [{"k", "status", "concurrency", "pays_up_to", "text"}],
                          "best_k": [best_k_per_concurrency's entries: "concurrency", "k" (0 = off), "speedup",
                                     "speedup_ci95", "indistinguishable", "pays", ...]}},
     "scheduled": {"draft", "bands", "schedule": [[start, end, K], ...], "cells": [cells with "k": None and
                   "column": "scheduled"], "tracking", "tracks", ["error"]} | None,
     "scheduled_free": the same for the training-free rival, measured when promotion may record it as "no draft
                       needed" (eval/policy.py free_may_be_recorded) and its K moves with the load | None,
     "added_passes": {"concurrency", "max_repeats", "cells": [{"draft", "k", "added", "passes", "decided"}],
     "stopped": why the passes stopped} | None,
     "decision_servers": {"concurrency", "servers", "cells": [{"draft", "k", "lives", "passes"}]} | None,
     "capacity": eval/capacity.py capacity_at_slo (with serve.slo_tpot_ms / slo_ttft_ms) | None,
     "warnings", "plots", "logs"}

with ``spec``/``plain`` = {"requests", "errors", "output_tokens", "wall_s", "output_tokens_per_s",
"requests_per_s", "ttft_ms_p50/p95", "tpot_ms_p50/p95", "e2e_ms_p50/p95"}.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from draftsmith.artifacts.formats import write_serving
from draftsmith.artifacts.errors import ConfigError
from draftsmith.serve.metrics import SpecCounters, counters_delta, scrape_metrics
from draftsmith.serve.schedule import batch_size_schedule, describe_schedule, speculated_ks
from draftsmith.serve.server import VllmServer, require_vllm, started_together
from draftsmith.decode.free import is_free_spec
from draftsmith.eval.capacity import capacity_at_slo, capacity_markdown
from draftsmith.eval.intervals import format_ci
from draftsmith.eval.policy import (Contract, Roles, beyond_reach, free_may_be_recorded, may_pay, rival, to_measure,
                                   unsettled)
from draftsmith.eval.load import run_load
from draftsmith.eval.order import interleaved
from draftsmith.serve.client import served_model
from draftsmith.eval.serving_stats import (best_k_per_concurrency, cell_difference_ci, compare_reference,  # noqa: F401
                                          contenders, decision_level, k_bands, lacks_lives, lives_needed,
                                          make_cell, merge_passes, passes_reach, summarize, summary_lines)
from draftsmith.eval.settings import ServingSettings, candidate_name, with_training_free

SCHEMA_VERSION = 1
SERVERS_GPU_SHARE = 0.9  # serve.interleave on a GPU without serve.gpu_memory_utilization: what the servers up at
# once share equally (two: 0.45 each)
Levels = list[tuple[str, float]]  # ("concurrency", 4) | ("request_rate", 2.0)
Cell = tuple[str, int]  # (proposer name, K): eval/policy.py's


def levels_of(settings: ServingSettings) -> Levels:
    """The load levels, closed loop first: [("concurrency", c) ...] + [("request_rate", r) ...]."""
    return ([("concurrency", c) for c in sorted(set(settings.concurrency))]
            + [("request_rate", r) for r in sorted(set(settings.request_rate))])


def requests_per_level(n_prompts: int, kind: str, level: float) -> int:
    """Requests sent at a level: every prompt once, and for closed loops at least two per client."""
    return max(n_prompts, 2 * int(level)) if kind == "concurrency" else n_prompts


Runs = dict  # {level: (its passes [LoadResult], spec counters summed over them or None)}


def drive(url: str, prompts: list[list[int]], settings: ServingSettings, *, spec: bool, log=print,
          baseline_url: Optional[str] = None, levels: Optional[Levels] = None, passes: Optional[int] = None,
          into: Optional[tuple[Runs, Runs]] = None, warmup: bool = True,
          server: Optional[str] = None, lookup: bool = False) -> Runs | tuple[Runs, Runs]:
    """Warm the server(s) up, then run every load level ``serve.repeats`` times, pass by pass (every level once,
    then again, so that a slow spell spreads over the levels) -> {level: (passes, counters)}.

    With `baseline_url` (the same target with speculation off, up at the same time) every pass of a level runs on
    both servers back to back, the order alternating, so that each speculative pass has a plain pass measured
    beside it: -> (spec runs, plain runs); `url` must then be the speculative server. `levels` / `passes`: other
    levels or pass counts than the settings'; `into`: the (spec, plain) runs to add these passes to (returned);
    `warmup` False: no warm-up requests (the servers already served); `server`: the label of this start of the
    server(s), stamped on every pass (a cell's interval sees the spread between server lives); `lookup`: the server
    speculates by a training-free method (serve.baselines: prompt lookup, suffix trees), which may find nothing to
    propose at a level (no error then)."""
    if baseline_url is None:
        return _drive([(url, spec, server)], prompts, settings, log=log, levels=levels, passes=passes,
                      into={url: into[0]} if into is not None else None, warmup=warmup,
                      lookup={url} if lookup else set())[url]
    [runs] = drive_together([url], baseline_url, prompts, settings, log=log, levels=levels, passes=passes,
                            into=[into] if into is not None else None, warmup=warmup, servers=[server], lookup=lookup)
    return runs


def drive_together(urls: list[str], baseline_url: str, prompts: list[list[int]], settings: ServingSettings, *,
                   log=print, levels: Optional[Levels] = None, passes: Optional[int] = None,
                   into: Optional[list[tuple[Runs, Runs]]] = None, warmup: bool = True,
                   servers: Optional[list[Optional[str]]] = None,
                   lookup: bool | list[bool] = False) -> list[tuple[Runs, Runs]]:
    """:func:`drive` for several speculative servers (`urls`: one draft x K each) up beside one plain server: every
    pass of a level runs the plain server once and each speculative one, back to back (eval/order.py interleaved:
    rotated by level, reversed every other pass, so that over two passes no side runs before another more often
    than after it), and the plain pass is the one every speculative pass of
    that round is compared with -> [(spec runs, plain runs)] per url. `into`: per url, the (spec, plain) runs to
    add these passes to; `servers`: per url, the label stamped on its passes (its server life); `lookup`: whether
    they speculate by a training-free method (:func:`drive`), for all or per url."""
    labels = servers or [None] * len(urls)
    lookups = lookup if isinstance(lookup, list) else [lookup] * len(urls)
    sides = [(u, True, lab) for u, lab in zip(urls, labels)] + [(baseline_url, False, labels[0] if len(urls) == 1
                                                                 else None)]
    before = None
    if into is not None:  # the passes already taken: the plain side's are the first url's (rotation follows them)
        before = {**{u: runs[0] for u, runs in zip(urls, into)}, baseline_url: into[0][1]}
    new = _drive(sides, prompts, settings, log=log, levels=levels, passes=passes, into=before, warmup=warmup,
                 keep=False, lookup={u for u, quiet in zip(urls, lookups) if quiet})
    plain_new = new[baseline_url]
    out = []
    for i, u in enumerate(urls):
        spec_old, plain_old = into[i] if into is not None else ({}, {})
        out.append((_merged(spec_old, new[u]), _merged(plain_old, plain_new)))
    return out


def _drive(sides: list[tuple[str, bool, Optional[str]]], prompts: list[list[int]], settings: ServingSettings, *,
           log=print, levels: Optional[Levels] = None, passes: Optional[int] = None, into: Optional[dict] = None,
           warmup: bool = True, keep: bool = True, lookup: set[str] = frozenset()) -> dict[str, Runs]:
    """The passes themselves: `sides` = [(url, speculative?, label)] up at once; each level of each pass runs every
    side once, in the order of eval/order.py interleaved (rotated by level, reversed every other pass). `into`
    {url: runs}: passes already taken (counted for the order; with `keep` the new passes are added to them, else
    only the new passes are returned); `lookup`: the urls that speculate by a training-free method (may draft nothing)."""
    from draftsmith.serve.errors import VllmError

    models = {u: served_model(u, key="serve.url" if is_spec else "serve.baseline_url") for u, is_spec, _ in sides}
    common = dict(ignore_eos=settings.ignore_eos, timeout_s=settings.request_timeout_s, seed=settings.seed)
    if settings.warmup and warmup:
        for u, _, _ in sides:
            run_load(u, models[u], prompts, num_requests=settings.warmup, max_tokens=min(8, settings.max_tokens),
                     concurrency=1, **common)
    first = sides[0][0]
    done = max((len(loads) for loads, _ in (into or {}).get(first, {}).values()), default=0)  # for the rotation
    out: dict[str, Runs] = {u: dict((into or {}).get(u, {})) if keep else {} for u, _, _ in sides}
    n = len(sides)
    for r in range(done, done + (settings.repeats if passes is None else passes)):
        for j, (kind, level) in enumerate(levels or levels_of(settings)):
            for u, is_spec, label in (sides[i] for i in interleaved(n, rotate=j, reverse=r % 2 == 1)):
                before = scrape_metrics(u) if is_spec else None
                load = run_load(u, models[u], prompts, num_requests=requests_per_level(len(prompts), kind, level),
                                max_tokens=settings.max_tokens, **{kind: level}, **common)
                load.server = label
                counters = None
                if is_spec:
                    counters = counters_delta(before, scrape_metrics(u))
                    if not counters.drafts and u not in lookup:  # lookup or suffix trees may find no repeat to propose
                        raise VllmError(f"{u} drafted nothing at {kind}={level:g} (vllm:spec_decode_num_drafts_total "
                                        "did not move): is speculation on at that server?")
                out[u] = _merged(out[u], {(kind, level): ([load], counters)})
                log(f"draftsmith: serving: {'spec ' if is_spec else 'plain'} {kind}={level:g}"
                    + (f" (pass {r + 1})" if r or settings.repeats > 1 else "")
                    + f": {sum(q.output_tokens for q in load.requests) / load.wall_s:.1f} output tokens/s")
    return out


def _merged(runs: Runs, more: Runs) -> Runs:
    """`runs` with the passes of `more` added, level by level (their spec counters summed)."""
    out = dict(runs)
    for level, (loads, counters) in more.items():
        old, total = out.get(level, ([], None))
        out[level] = (old + loads, counters if total is None else total if counters is None
                      else _summed(total, counters))
    return out


def _summed(a: SpecCounters, b: SpecCounters) -> SpecCounters:
    """Two passes' counter differences added up."""
    positions = {i: a.accepted_per_pos.get(i, 0.0) + b.accepted_per_pos.get(i, 0.0)
                 for i in sorted(a.accepted_per_pos.keys() | b.accepted_per_pos.keys())}
    return SpecCounters(drafts=a.drafts + b.drafts, draft_tokens=a.draft_tokens + b.draft_tokens,
                        accepted_tokens=a.accepted_tokens + b.accepted_tokens, accepted_per_pos=positions)


def k_at_once(settings: ServingSettings, device: str, n_k: int) -> int:
    """How many spec servers run at once beside the plain one (serve.k_at_once; None: all `n_k` on the CPU, one on a
    GPU), never more than `n_k`, and no more than serve.gpu_memory_utilization lets fit beside the plain server when
    it is set. On the CPU vLLM's default share (serve/server.py CPU_MEMORY_UTILIZATION) is not a reservation but a
    start-up check that so much host RAM is free (vllm/v1/worker/cpu_worker.py); what a server holds is its
    weights and its KV cache (VLLM_CPU_KVCACHE_SPACE, 2 GiB by default), so it does not cap the servers up at once."""
    n = max(1, min(settings.k_at_once or (n_k if device == "cpu" else 1), n_k))
    if settings.gpu_memory_utilization:
        n = min(n, max(1, int(1.0 / settings.gpu_memory_utilization + 1e-9) - 1))
    return n


# The most spec servers the main passes run as one group across proposers on the CPU, beside one plain server: two
# cost the plain server nothing measurable, four did on a 2-core host (BENCHMARKS.md, "The preset's cheaper stages").
TOGETHER_UP_TO = 2


def chunked(items: list, size: int) -> list[list]:
    """`items` in consecutive groups of at most `size`."""
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


def _cells(draft, k, spec_runs, plain_runs, reference, full_positions: Optional[int] = None) -> list[dict]:
    cells = []
    for level, (loads, counters) in spec_runs.items():
        plains = plain_runs[level][0]
        cell = make_cell(draft, k, loads, plains, counters, full_positions)
        if reference is not None:
            cell["spec_equals_reference"] = compare_reference(merge_passes(loads), reference)
            cell["plain_equals_reference"] = compare_reference(merge_passes(plains), reference)
        cells.append(cell)
    return cells


def _infer_k(runs) -> Optional[int]:
    """K of a server we did not launch: the number of positions its per-position counters report."""
    positions = [len(c.accepted_per_pos) for _, c in runs.values() if c is not None and c.accepted_per_pos]
    return max(positions) if positions else None


def run_serving_ab(settings: ServingSettings, *, target: str, drafts: dict[str, str], k: list[int],
                   prompts: list[list[int]], out_dir: str | Path, dtype: str = "float32",
                   reference: Optional[list[list[int]]] = None, decide: Optional[Contract] = None, log=print) -> dict:
    """Run the serving A/B and write ``serving.json`` and its plots into `out_dir`; returns serving.json's content.

    Args:
        settings: ``serve.*`` (engine must be "vllm").
        target: the target model dir / hub id vLLM serves.
        drafts: name -> draft dir (a plain merged model dir); each is served at every K in `k`, and so is each
            training-free method of ``serve.baselines`` (named as eval/settings.py training_free says: "ngram").
        k: draft tokens per step, one spec server per draft x K.
        prompts: held-out prompts as token-id lists (the first `settings.max_prompts` are used).
        out_dir: where serving.json, the plots and the servers' logs (``serving_logs/``) go.
        dtype: the served dtype (float32 keeps greedy outputs comparable token for token).
        reference: optional greedy outputs of draftsmith's own loop per prompt (same max_tokens, no EOS
            stop when `settings.ignore_eos`): each cell then says whether vLLM's outputs equal them.
        decide: the verdicts the promote stage will take (eval/policy.py Contract: the bars, the champion and
            training-free margins, the serving concurrency, whether a K schedule is exported): while one is
            undecided at the decision level (:func:`undecided_serving`), passes are added there up to
            ``serve.max_repeats`` (launched servers with ``serve.interleave`` only); serving.json's
            ``added_passes`` says what was added and why it stopped.
    With `settings.url` / `settings.baseline_url` nothing is launched: the cells are labelled with the
    only draft name given (else "served") and the K read from the server's per-position counters.
    """
    if settings.engine == "none":
        raise ConfigError("serve.engine='none': set serve.engine=vllm (or auto) to run the serving A/B")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [list(map(int, p)) for p in prompts[:settings.max_prompts]]
    if not prompts:
        raise ValueError("run_serving_ab needs at least one prompt")
    if settings.url:  # the user's servers: one spec and one plain, driven as they are
        engine = {"url": settings.url, "baseline_url": settings.baseline_url}
        spec_runs, plain_runs = drive(settings.url, prompts, settings, spec=True, baseline_url=settings.baseline_url,
                                      log=log)
        name = next(iter(drafts)) if len(drafts) == 1 else "served"
        cells, scheduled, logs = _cells(name, _infer_k(spec_runs), spec_runs, plain_runs, reference), None, []
        ab, scheduled_free = None, None
    else:
        drafts = with_baselines(drafts, settings)
        info = require_vllm(settings.python, key="serve.python", engine_key="serve.engine")
        engine = {"version": info.get("version"), "device": info.get("device")}
        ab = _Launched(settings, target=target, drafts=drafts, k=k, prompts=prompts, out=out, dtype=dtype,
                       reference=reference, decide=decide, device=info.get("device") or "cpu", log=log)
        TOPOLOGIES[topology(settings)](ab)
        cells, scheduled, logs = ab.cells, ab.scheduled, ab.logs
        scheduled_free = ab.scheduled_free
    closed = [c for c in cells if c["concurrency"] is not None]
    serving = {"schema_version": SCHEMA_VERSION, "engine": settings.engine, "vllm": engine, "target": target,
               "drafts": dict(drafts), "settings": asdict(settings), "dtype": dtype, "prompts": len(prompts),
               "requests_per_level": {f"{kind}={lvl:g}": requests_per_level(len(prompts), kind, lvl)
                                      for kind, lvl in levels_of(settings)},
               "cells": closed, "rate_cells": [c for c in cells if c["concurrency"] is None],
               "boundary": summarize(closed), "scheduled": scheduled, "scheduled_free": scheduled_free,
               "added_passes": ab and ab.added, "decision_servers": ab and ab.lives,
               "warnings": ab_warnings(cells, scheduled, ab) + (ab_warnings([], scheduled_free, None)
                                                               if scheduled_free else []), "logs": logs,
               "capacity": capacity_at_slo(closed, slo_tpot_ms=settings.slo_tpot_ms, slo_ttft_ms=settings.slo_ttft_ms)}
    serving["plots"] = plot_serving(serving, out)
    write_serving(out, serving)
    return serving


def with_baselines(drafts: dict, settings: ServingSettings) -> dict:
    """`drafts` and the training-free methods of serve.baselines (eval/settings.py with_training_free), served as
    drafts are."""
    return with_training_free(drafts, settings.baselines, "serve.baselines")


def ab_warnings(cells: list[dict], scheduled: Optional[dict], ab: Optional["_Launched"]) -> list[str]:
    """serving.json's warnings: the cells' (warnings_of), the K schedule's, and those the launched A/B recorded
    where they arose (server lives that failed, a schedule the lives brought)."""
    out = warnings_of(cells + ((scheduled or {}).get("cells") or []))
    if (scheduled or {}).get("after_lives", 0) != 0:
        after = describe_schedule(scheduled["after_lives"]) if scheduled["after_lives"] else "one static K"
        out.append(f"the K schedule measured for {scheduled['draft']!r} ({describe_schedule(scheduled['schedule'])}) is "
                   f"not the one the decision cells' server lives give ({after}); promotion exports the latter")
    if ab is not None:
        out += ab.late_schedule + ab.failed_lives
        settings = ab.settings
        if settings.decision_servers and not settings.interleave and ab.decide is not None:
            out.append(f"serve.decision_servers={settings.decision_servers} needs serve.interleave=true (a plain "
                       "server beside each spec server): the decision cell was measured on one server life")
    if (scheduled or {}).get("error"):
        out.append(f"the measured K schedule of {scheduled['draft']!r} could not be served: {scheduled['error']} "
                   "(promote.k_schedule=false exports a static K)")
    return out


class _Launched:
    """The serving A/B on servers draftsmith launches: its state (the passes taken per proposer x K, the cells built
    from them, the scheduled column, the passes added and the decision lives, the warnings) and the steps a server
    topology (:data:`TOPOLOGIES`) orders — the main cells, the K schedule's column, the decision lives, the passes
    added while a verdict is undecided (eval/policy.py)."""

    def __init__(self, settings: ServingSettings, *, target: str, drafts: dict, k: list[int],
                 prompts: list[list[int]], out: Path, dtype: str, reference, decide: Optional[Contract], device: str,
                 log):
        self.settings, self.target, self.drafts, self.k = settings, target, drafts, k
        # training-free methods (rivals, or the production version "no draft needed"): prompt lookup or suffix trees
        # may find nothing to propose at a level
        self.lookup = {name for name, draft in drafts.items() if is_free_spec(str(draft))}
        self.prompts, self.out, self.dtype, self.reference, self.decide, self.log = (prompts, out, dtype, reference,
                                                                                    decide, log)
        self.device = device
        self.at_once = k_at_once(settings, device, len(k))
        self.memory = settings
        if settings.interleave and device != "cpu" and settings.gpu_memory_utilization is None:  # all of them fit
            self.memory = dataclasses.replace(settings, gpu_memory_utilization=round(
                SERVERS_GPU_SHARE / (1 + self.at_once), 3))
        self.logs: list[str] = []
        self.cells: list[dict] = []
        self.raw: dict = {}  # (name, K) -> (spec runs, plain runs)
        self.plain_runs = None  # one server at a time: the plain passes every cell is compared with
        self.plain_ready = lambda: None  # waits for the main plain server when it was started without waiting
        self.scheduled: Optional[dict] = None  # the candidate's K schedule as a column
        self.scheduled_free: Optional[dict] = None  # the training-free rival's, when it may be recorded
        self.added: Optional[dict] = None
        self.lives: Optional[dict] = None
        self.failed_lives: list[str] = []  # server lives that would not start or serve (warnings)
        self.late_schedule: list[str] = []  # a warning when the lives bring a K schedule the first passes did not

    @property
    def with_lives(self) -> bool:
        """Whether the decision cells get more server lives (serve.decision_servers, beside a plain server each)."""
        return self.settings.decision_servers > 0 and self.settings.interleave and self.decide is not None

    def server(self, name: str, draft: Optional[str] = None, kk: Optional[int] = None,
               schedule: Optional[list[list[int]]] = None) -> VllmServer:
        spec = self.memory.spec(self.target, device=self.device, dtype=self.dtype, draft=draft, k=kk,
                                schedule=schedule)
        log_path = self.out / "serving_logs" / f"{name}.log"
        self.logs.append(str(log_path.relative_to(self.out)))
        self.log(f"draftsmith: serving: starting vLLM ({name}); log {log_path}")
        return VllmServer(spec, log_path=log_path, startup_timeout_s=self.settings.startup_timeout_s)

    def _drive(self, name: str, url: str, **kw):
        return drive(url, self.prompts, self.settings, spec=True, log=self.log, lookup=name in self.lookup, **kw)

    def measure(self, name: str, kk: Optional[int], schedule=None, plain_url: Optional[str] = None):
        """One spec server's runs and the plain runs they are compared with."""
        label = f"{_slug(name)}-k{kk}" if schedule is None else f"{_slug(name)}-scheduled"
        with self.server(label, str(self.drafts[name]), kk, schedule) as srv:
            if plain_url is not None:
                self.plain_ready()  # the plain server started beside the first spec server: up by now, or waited for
                return self._drive(name, srv.url, baseline_url=plain_url, server=f"{label}+plain")
            return self._drive(name, srv.url, server=label), self.plain_runs

    def measure_together(self, group: list[Cell], plain_url: str):
        """The spec servers of `group` (proposer x K cells) started together and driven beside the plain server:
        [(spec runs, plain runs)] per cell."""
        labels = [f"{_slug(name)}-k{kk}" for name, kk in group]
        with started_together(*[self.server(label, str(self.drafts[name]), kk)
                                for label, (name, kk) in zip(labels, group)]) as servers:
            self.plain_ready()  # the plain server started beside the first spec servers: up by now, or waited for
            return drive_together([srv.url for srv in servers], plain_url, self.prompts, self.settings, log=self.log,
                                  servers=[f"{label}+plain" for label in labels],
                                  lookup=[name in self.lookup for name, _ in group])

    def up_at_once(self, n: int) -> int:
        """How many of `n` spec servers run at once beside one plain server: serve.k_at_once (unset: all of them on
        the CPU, where a server's share of memory is no reservation; on a GPU the share the servers were sized
        for, :func:`k_at_once`)."""
        return k_at_once(self.settings, self.device, n) if self.device == "cpu" else self.at_once

    def fresh_passes(self, name: str, kk: int):
        """serve.fresh_servers: every pass on a newly started plain and spec server, side by side."""
        runs: tuple = ({}, {})
        for r in range(self.settings.repeats):
            label = f"{_slug(name)}-k{kk}-pass{r + 1}"
            pair = self.server(f"plain-{label}"), self.server(label, str(self.drafts[name]), kk)
            with started_together(*pair) as (plain_srv, srv):  # the two start-ups overlap
                runs = self._drive(name, srv.url, baseline_url=plain_srv.url, passes=1, into=runs, server=label)
        return runs

    def main_cells(self, plain_url: Optional[str]) -> None:
        """Every proposer at every K and level: serve.repeats passes each, beside the plain server. On the CPU with
        serve.k_at_once unset, when all the proposers' cells come to at most :data:`TOGETHER_UP_TO` spec servers
        they run as one group (one plain pass per round serves them all: the preset's head and lookup at one K);
        otherwise one proposer at a time, as many of its K's spec servers up at once as :meth:`up_at_once`
        allows."""
        every = [(name, kk) for name in self.drafts for kk in self.k]
        together = (self.device == "cpu" and self.settings.k_at_once is None and len(every) <= TOGETHER_UP_TO
                    and not self.settings.fresh_servers and plain_url is not None)
        for cells in [every] if together else [[(name, kk) for kk in self.k] for name in self.drafts]:
            if self.settings.fresh_servers or plain_url is None:
                runs = [self.fresh_passes(name, kk) if self.settings.fresh_servers else self.measure(name, kk)
                        for name, kk in cells]
            else:
                runs = [r for group in chunked(cells, self.up_at_once(len(cells)))
                        for r in self.measure_together(group, plain_url)]
            for (name, kk), (spec_runs, plain) in zip(cells, runs):
                self.raw[(name, kk)] = (spec_runs, plain)
                self.cells += self._cells(name, kk, spec_runs, plain)

    def _schedule_now(self, name: Optional[str] = None) -> Optional[dict]:
        return (schedule_to_measure(self.cells, self.drafts, name)
                if self.decide is None or self.decide.schedule else None)

    def measure_schedule(self, plain_url: Optional[str]) -> None:
        """The configuration a promotion hands vLLM (the candidate's K per batch size), measured as one more column
        when its best K differs by level (serving.json "scheduled")."""
        self.scheduled = self._measure_column(self._schedule_now(), plain_url)

    def measure_free_schedule(self, plain_url: Optional[str]) -> None:
        """Once the decision cells are measured: the training-free rival's K schedule as a column too
        (serving.json "scheduled_free") when the promotion may record that method as "no draft needed"
        (eval/policy.py free_may_be_recorded) and its best K differs by level — the configuration such a version
        hands vLLM, served before it is recorded. Beside `plain_url`, the plain passes of one server at a time, or
        a plain server of its own (after the decision lives the main one has stopped)."""
        level = self.decision_concurrency()
        if level is None or not self.decide.schedule:
            return
        lives = lives_needed(self.with_lives)  # no verdict on a cell without the lives it is decided on
        free = free_may_be_recorded(_Level(self.cells, level, lives=lives), Roles.of(self.drafts), self.decide)
        scheduled = self._schedule_now(free[0]) if free is not None else None
        if scheduled is None:
            return
        if plain_url is not None or self.plain_runs is not None:
            self.scheduled_free = self._measure_column(scheduled, plain_url)
            return
        plain = self.server(f"plain-{_slug(free[0])}-scheduled")
        plain.start()  # not waited for here: it comes up while the spec server does
        try:
            self.plain_ready = plain.wait_healthy
            self.scheduled_free = self._measure_column(scheduled, plain.url)
        finally:
            plain.stop()

    def _measure_column(self, scheduled: Optional[dict], plain_url: Optional[str]) -> Optional[dict]:
        from draftsmith.serve.errors import VllmError

        if scheduled is None:
            return None
        self.log(f"draftsmith: serving: the measured K schedule of {scheduled['draft']!r}: "
                 f"{describe_schedule(scheduled['schedule'])}")
        try:
            spec_runs, plain = self.measure(scheduled["draft"], None, scheduled["schedule"], plain_url=plain_url)
        except VllmError as exc:  # e.g. a vLLM without num_speculative_tokens_per_batch_size
            scheduled.update(cells=[], tracking=[], tracks=None, error=str(exc).splitlines()[0])
            return scheduled
        full = 1 if scheduled["draft"] in self.lookup else min(speculated_ks(scheduled["schedule"]), default=None)
        scheduled["cells"] = [{**c, "k": None, "column": "scheduled"}
                              for c in _cells(scheduled["draft"], None, spec_runs, plain, self.reference, full)
                              if c["concurrency"] is not None]
        scheduled.update(track_schedule(self.cells, scheduled))
        return scheduled

    def retrack_schedule(self) -> None:
        """The candidate's scheduled column against the cells as the decision lives left them (their choice of K
        may move)."""
        scheduled = self.scheduled
        if scheduled is None:  # one static K before the lives: a schedule they bring is exported unmeasured
            now = self._schedule_now()
            if now is not None:
                self.late_schedule.append(f"the decision cells' server lives give {now['draft']!r} a K schedule "
                                          f"({describe_schedule(now['schedule'])}) where the first passes gave one "
                                          "static K: promotion exports it, not measured as a column")
            return
        if not scheduled.get("cells"):
            return
        scheduled.update(track_schedule(self.cells, scheduled))
        now = schedule_to_measure(self.cells, self.drafts)
        if now is None or now["schedule"] != scheduled["schedule"]:
            scheduled["after_lives"] = now and now["schedule"]

    def decision_concurrency(self) -> Optional[int]:
        """The level the promote stage decides at (None: no decision to take, or no closed-loop level)."""
        levels = sorted({c["concurrency"] for c in self.cells if c["concurrency"] is not None})
        return decision_level(levels, self.decide.concurrency)[0] if self.decide is not None and levels else None

    def deciding(self, level: int) -> list[str]:
        """The proposers whose figures at `level` a verdict is taken on: the candidate, production, and the fastest
        training-free method when it may pay there (eval/policy.py); the others' cells need no server lives."""
        roles, view = Roles.of(self.drafts), _Level(self.cells, level)
        rival_cell = rival(view, roles) if roles.free else None
        pays = rival_cell is not None and may_pay(view, rival_cell)
        return [n for n in (roles.candidate, roles.production, rival_cell[0] if pays else None) if n]

    def decision_lives(self) -> None:
        """serve.decision_servers: at the decision level, each deciding proposer's chosen cell — and every K the
        choice could go to on other measurements (serving_stats.contenders: indistinguishable after the first passes,
        or an interval overlapping the fastest K's), so that the choice between them is not taken on one server life
        — measured on that many more server lives (:meth:`life`: one newly started plain server and a spec server
        per cell, one pass each), so that their intervals hold what changes from one server start to the next."""
        level = self.decision_concurrency()
        if level is None or not self.settings.decision_servers:
            return
        self.lives = {"concurrency": level, "servers": self.settings.decision_servers, "cells": []}
        tied_of: dict[str, tuple[int, list[int]]] = {}
        for name in self.deciding(level):
            mine = [c for c in self.cells if c["draft"] == name and c["concurrency"] == level and c["k"] is not None]
            choice = best_k_per_concurrency(mine)[0] if mine else {}
            chosen = choice.get("k") or choice.get("best_speedup_k")
            if chosen:
                tied_of[name] = (chosen, sorted({chosen, *contenders(mine)}))
        cells = [(name, kk) for name, (_, tied) in tied_of.items() for kk in tied]
        for i in range(self.settings.decision_servers):  # every cell once per life: a slow spell hits them alike
            self.life(cells, level, f"life{i + 2}")
        for name, (chosen, tied) in tied_of.items():
            for kk in tied:
                loads = self.raw[(name, kk)][0][("concurrency", level)][0]
                self.lives["cells"].append({"draft": name, "k": kk, "lives": len({load.server for load in loads}),
                                            "passes": len(loads), "chosen_before": kk == chosen, "contenders": tied})

    def life(self, cells: list[Cell], level: int, tag: str) -> list[Cell]:
        """One pass of every (proposer, K) of `cells` at `level` on newly started servers — one plain server
        (``plain-TAG``) and a spec server per cell (``NAME-kK-TAG``), serve.k_at_once of them up at once beside
        the plain one (all on the CPU), each group's passes in turn beside one plain pass — so that the candidate,
        its K contenders and its rival share one plain server start instead of one each -> the cells measured.
        A group that would not start or serve is said in serving.json's warnings and left out (its cells keep the
        lives they have; the measurements already taken are not lost)."""
        from draftsmith.serve.errors import VllmError

        size = self.up_at_once(len(cells))
        plain = self.server(f"plain-{tag}")
        measured: list[Cell] = []
        try:
            plain.start()  # on the CPU it comes up beside the first spec servers
            if self.device != "cpu":
                plain.wait_healthy()  # on a GPU one server starts after another (serve/server.py started_together)
            for group in chunked(cells, size):
                labels = [f"{_slug(name)}-k{kk}-{tag}" for name, kk in group]
                try:
                    with started_together(*[self.server(label, str(self.drafts[name]), kk)
                                            for label, (name, kk) in zip(labels, group)]) as srvs:
                        plain.wait_healthy()
                        runs = drive_together([srv.url for srv in srvs], plain.url, self.prompts, self.settings,
                                              levels=[("concurrency", level)], passes=1,
                                              into=[self.raw[cell] for cell in group], servers=labels, log=self.log,
                                              lookup=[name in self.lookup for name, _ in group])
                except (VllmError, OSError) as exc:  # OSError: a server that stopped answering mid-pass
                    self._failed(labels, plain, exc)
                    continue
                for cell, (spec_runs, plain_runs) in zip(group, runs):
                    self.remeasured(*cell, spec_runs, plain_runs)
                measured += group
        except VllmError as exc:  # the plain server itself would not start
            self._failed([f"{_slug(name)}-k{kk}-{tag}" for name, kk in cells if (name, kk) not in measured], plain,
                         exc)
        finally:
            plain.stop()
        return measured

    def _failed(self, labels: list[str], plain: VllmServer, exc: Exception) -> None:
        logs = ", ".join(f"serving_logs/{n}" for n in [plain.log_path.name] + [f"{lab}.log" for lab in labels])
        self.failed_lives.append(f"server life {', '.join(labels)} failed: {str(exc).splitlines()[0]} (its logs: "
                                 f"{logs}); the cell{'s' if len(labels) > 1 else ''} kept the lives "
                                 f"{'they' if len(labels) > 1 else 'it'} had")
        self.log(f"draftsmith: serving: {self.failed_lives[-1]}")

    def remeasured(self, name: str, kk: int, spec_runs, plain) -> None:
        """The cells of (name, kk) rebuilt from its runs after passes were added to them."""
        self.raw[(name, kk)] = (spec_runs, plain)
        self.cells = [c for c in self.cells if (c["draft"], c["k"]) != (name, kk)] + self._cells(
            name, kk, spec_runs, plain)

    def _cells(self, name: str, kk: int, spec_runs, plain) -> list[dict]:
        """The cells of (name, kk): a lookup server's drafts may be shorter than K, so only its first position's
        acceptance is known (serving_stats.make_cell full_positions)."""
        return _cells(name, kk, spec_runs, plain, self.reference, 1 if name in self.lookup else None)

    def more_passes(self, plain_url: Optional[str]) -> None:
        """serve.max_repeats: passes added, at the decision level, to the cells whose verdict is open and that the
        passes left could settle (eval/policy.py to_measure, through :func:`undecided_serving`): with
        serve.decision_servers > 0 each round is one new server life (:meth:`life`) for all of them (passes inside
        one life cannot narrow the spread between lives), else one more spec server per cell beside the plain one.
        serving.json's ``added_passes`` says what each cell took and why the passes stopped."""
        settings, level = self.settings, self.decision_concurrency()
        if level is None or settings.max_repeats <= settings.repeats:
            return
        self.added = {"concurrency": level, "max_repeats": settings.max_repeats, "cells": [], "stopped": "decided"}
        budget = (settings.max_repeats, settings.decision_servers > 0)
        lives = lives_needed(settings.decision_servers)  # the lives a decision cell is measured on
        taken: dict[Cell, int] = {}
        given_up: set[Cell] = set()  # a life that would not start: no more tries for its cells

        def passes(cell: Cell) -> int:
            return len(self.raw[cell][0][("concurrency", level)][0])

        def todo() -> list[Cell]:
            open_ = undecided_serving(self.cells, self.drafts, level, self.decide, lives=lives)
            for cell in open_:
                taken.setdefault(cell, 0)
            if not open_:
                self.added["stopped"] = "decided"
                return []
            worth = [c for c in undecided_serving(self.cells, self.drafts, level, self.decide, budget=budget,
                                                  lives=lives) if passes(c) < settings.max_repeats and c not in given_up]
            if not worth:
                self.added["stopped"] = (
                    f"serve.max_repeats={settings.max_repeats} reached"
                    if all(passes(c) >= settings.max_repeats for c in open_) else
                    "a server life would not start" if any(c in given_up for c in open_) else
                    beyond_reach("serve.max_repeats", settings.max_repeats))
            return worth

        if settings.decision_servers:
            rounds = 0
            while cells := todo():
                rounds += 1
                done = self.life(cells, level, f"more{rounds}")
                given_up.update(c for c in cells if c not in done)
                for cell in done:
                    taken[cell] += 1
        else:
            for name, kk in todo():
                if (name, kk) not in todo():
                    continue  # settled by the passes another cell took (a difference between two cells)
                label = f"{_slug(name)}-k{kk}-more"
                with self.server(label, str(self.drafts[name]), kk) as srv:
                    while (name, kk) in todo():
                        spec_runs, plain = self._drive(name, srv.url, baseline_url=plain_url,
                                                       levels=[("concurrency", level)], passes=1,
                                                       into=self.raw[(name, kk)], warmup=taken[(name, kk)] == 0,
                                                       server=f"{label}+plain")
                        taken[(name, kk)] += 1
                        self.remeasured(name, kk, spec_runs, plain)
            todo()  # why the passes stopped
        open_ = set(undecided_serving(self.cells, self.drafts, level, self.decide, lives=lives))
        self.added["cells"] = [{"draft": name, "k": kk, "added": n, "passes": passes((name, kk)),
                                "decided": (name, kk) not in open_} for (name, kk), n in taken.items()]


# The server topologies: in which order, and beside which plain server, the steps run. At most 1 + serve.k_at_once
# servers are up at any time (on a GPU each takes its share of the memory): the decision lives start their own, so
# they run after the main plain server has stopped (the scheduled column is measured beside it first, as the cells
# it is compared with), and the passes added then are new lives.
def interleaved_topology(ab: _Launched) -> None:
    """serve.interleave: the plain server stays up beside the spec servers, their passes side by side in time."""
    plain_srv = ab.server("plain")
    plain_srv.start()  # not waited for here: it comes up while the first spec server does
    try:
        ab.plain_ready = plain_srv.wait_healthy
        ab.main_cells(plain_srv.url)
        if not ab.with_lives:
            ab.more_passes(plain_srv.url)
        ab.measure_schedule(plain_srv.url)
        if not ab.with_lives:
            ab.measure_free_schedule(plain_srv.url)
    finally:
        plain_srv.stop()
    if ab.with_lives:
        ab.decision_lives()
        ab.more_passes(None)
        ab.retrack_schedule()
        ab.measure_free_schedule(None)


def fresh_topology(ab: _Launched) -> None:
    """serve.fresh_servers: the main cells start their own plain and spec servers for every pass."""
    ab.main_cells(None)
    if ab.with_lives:
        ab.decision_lives()
        ab.more_passes(None)
    with ab.server("plain") as plain_srv:
        if not ab.with_lives:
            ab.more_passes(plain_srv.url)
        ab.measure_schedule(plain_srv.url)
        ab.measure_free_schedule(plain_srv.url)


def one_at_a_time_topology(ab: _Launched) -> None:
    """serve.interleave=false: one server at a time, the plain passes first, shared by every cell."""
    with ab.server("plain") as srv:
        ab.plain_runs = drive(srv.url, ab.prompts, ab.settings, spec=False, log=ab.log)
    ab.main_cells(None)
    ab.measure_schedule(None)
    ab.measure_free_schedule(None)


TOPOLOGIES = {"fresh": fresh_topology, "interleaved": interleaved_topology, "one at a time": one_at_a_time_topology}


def topology(settings: ServingSettings) -> str:
    """Which of :data:`TOPOLOGIES` the settings ask for."""
    return "fresh" if settings.fresh_servers else "interleaved" if settings.interleave else "one at a time"


class _Level:
    """The A/B's closed-loop cells at one concurrency as eval/policy.py reads them: the K rule is
    best_k_per_concurrency's, a cell's interval its speedup_ci95, the difference of two cells
    serving_stats.cell_difference_ci (paired requests, the spread between server lives held), the reach of passes
    up to `max_repeats` serving_stats.passes_reach (each a new server life with `new_lives`). With `lives`, a cell
    on fewer server lives has no interval yet (unknown, so measured: a verdict is not taken on one server start)."""

    def __init__(self, cells: list[dict], level: int, max_repeats: int = 0, new_lives: bool = False, lives: int = 0):
        self.cells = {(c["draft"], c["k"]): c for c in cells if c["concurrency"] == level and c["k"] is not None
                      and c["speedup"] is not None}
        self.max_repeats, self.new_lives, self.lives = max_repeats, new_lives, lives

    def _short(self, *cells) -> bool:
        return lacks_lives(self.lives, *(self.cells[c] for c in cells))

    def choice(self, name: str):
        here = [c for (n, _), c in self.cells.items() if n == name]
        if not here:
            return None
        choice = best_k_per_concurrency(here)[0]
        return choice["best_speedup_k"], list(choice["indistinguishable"])

    def speedup(self, cell):
        return self.cells[cell]["speedup"]

    def interval(self, cell):
        return None if self._short(cell) else self.cells[cell].get("speedup_ci95")

    def difference(self, a, b):
        return None if self._short(a, b) else cell_difference_ci(self.cells[a], self.cells[b])

    def reach(self, cells):
        return min(passes_reach(self.cells[c], self.max_repeats, new_lives=self.new_lives) for c in cells)


def undecided_serving(cells: list[dict], drafts: dict, level: int, decide: Contract, *,
                      budget: Optional[tuple[int, bool]] = None, lives: int = 0) -> list[tuple[str, int]]:
    """The (proposer, K) cells at concurrency `level` whose verdict is open: eval/policy.py unsettled over the cells
    there; with `budget` (serve.max_repeats, whether each added pass is a new server life) only those the passes
    left could settle (eval/policy.py to_measure); with `lives`, a cell on fewer server lives is open (its verdict
    unknown until it has them: a K chosen only after the decision lives gets its own)."""
    if budget is None:
        return unsettled(_Level(cells, level, lives=lives), Roles.of(drafts), decide)
    return to_measure(_Level(cells, level, *budget, lives=lives), Roles.of(drafts), decide)


def schedule_to_measure(cells: list[dict], drafts: dict, name: Optional[str] = None) -> Optional[dict]:
    """{"draft", "bands", "schedule"} of `name` (default: the promotion candidate, eval/settings.py candidate_name)
    when its best K (best_k_per_concurrency) differs between the measured levels — the schedule a promotion would
    export (serve/schedule.py) — else None: one static K (or off everywhere) is already a measured column."""
    name = name or candidate_name(drafts)
    mine = [c for c in cells if c["draft"] == name and c["concurrency"] is not None and c["k"] is not None]
    if not mine:
        return None
    bands = k_bands(best_k_per_concurrency(mine))
    ks = {b["k"] for b in bands}
    if len(ks) < 2 or ks == {0}:
        return None
    return {"draft": name, "bands": bands, "schedule": batch_size_schedule(bands)}


def track_schedule(cells: list[dict], scheduled: dict) -> dict:
    """Does the scheduled column track the best of the static K and off at every level? Per level: the scheduled
    speedup and interval, the best static choice (best_k_per_concurrency: K and its speedup, 1.0 for off), and
    whether they agree within the intervals (the best static figure inside the scheduled interval, or the two
    intervals overlapping) -> {"tracking": [...], "tracks": bool | None}."""
    best = {b["concurrency"]: b for b in best_k_per_concurrency(
        [c for c in cells if c["draft"] == scheduled["draft"] and c["concurrency"] is not None
         and c["k"] is not None])}
    rows = []
    for c in sorted(scheduled.get("cells", []), key=lambda c: c["concurrency"]):
        b = best.get(c["concurrency"])
        if b is None or c["speedup"] is None:
            continue
        ci, bci = c.get("speedup_ci95"), b.get("speedup_ci95") or [b["speedup"], b["speedup"]]
        agree = None if ci is None else (ci[0] <= bci[1] and bci[0] <= ci[1])
        rows.append({"concurrency": c["concurrency"], "speedup": c["speedup"], "speedup_ci95": ci,
                     "best_static_k": b["k"], "best_static_speedup": b["speedup"], "best_static_ci95": b.get("speedup_ci95"),
                     "agrees": agree})
    verdicts = [r["agrees"] for r in rows if r["agrees"] is not None]
    return {"tracking": rows, "tracks": all(verdicts) if verdicts else None}


def warnings_of(cells: list[dict]) -> list[str]:
    """What a reader must not miss: greedy mismatches (on vs off, vs draftsmith's loop) and failed requests."""
    warnings = []
    for c in cells:
        where = (f"draft {c['draft']!r} {'K=' + str(c['k']) if c.get('column') != 'scheduled' else 'scheduled'} "
                 + (f"concurrency {c['concurrency']}" if c["concurrency"] is not None else f"rate {c['request_rate']:g}/s"))
        if c["outputs_equal"] is False:
            m = c["first_mismatch"]
            warnings.append(f"{where}: greedy outputs differ with speculation on vs off in {c['mismatches']} of "
                            f"{c['compared']} requests (first: prompt {m['prompt_index']}, token {m['position']})")
        for side in ("spec", "plain"):
            if c[side]["errors"]:
                warnings.append(f"{where}: {c[side]['errors']} {side} request(s) failed")
            if c.get(f"{side}_equals_reference") is False:
                warnings.append(f"{where}: vLLM's {side} outputs differ from draftsmith's own greedy loop")
    return warnings


def plot_serving(serving: dict, out: Path) -> list[str]:
    """serving_speedup.png (speedup vs concurrency per draft and K) and serving_latency.png (TTFT and TPOT p50,
    speculation on vs off); returns the file names (none without closed-loop cells)."""
    cells = serving["cells"]
    if not cells:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for c in cells:
        series.setdefault((c["draft"], c["k"]), []).append(c)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (draft, k), mine in series.items():
        mine.sort(key=lambda c: c["concurrency"])
        ax.plot([c["concurrency"] for c in mine], [c["speedup"] for c in mine], marker="o", label=f"{draft} K={k}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    _concurrency_axis(ax, cells)
    ax.set(xlabel="concurrency (closed-loop clients)", ylabel="throughput speedup (on / off)",
           title="vLLM: speculation's speedup vs concurrency")
    ax.legend(fontsize=8)
    files = [_save(fig, out / "serving_speedup.png")]

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key, title in ((axes[0], "ttft_ms_p50", "TTFT p50 (ms)"), (axes[1], "tpot_ms_p50", "TPOT p50 (ms)")):
        first = next(iter(series.values()))
        ax.plot([c["concurrency"] for c in first], [c["plain"][key] for c in first], marker="s", color="black",
                label="off")
        for (draft, k), mine in series.items():
            ax.plot([c["concurrency"] for c in mine], [c["spec"][key] for c in mine], marker="o", label=f"{draft} K={k}")
        _concurrency_axis(ax, cells)
        ax.set(xlabel="concurrency", title=title)
        ax.legend(fontsize=8)
    files.append(_save(fig, out / "serving_latency.png"))
    return files


def _concurrency_axis(ax, cells: list[dict]) -> None:
    """A log2 x axis ticked at the measured concurrency levels, labelled as plain numbers."""
    levels = sorted({c["concurrency"] for c in cells})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def report_section(serving: dict) -> str:
    """The serving A/B as a report.md section: per cell throughput and latency on vs off, the boundary, the plots."""
    lines = ["", "## Serving A/B on vLLM", "",
             f"vLLM {serving['vllm'].get('version') or serving['vllm'].get('url', '')}, {serving['prompts']} prompts, "
             f"{serving['settings']['max_tokens']} tokens per request, closed-loop concurrency "
             f"{serving['settings']['concurrency']}, {serving['settings'].get('repeats', 1)} pass(es) per level. Speedup = "
             "output tokens/s with speculation / without, with its 95% interval (paired bootstrap over requests and "
             "passes).", "",
             "| draft | K | concurrency | tokens/s on | tokens/s off | speedup | TTFT p50 on / off (ms) "
             "| TPOT p50 on / off (ms) | vLLM acceptance rate | outputs equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(serving["cells"], key=lambda c: (c["draft"], c["k"] or 0, c["concurrency"])):
        s, p = c["spec"], c["plain"]
        rate = "-" if c.get("acceptance_rate") is None else f"{c['acceptance_rate']:.3f}"
        lines.append(f"| {c['draft']} | {c['k']} | {c['concurrency']} | {s['output_tokens_per_s']:.1f} | "
                     f"{p['output_tokens_per_s']:.1f} | {format_ci(c['speedup'], c.get('speedup_ci95'))} | {_fmt(s['ttft_ms_p50'])} / "
                     f"{_fmt(p['ttft_ms_p50'])} | {_fmt(s['tpot_ms_p50'])} / {_fmt(p['tpot_ms_p50'])} | {rate} | "
                     f"{c['outputs_equal']} |")
    for sched in (serving.get("scheduled"), serving.get("scheduled_free")):
        if not (sched and sched.get("cells")):
            continue
        lines += ["", f"### The measured K schedule ({sched['draft']}): {describe_schedule(sched['schedule'])}", "",
                  "What a promoted version's speculative_config.json hands vLLM (num_speculative_tokens_per_batch_size), "
                  "served as one more column; it should track the best static K (or off) at each level.", "",
                  "| concurrency | scheduled speedup | best static | agrees within the intervals |", "|---|---|---|---|"]
        for row in sched["tracking"]:
            static = ("off (1.00x)" if row["best_static_k"] == 0 else
                      f"K={row['best_static_k']} {format_ci(row['best_static_speedup'], row['best_static_ci95'])}")
            lines.append(f"| {row['concurrency']} | {format_ci(row['speedup'], row['speedup_ci95'])} | {static} | "
                         f"{'-' if row['agrees'] is None else ('yes' if row['agrees'] else 'no')} |")
    lives = serving.get("decision_servers")
    if lives and lives.get("cells"):
        cells = ", ".join(f"{c['draft']} K={c['k']} ({c['lives']} lives, {c['passes']} passes)" for c in lives["cells"])
        lines += ["", f"Decision cells at concurrency {lives['concurrency']}, each measured on "
                      f"{lives['servers']} more server lives (a new plain server each, shared by the cells, and a "
                      f"spec server per cell): {cells}."]
    added = serving.get("added_passes")
    if added and added.get("cells"):
        cells = ", ".join(f"{c['draft']} K={c['k']} +{c['added']} ({'decided' if c['decided'] else 'open'})"
                          for c in added["cells"])
        lines += ["", f"Passes added at concurrency {added['concurrency']} (up to serve.max_repeats="
                      f"{added['max_repeats']}): {cells}; stopped: {added.get('stopped', 'n/a')}."]
    lines += ["", *[f"- {line}" for line in summary_lines(serving)], ""]
    if serving.get("capacity"):
        lines += [capacity_markdown(serving["capacity"]), ""]
    lines += [f"![{name}]({name})" for name in serving.get("plots", [])]
    return "\n".join(lines) + "\n"


def _fmt(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"
