"""Benchmark datagen: batched target generation vs one prompt at a time, same prompts, greedy.

Prints JSON: tokens/s of each mode (median over repeats, modes interleaved), the ratio, and how
many prompts gave identical completions in both modes.

    python scripts/bench_datagen.py                       # the demo target, 64 prompts, batch 32
    python scripts/bench_datagen.py --target DIR --batch-size 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from decode.pair import load_model, load_tokenizer  # noqa: E402
from draftsmith.demo import build_demo_target, demo_prompts  # noqa: E402
from train.datagen import DatagenConfig, generate_all  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target dir or hub id (default: the demo target)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    target = args.target or str(build_demo_target(log=lambda m: print(m, file=sys.stderr)))
    tokenizer = load_tokenizer(target, "target")
    model = load_model(target, "target", "float32", "cpu")
    prompts = [p[0].tolist() for p in demo_prompts(tokenizer, args.prompts, args.prompt_tokens, seed=7)]

    def config(batch_size: int) -> DatagenConfig:
        return DatagenConfig(target=target, prompts="-", out_dir="-", max_new_tokens=args.max_new_tokens,
                             batch_size=batch_size)

    rates = {"batched": [], "one_at_a_time": []}
    outputs = {}
    for rep in range(args.repeats):
        modes = [("batched", args.batch_size), ("one_at_a_time", 1)]
        for name, bs in modes if rep % 2 == 0 else modes[::-1]:
            start = time.perf_counter()
            rows = generate_all(model, tokenizer, prompts, config(bs), f"{name} (repeat {rep + 1})")
            seconds = time.perf_counter() - start
            rates[name].append(sum(len(r["completion_ids"]) for r in rows) / seconds)
            outputs[name] = [r["completion_ids"] for r in rows]
    equal = sum(a == b for a, b in zip(outputs["batched"], outputs["one_at_a_time"]))
    tps = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "target": target, "params": model.num_parameters(), "settings": vars(args), "threads": torch.get_num_threads(),
        "tokens_per_s": tps, "tokens_per_s_all_repeats": rates,
        "batched_vs_one_at_a_time": tps["batched"] / tps["one_at_a_time"],
        "identical_completions": f"{equal}/{len(prompts)}",
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
