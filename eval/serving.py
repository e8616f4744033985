"""The serving A/B on vLLM: does speculation pay on the deployed engine, at the concurrency served, with which K?

For the target, vLLM's OpenAI-compatible server runs once without speculation and once per draft x K
with ``--speculative-config`` (draftsmith.serve.server: one context manager that always stops it); each
server is warmed up and driven at every load level (eval/load.py: closed-loop concurrency levels,
optionally open-loop Poisson rates) with the same token-id prompts, greedy; the spec-decode
counters are read from ``/metrics`` before and after every level. Servers the user runs elsewhere
can be given instead (``url`` with speculation, ``baseline_url`` without).

The statistics (eval/serving_stats.py) go to ``serving.json``::

    {"schema_version", "engine", "vllm": {"version", "device"} | {"url", "baseline_url"}, "target",
     "drafts", "settings", "dtype", "prompts", "requests_per_level",
     "cells": [{"draft", "k", "concurrency", "request_rate": null, "spec": {...}, "plain": {...},
                "speedup", "tpot_ratio", "ttft_ratio", "acceptance_rate", "per_position_acceptance",
                "mean_accepted_tokens", "vllm_counters", "outputs_equal", "compared", "mismatches",
                "by", "first_mismatch", ["spec_equals_reference", "plain_equals_reference"]}],
     "rate_cells": [the same, with "concurrency": null and "request_rate"],
     "boundary": {draft: {"per_k": [{"k", "status", "concurrency", "pays_up_to", "text"}],
                          "best_k": [{"concurrency", "k" (0 = off), "speedup"}]}},
     "warnings", "plots", "logs"}

with ``spec``/``plain`` = {"requests", "errors", "output_tokens", "wall_s", "output_tokens_per_s",
"requests_per_s", "ttft_ms_p50/p95", "tpot_ms_p50/p95", "e2e_ms_p50/p95"}.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from draftsmith.artifacts.formats import write_serving
from draftsmith.artifacts.errors import ConfigError
from draftsmith.serve.metrics import SpecCounters, counters_delta, scrape_metrics
from draftsmith.serve.server import ServerSpec, VllmServer, require_vllm
from draftsmith.eval.load import LoadResult, run_load
from draftsmith.serve.client import served_model
from draftsmith.eval.serving_stats import compare_reference, make_cell, summarize, summary_lines  # noqa: F401 (re-export)
from draftsmith.eval.settings import ServingSettings

SCHEMA_VERSION = 1
Levels = list[tuple[str, float]]  # ("concurrency", 4) | ("request_rate", 2.0)


def levels_of(settings: ServingSettings) -> Levels:
    """The load levels, closed loop first: [("concurrency", c) ...] + [("request_rate", r) ...]."""
    return ([("concurrency", c) for c in sorted(set(settings.concurrency))]
            + [("request_rate", r) for r in sorted(set(settings.request_rate))])


def requests_per_level(n_prompts: int, kind: str, level: float) -> int:
    """Requests sent at a level: every prompt once, and for closed loops at least two per client."""
    return max(n_prompts, 2 * int(level)) if kind == "concurrency" else n_prompts


def drive(url: str, prompts: list[list[int]], settings: ServingSettings, *, spec: bool,
          log=print) -> dict[tuple[str, float], tuple[LoadResult, Optional[SpecCounters]]]:
    """Warm `url` up, then run every load level; -> {level: (load, spec counters over the level or None)}."""
    from draftsmith.serve.errors import VllmError

    model = served_model(url, key="serve.url")
    common = dict(ignore_eos=settings.ignore_eos, timeout_s=settings.request_timeout_s, seed=settings.seed)
    if settings.warmup:
        run_load(url, model, prompts, num_requests=settings.warmup, max_tokens=min(8, settings.max_tokens),
                 concurrency=1, **common)
    out = {}
    for kind, level in levels_of(settings):
        before = scrape_metrics(url) if spec else None
        load = run_load(url, model, prompts, num_requests=requests_per_level(len(prompts), kind, level),
                        max_tokens=settings.max_tokens, **{kind: level}, **common)
        counters = None
        if spec:
            counters = counters_delta(before, scrape_metrics(url))
            if not counters.drafts:
                raise VllmError(f"{url} drafted nothing at {kind}={level:g} (vllm:spec_decode_num_drafts_total did "
                                "not move): is speculation on at that server?")
        out[(kind, level)] = (load, counters)
        log(f"draftsmith: serving: {'spec ' if spec else 'plain'} {kind}={level:g}: "
            f"{sum(r.output_tokens for r in load.requests) / load.wall_s:.1f} output tokens/s")
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


def _cells(draft, k, spec_runs, plain_runs, reference) -> list[dict]:
    cells = []
    for level, (load, counters) in spec_runs.items():
        plain = plain_runs[level][0]
        cell = make_cell(draft, k, load, plain, counters)
        if reference is not None:
            cell["spec_equals_reference"] = compare_reference(load, reference)
            cell["plain_equals_reference"] = compare_reference(plain, reference)
        cells.append(cell)
    return cells


def _infer_k(runs) -> Optional[int]:
    """K of a server we did not launch: the number of positions its per-position counters report."""
    positions = [len(c.accepted_per_pos) for _, c in runs.values() if c is not None and c.accepted_per_pos]
    return max(positions) if positions else None


def run_serving_ab(settings: ServingSettings, *, target: str, drafts: dict[str, str], k: list[int],
                   prompts: list[list[int]], out_dir: str | Path, dtype: str = "float32",
                   reference: Optional[list[list[int]]] = None, log=print) -> dict:
    """Run the serving A/B and write ``serving.json`` and its plots into `out_dir`; returns serving.json's content.

    Args:
        settings: ``serve.*`` (engine must be "vllm").
        target: the target model dir / hub id vLLM serves.
        drafts: name -> draft dir (a plain merged model dir); each is served at every K in `k`.
        k: draft tokens per step, one spec server per draft x K.
        prompts: held-out prompts as token-id lists (the first `settings.max_prompts` are used).
        out_dir: where serving.json, the plots and the servers' logs (``serving_logs/``) go.
        dtype: the served dtype (float32 keeps greedy outputs comparable token for token).
        reference: optional greedy outputs of draftsmith's own loop per prompt (same max_tokens, no EOS
            stop when `settings.ignore_eos`): each cell then says whether vLLM's outputs equal them.
    With `settings.url` / `settings.baseline_url` nothing is launched: the cells are labelled with the
    only draft name given (else "served") and the K read from the server's per-position counters.
    """
    if settings.engine != "vllm":
        raise ConfigError(f"serve.engine={settings.engine!r}: set serve.engine=vllm to run the serving A/B")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [list(map(int, p)) for p in prompts[:settings.max_prompts]]
    if not prompts:
        raise ValueError("run_serving_ab needs at least one prompt")
    logs, cells = [], []
    if settings.url:
        engine = {"url": settings.url, "baseline_url": settings.baseline_url}
        plain_runs = drive(settings.baseline_url, prompts, settings, spec=False, log=log)
        spec_runs = drive(settings.url, prompts, settings, spec=True, log=log)
        name = next(iter(drafts)) if len(drafts) == 1 else "served"
        cells += _cells(name, _infer_k(spec_runs), spec_runs, plain_runs, reference)
    else:
        info = require_vllm(settings.python, key="serve.python", engine_key="serve.engine")
        engine = {"version": info.get("version"), "device": info.get("device")}

        def server(name: str, draft: Optional[str] = None, kk: Optional[int] = None) -> VllmServer:
            spec = settings.spec(target, device=info.get("device") or "cpu", dtype=dtype, draft=draft, k=kk)
            log_path = out / "serving_logs" / f"{name}.log"
            logs.append(str(log_path.relative_to(out)))
            log(f"draftsmith: serving: starting vLLM ({name}); log {log_path}")
            return VllmServer(spec, log_path=log_path, startup_timeout_s=settings.startup_timeout_s)

        with server("plain") as srv:
            plain_runs = drive(srv.url, prompts, settings, spec=False, log=log)
        for name, path in drafts.items():
            for kk in k:
                with server(f"{_slug(name)}-k{kk}", str(path), kk) as srv:
                    spec_runs = drive(srv.url, prompts, settings, spec=True, log=log)
                cells += _cells(name, kk, spec_runs, plain_runs, reference)
    closed = [c for c in cells if c["concurrency"] is not None]
    serving = {"schema_version": SCHEMA_VERSION, "engine": settings.engine, "vllm": engine, "target": target,
               "drafts": dict(drafts), "settings": asdict(settings), "dtype": dtype, "prompts": len(prompts),
               "requests_per_level": {f"{kind}={lvl:g}": requests_per_level(len(prompts), kind, lvl)
                                      for kind, lvl in levels_of(settings)},
               "cells": closed, "rate_cells": [c for c in cells if c["concurrency"] is None],
               "boundary": summarize(closed), "warnings": warnings_of(cells), "logs": logs}
    serving["plots"] = plot_serving(serving, out)
    write_serving(out, serving)
    return serving


def warnings_of(cells: list[dict]) -> list[str]:
    """What a reader must not miss: greedy mismatches (on vs off, vs draftsmith's loop) and failed requests."""
    warnings = []
    for c in cells:
        where = (f"draft {c['draft']!r} K={c['k']} "
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
             f"{serving['settings']['concurrency']}. Speedup = output tokens/s with speculation / without.", "",
             "| draft | K | concurrency | tokens/s on | tokens/s off | speedup | TTFT p50 on / off (ms) "
             "| TPOT p50 on / off (ms) | vLLM acceptance rate | outputs equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(serving["cells"], key=lambda c: (c["draft"], c["k"] or 0, c["concurrency"])):
        s, p = c["spec"], c["plain"]
        rate = "-" if c.get("acceptance_rate") is None else f"{c['acceptance_rate']:.3f}"
        lines.append(f"| {c['draft']} | {c['k']} | {c['concurrency']} | {s['output_tokens_per_s']:.1f} | "
                     f"{p['output_tokens_per_s']:.1f} | {_fmt(c['speedup'], 'x')} | {_fmt(s['ttft_ms_p50'])} / "
                     f"{_fmt(p['ttft_ms_p50'])} | {_fmt(s['tpot_ms_p50'])} / {_fmt(p['tpot_ms_p50'])} | {rate} | "
                     f"{c['outputs_equal']} |")
    lines += ["", *[f"- {line}" for line in summary_lines(serving)], ""]
    lines += [f"![{name}]({name})" for name in serving.get("plots", [])]
    return "\n".join(lines) + "\n"


def _fmt(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"
