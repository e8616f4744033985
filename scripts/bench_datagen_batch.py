"""Benchmark datagen's HF engine at several batch sizes (``data.batch_size``) on the prompts of a datagen output:
the same prompts generated greedily with top-k log-probs as datagen keeps them, batch sizes interleaved over the
repeats. Prints JSON: tokens/s of each (median over repeats), the ratio to the first batch size, and how many
prompts got the same completion as at the first.

    python scripts/bench_datagen_batch.py --target TARGET_DIR --data OUT/datagen --prompts 128 --batch-sizes 16 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target's folder (a transformers checkpoint)")
    ap.add_argument("--data", required=True, help="a datagen output folder (OUT/datagen): its training prompts")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--top-k-logprobs", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.artifacts.formats import read_datagen
    from draftsmith.train.datagen import generate_all

    ds = read_datagen(args.data)[0]["train"]
    prompts = [list(p) for p in ds["prompt_ids"][: args.prompts]]
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    rates: dict[int, list[float]] = {b: [] for b in args.batch_sizes}
    completions: dict[int, list] = {}
    for _ in range(args.repeats):
        for b in args.batch_sizes:
            cfg = SimpleNamespace(batch_size=b, seed=0, temperature=0.0, top_p=1.0, n_completions=1, device="cpu",
                                  max_new_tokens=args.max_new_tokens, top_k_logprobs=args.top_k_logprobs)
            start = time.perf_counter()
            rows = generate_all(model, tokenizer, prompts, cfg, f"batch {b}")
            rates[b].append(sum(len(r["completion_ids"]) for r in rows) / (time.perf_counter() - start))
            completions[b] = [r["completion_ids"] for r in rows]
    first = args.batch_sizes[0]
    med = {b: statistics.median(v) for b, v in rates.items()}
    print(json.dumps({
        "target": args.target, "prompts": len(prompts), "threads": torch.get_num_threads(),
        "tokens_per_s": {str(b): v for b, v in rates.items()}, "median_tokens_per_s": {str(b): v for b, v in med.items()},
        f"speed_over_batch_{first}": {str(b): v / med[first] for b, v in med.items()},
        "same_completions_as_first": {str(b): sum(x == y for x, y in zip(completions[first], c))
                                      for b, c in completions.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
