"""Benchmark an EAGLE head against a draft model in draftsmith's own loop at batch 1, beside plain decoding.

Prints one JSON document. On the same held-out prompts (a datagen output's, as the eval stage takes them), the
same K and the same reduced draft vocabulary, each prompt runs plain decoding, then every draft x K, in turn (the
order rotated per prompt), for `--repeats` passes; greedy, no EOS stop (every run makes `--max-new-tokens`
tokens). Per draft x K: speedup = plain seconds / speculative seconds summed over the prompts of a pass (median
over passes, each pass's kept), token acceptance, tokens per round, the in-loop costs c and c_v, and whether
every output equals plain decoding's.

    python scripts/bench_eagle.py --target DIR --eagle DIR --draft DIR --data DATAGEN_DIR --k 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from draftsmith.decode import autoregressive_generate, speculative_generate  # noqa: E402
from draftsmith.decode.eagle import load_eagle  # noqa: E402
from draftsmith.decode.loop import eagle_generate  # noqa: E402
from draftsmith.decode.pair import load_model, load_tokenizer  # noqa: E402
from draftsmith.decode.vocab import datagen_vocab  # noqa: E402
from draftsmith.eval.metrics import acceptance_summary, in_loop_costs  # noqa: E402
from draftsmith.eval.runner import heldout_prompts  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--eagle", required=True, help="an EAGLE head's checkpoint (decode/eagle.py save_eagle)")
    ap.add_argument("--draft", help="a draft model to run beside it (optional)")
    ap.add_argument("--data", required=True, help="a datagen output: its held-out prompts, its draft vocabulary")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="0: the full head")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.target, "target", "float32")
    tok = load_tokenizer(args.target, "target")
    head = load_eagle(args.eagle, target)
    draft = load_model(args.draft, "draft", "float32") if args.draft else None
    width = target.get_output_embeddings().weight.shape[0]
    vocab = datagen_vocab(args.data, args.draft_vocab, width, tok.eos_token_id)[0] if args.draft_vocab else None
    prompts = heldout_prompts(args.data, args.prompts)
    m = args.max_new_tokens

    def run(side: str, k: int, prompt):
        if side == "plain":
            return autoregressive_generate(target, prompt, max_new_tokens=m)
        if side == "eagle":
            return eagle_generate(target, head, prompt, k=k, max_new_tokens=m, draft_vocab=vocab)
        return speculative_generate(target, draft, prompt, k=k, max_new_tokens=m, draft_vocab=vocab)

    sides = [("plain", 0)] + [(d, k) for d in (["eagle"] + (["draft"] if draft is not None else [])) for k in args.k]
    for side, k in sides:  # warm-up (the lean forward times its block forms once per process)
        run(side, max(k, 1), prompts[0][:, :8])
    passes = []
    started = time.time()
    for r in range(args.repeats):
        secs = {s: 0.0 for s in sides}
        stats = {s: [] for s in sides}
        equal = {s: True for s in sides if s[0] != "plain"}
        for i, prompt in enumerate(prompts):
            shift = (i + r) % len(sides)
            order = sides[shift:] + sides[:shift]
            if (i + r) % 2:
                order = order[::-1]
            outs = {}
            for side in order:
                out = run(side[0], side[1], prompt)
                secs[side] += out.stats.total_s
                outs[side] = out.sequences
                stats[side].append(out.stats)
            for side in equal:
                equal[side] &= torch.equal(outs[side], outs[("plain", 0)])
        passes.append({"secs": secs, "stats": stats, "equal": equal})

    cells = []
    for side in sides[1:]:
        name, k = side
        speedups = [p["secs"][("plain", 0)] / p["secs"][side] for p in passes]
        all_stats = [s for p in passes for s in p["stats"][side]]
        acc = acceptance_summary(k, all_stats)
        plain = [s for p in passes for s in p["stats"][("plain", 0)]]
        cells.append({"draft": name, "k": k, "speedup": statistics.median(speedups), "speedup_per_pass": speedups,
                      "token_acceptance": acc["token_acceptance"], "acceptance_rate": acc["acceptance_rate"],
                      "mean_accepted_tokens": acc.get("mean_accepted_tokens"),
                      "in_loop": in_loop_costs(acc["token_acceptance"], k, plain, all_stats),
                      "outputs_equal_plain": all(p["equal"][side] for p in passes)})
    plain_tps = [len(prompts) * m / p["secs"][("plain", 0)] for p in passes]
    report = {"target": args.target, "eagle": args.eagle, "draft": args.draft, "data": args.data,
              "settings": vars(args), "machine": platform.machine(), "threads": torch.get_num_threads(),
              "prompts": len(prompts), "plain_tokens_per_s": statistics.median(plain_tps),
              "seconds": round(time.time() - started, 1), "cells": cells}
    print(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
