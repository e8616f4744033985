"""Benchmark the deployed engine: the serving A/B on vLLM next to draftsmith's own batch-1 loop.

Prints one JSON document. On the same prompts (token ids) and K:
- vLLM, speculation on vs off, at each closed-loop concurrency: output tokens/s, TTFT/TPOT p50,
  speedup (throughput ratio), vLLM's acceptance rate, greedy outputs on vs off equal, and equal to
  draftsmith's own greedy outputs; the benefit boundary and the best K per concurrency
  (eval/serving.py, the same code the pipeline runs);
- draftsmith's own loop at batch 1 (plain and speculative, greedy, no EOS stop, like vLLM's
  ``ignore_eos``): tokens/s and acceptance rate, so that two independent engines' acceptance can be
  compared, and draftsmith's loop vs vLLM at concurrency 1.

    python scripts/bench_serving.py                       # the demo target and a draft distilled from it
    python scripts/bench_serving.py --target DIR --draft DIR --k 2 4 --concurrency 1 2 4 8 16
    python scripts/bench_serving.py --target DIR --draft cut=DIR eagle=DIR --heldout DATAGEN_DIR --k 1 2 --concurrency 1 8

vLLM runs from --python (default: $DRAFTSMITH_VLLM_PYTHON, else ./.venv-vllm/bin/python; see README
"Serving A/B on vLLM").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from draftsmith.decode import autoregressive_generate, speculative_generate  # noqa: E402
from draftsmith.eval.metrics import acceptance_summary  # noqa: E402
from draftsmith.eval.serving import run_serving_ab  # noqa: E402
from draftsmith.eval.settings import ServingSettings  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target model dir (default: the demo target)")
    ap.add_argument("--draft", nargs="+", help="draft model dirs, each DIR or NAME=DIR (default: a draft distilled from "
                    "the demo target); an EAGLE head's dir (decode/eagle.py) is served as method eagle, and draftsmith's "
                    "own loop is measured for the other drafts only")
    ap.add_argument("--heldout", help="a datagen output: serve its held-out prompts (the pipeline's serve stage's) "
                    "instead of the demo's text prompts")
    ap.add_argument("--baselines", nargs="*", default=[],
                    help="training-free methods served beside the drafts (serve.baselines: ngram, ngram:MIN-MAX); "
                         "none by default, so that figures compare with earlier runs of this script")
    ap.add_argument("--no-own-loop", action="store_true",
                    help="skip timing draftsmith's loop (its plain greedy outputs are still the reference)")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole A/B this many times; cells report medians (each run's values kept)")
    ap.add_argument("--python", help="the interpreter that imports vllm")
    ap.add_argument("--out", help="where serving.json, plots and server logs go (default: a temporary dir)")
    return ap.parse_args(argv)


def own_loop(target, drafts: dict, prompts: list[torch.Tensor], k_grid: list[int], max_tokens: int,
             timed: bool = True) -> tuple[dict, list[list[int]]]:
    """draftsmith's loop at batch 1: plain and speculative tokens/s per draft and K (medians over prompts) and
    acceptance -> (result, the plain greedy outputs). `drafts`: name -> draft model (those the loop can run)."""
    autoregressive_generate(target, prompts[0], max_new_tokens=8)  # warm-up
    plain_s, reference = [], []
    for prompt in prompts:
        out = autoregressive_generate(target, prompt, max_new_tokens=max_tokens)
        plain_s.append(out.stats.total_s)
        reference.append(out.sequences[0, prompt.shape[1]:].tolist())
    tokens = max_tokens * len(prompts)
    result = {"plain_tokens_per_s": tokens / sum(plain_s), "per_draft": {}}
    for name, draft in (drafts.items() if timed else ()):
        speculative_generate(target, draft, prompts[0], k=k_grid[0], max_new_tokens=8)
        per_k = result["per_draft"][name] = {}
        for k in k_grid:
            stats, spec_s, equal = [], [], True
            for prompt, ref in zip(prompts, reference):
                out = speculative_generate(target, draft, prompt, k=k, max_new_tokens=max_tokens)
                stats.append(out.stats)
                spec_s.append(out.stats.total_s)
                equal &= out.sequences[0, prompt.shape[1]:].tolist() == ref
            acc = acceptance_summary(k, stats)
            per_k[k] = {"spec_tokens_per_s": tokens / sum(spec_s), "speedup": sum(plain_s) / sum(spec_s),
                        "acceptance_rate": acc["acceptance_rate"], "token_acceptance": acc["token_acceptance"],
                        "outputs_equal_plain": equal}
    return result, reference


def named_drafts(specs: list[str]) -> dict[str, str]:
    """``DIR`` or ``NAME=DIR`` arguments -> {name: dir} (a bare DIR is named "draft", then "draft2", ...)."""
    out = {}
    for i, spec in enumerate(specs):
        name, _, path = spec.partition("=") if "=" in spec else ("", "", spec)
        out[name or ("draft" if i == 0 else f"draft{i + 1}")] = path
    return out


def median_serving(runs: list[dict]) -> dict:
    """One serving result from repeated A/Bs: per cell, medians of throughput, TTFT/TPOT and speedup (each run's
    speedup kept), outputs equal only if equal in every run; boundary and best K recomputed from the medians."""
    from draftsmith.eval.serving_stats import summarize

    if len(runs) == 1:
        return runs[0]
    cells = []
    for i, cell in enumerate(runs[0]["cells"]):
        same = [run["cells"][i] for run in runs]
        merged = {**cell, "speedup": statistics.median(c["speedup"] for c in same),
                  "speedup_per_run": [c["speedup"] for c in same],
                  "outputs_equal": all(c["outputs_equal"] for c in same),
                  "spec_equals_reference": all(c.get("spec_equals_reference") for c in same)}
        for side in ("spec", "plain"):
            merged[side] = {key: statistics.median(c[side][key] for c in same)
                            if all(isinstance(c[side].get(key), (int, float)) for c in same) else cell[side][key]
                            for key in cell[side]}
        cells.append(merged)
    return {**runs[0], "cells": cells, "boundary": summarize(cells), "repeats": len(runs)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.target is None:
        from draftsmith.demo import build_demo_draft, build_demo_target

        target = str(build_demo_target(log=lambda m: print(m, file=sys.stderr)))
        drafts = named_drafts(args.draft or [str(build_demo_draft(Path(target), log=lambda m: print(m, file=sys.stderr)))])
    else:
        target, drafts = args.target, named_drafts(args.draft or [])
    if not drafts:
        raise SystemExit("bench_serving.py: --draft DIR (or NAME=DIR ...) is needed with --target")
    from draftsmith.decode.pair import check_embedding_width, check_tokenizers, load_model, load_tokenizer
    from draftsmith.demo import demo_prompts
    from draftsmith.eval.runner import heldout_prompts
    from draftsmith.serve.server import speculative_method

    target_model, tokenizer = load_model(target, "target", "float32"), load_tokenizer(target, "target")
    loop_drafts = {}  # the draft models draftsmith's loop times here (the target loaded once, above)
    for name, path in drafts.items():
        if speculative_method(path) == "draft_model":
            check_tokenizers(tokenizer, load_tokenizer(path, f"draft {name!r}"), target, path)
            loop_drafts[name] = load_model(path, f"draft {name!r}", "float32")
            check_embedding_width(loop_drafts[name], tokenizer, path)
    prompts = (heldout_prompts(args.heldout, args.prompts) if args.heldout
               else demo_prompts(tokenizer, args.prompts, args.prompt_tokens, seed=0))
    started = time.time()
    own, reference = own_loop(target_model, loop_drafts, prompts, args.k, args.max_tokens, timed=not args.no_own_loop)
    del target_model, loop_drafts
    settings = ServingSettings(engine="vllm", concurrency=list(args.concurrency), max_tokens=args.max_tokens,
                               max_prompts=args.prompts, python=args.python, baselines=list(args.baselines))
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-serving-"))
    runs = []
    for repeat in range(args.repeats):
        runs.append(run_serving_ab(settings, target=target, drafts=drafts, k=list(args.k),
                                   prompts=[p[0].tolist() for p in prompts],
                                   out_dir=out / f"run{repeat}" if args.repeats > 1 else out, reference=reference,
                                   log=lambda m: print(m, file=sys.stderr)))
    serving = median_serving(runs)
    table = [{"draft": c.get("draft"), "k": c["k"], "concurrency": c["concurrency"], "speedup": c["speedup"],
              "spec_tokens_per_s": c["spec"]["output_tokens_per_s"], "plain_tokens_per_s": c["plain"]["output_tokens_per_s"],
              "spec_ttft_ms_p50": c["spec"]["ttft_ms_p50"], "plain_ttft_ms_p50": c["plain"]["ttft_ms_p50"],
              "spec_tpot_ms_p50": c["spec"]["tpot_ms_p50"], "plain_tpot_ms_p50": c["plain"]["tpot_ms_p50"],
              "vllm_acceptance_rate": c["acceptance_rate"], "outputs_equal": c["outputs_equal"],
              "equal_to_draftsmith": c.get("spec_equals_reference"), "speedup_per_run": c.get("speedup_per_run")}
             for c in serving["cells"]]
    lowest = min(args.concurrency)
    at_1 = {(c.get("draft"), c["k"]): c for c in serving["cells"] if c["concurrency"] == lowest}
    loop = own["per_draft"]
    report = {
        "target": target, "drafts": drafts, "methods": {n: speculative_method(p) for n, p in drafts.items()},
        "settings": vars(args), "machine": platform.machine(),
        "threads": torch.get_num_threads(), "vllm": serving["vllm"], "seconds": time.time() - started,
        "serving_cells": table, "boundary": serving["boundary"],
        "draftsmith_loop_batch1": own,
        "acceptance_vllm_vs_draftsmith": {
            f"{n}/k{k}": {"vllm": at_1[(n, k)]["acceptance_rate"] if (n, k) in at_1 else None,
                          "draftsmith": loop[n][k]["acceptance_rate"]} for n in loop for k in args.k},
        "draftsmith_vs_vllm_at_lowest_concurrency": {
            "plain": own["plain_tokens_per_s"] / statistics.median(c["plain"]["output_tokens_per_s"]
                                                                   for c in at_1.values()),
            **{f"{n}/k{k}": loop[n][k]["spec_tokens_per_s"] / at_1[(n, k)]["spec"]["output_tokens_per_s"]
               for n in loop for k in args.k if (n, k) in at_1}},
        "out_dir": str(out),
    }
    print(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
