"""Benchmark a reduced draft vocabulary (decode/vocab.py) against the full one, side by side.

Prints one JSON document. On the held-out prompts of a datagen output, for each K: plain decoding
and speculative decoding with the draft's full head and with heads restricted to each --sizes N
(the N ids the target says most often in the train split, decode.vocab.frequency_vocab), runs
interleaved prompt by prompt with the order rotated each repeat, medians over repeats of tokens/s;
acceptance, tau, the cost ratio c (in the round pattern, decode/timing.py), the held-out coverage
of each vocabulary, and whether every greedy output equals plain decoding's.

    python scripts/bench_draft_vocab.py --target DIR --draft DIR --data RUN/datagen --sizes 4096 8192 --k 2 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from draftsmith.decode import autoregressive_generate, speculative_generate  # noqa: E402
from draftsmith.decode.eos import eos_token_id  # noqa: E402
from draftsmith.decode.pair import load_model  # noqa: E402
from draftsmith.decode.runners import logit_width  # noqa: E402
from draftsmith.decode.timing import cost_ratios, mid_decode_context  # noqa: E402
from draftsmith.eval.metrics import acceptance_summary  # noqa: E402
from draftsmith.eval.runner import heldout_prompts  # noqa: E402
from draftsmith.decode.vocab import datagen_vocab  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="target model dir")
    ap.add_argument("--draft", required=True, help="draft model dir")
    ap.add_argument("--data", required=True, help="a datagen output (its train split ranks the tokens, its held-out "
                                                  "prompts are decoded)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192], help="reduced vocabulary sizes")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(0)
    target = load_model(args.target, "target", "float32", "cpu")
    draft = load_model(args.draft, "draft", "float32", "cpu")
    eos = eos_token_id(target.generation_config)  # no tokenizer loaded: the generation config's only
    prompts = heldout_prompts(args.data, args.prompts)
    vocabs = {"full": None}
    coverage = {}
    for n in args.sizes:
        ids, info = datagen_vocab(args.data, n, logit_width(target), eos)
        vocabs[str(n)] = ids
        coverage[str(n)] = info["heldout_coverage"]
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_id=eos)
    engines = ["plain"] + [f"spec:{v}" for v in vocabs]

    def run(engine, prompt, k):
        if engine == "plain":
            return autoregressive_generate(target, prompt, **common)
        return speculative_generate(target, draft, prompt, k=k, draft_vocab=vocabs[engine.split(":")[1]], **common)

    results = {}
    for k in args.k:
        for engine in engines:  # warm-up
            run(engine, prompts[0], k)
        rates = {e: [] for e in engines}
        stats = {e: [] for e in engines}
        equal = {e: True for e in engines}
        for rep in range(args.repeats):
            tokens = {e: 0 for e in engines}
            seconds = {e: 0.0 for e in engines}
            for i, prompt in enumerate(prompts):
                shift = (rep * len(prompts) + i) % len(engines)
                outs = {e: run(e, prompt, k) for e in engines[shift:] + engines[:shift]}
                for e, out in outs.items():
                    tokens[e] += out.stats.new_tokens
                    seconds[e] += out.stats.total_s
                    equal[e] &= torch.equal(out.sequences, outs["plain"].sequences)
                    if rep == 0 and e != "plain":
                        stats[e].append(out.stats)
            for e in engines:
                rates[e].append(tokens[e] / seconds[e])
        context = mid_decode_context(prompts[0], args.max_new_tokens)
        cell = {"plain_tokens_per_s": statistics.median(rates["plain"])}
        for v in vocabs:
            e = f"spec:{v}"
            costs = cost_ratios(target, draft, context, [k], repeats=10, draft_vocab=vocabs[v])
            acc = acceptance_summary(k, stats[e])
            cell[v] = {"tokens_per_s": statistics.median(rates[e]),
                       "speedup": statistics.median(r / p for r, p in zip(rates[e], rates["plain"])),
                       "acceptance_rate": acc["acceptance_rate"], "token_acceptance": acc["token_acceptance"],
                       "mean_accepted_tokens": acc["mean_accepted_tokens"],
                       "per_position_acceptance": acc["per_position_acceptance"],
                       "c": costs["c"][k], "c_v": costs["c_v"][k], "greedy_equal": equal[e]}
        results[str(k)] = cell
    out = {"target": args.target, "draft": args.draft, "data": args.data, "prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "coverage_heldout": coverage,
           "results": results, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "machine": platform.machine()}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
