"""Benchmark the target's feature pass of an EAGLE-3 head's training (train/eagle3.py target_aux_rows): float32
against the training's bf16 autocast (train/features.py computes the training rows' features under it), on the rows
of a datagen output. Prints JSON: seconds of each (repeats interleaved), tokens/s, the bf16 / float32 speed ratio of
the medians, how far the bf16 features are from float32's (the median relative error of a row, the largest over the
rows) and how often the target's argmax agrees.

    python scripts/bench_features.py --target TARGET_DIR --data OUT/datagen --rows 128

With ``--compare argmax`` it measures the pass with the target's argmax over its full head (``top=True``, what the
held-out rows need) against without it (the training rows: the loss does not read it), both in float32, as on a
host without native bf16: seconds, the speed ratio, and whether the features are equal.

    python scripts/bench_features.py --target TARGET_DIR --data OUT/datagen --rows 128 --compare argmax
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target's folder (a transformers checkpoint)")
    ap.add_argument("--data", required=True, help="a datagen output folder (OUT/datagen)")
    ap.add_argument("--rows", type=int, default=128, help="training rows measured")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compare", choices=["precision", "argmax"], default="precision",
                    help="float32 vs bf16 autocast (default), or with vs without the target's argmax (float32)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.artifacts.formats import read_datagen
    from draftsmith.decode.eagle3 import default_layers
    from draftsmith.train.eagle3 import target_aux_rows
    from draftsmith.train.features import split_rows

    ds = read_datagen(args.data)[0]["train"]
    rows = split_rows(ds.select(range(min(args.rows, len(ds)))), None)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    model.requires_grad_(False)  # as the train stage holds it (autocast then casts the weights on every batch)
    layers = default_layers(model.config.num_hidden_layers)
    if args.compare == "argmax":
        return compare_argmax(model, rows, layers, args)
    seconds: dict[str, list[float]] = {"float32": [], "bf16": []}
    out = {}
    for _ in range(args.repeats):
        for kind in ("float32", "bf16"):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "bf16"):
                out[kind] = target_aux_rows(model, rows, layers)
            seconds[kind].append(time.perf_counter() - start)
    tokens = sum(len(r["ids"]) for r in out["float32"])

    def rel(key):
        return max(((a[key] - b[key].float()).norm(dim=-1) / a[key].norm(dim=-1)).median().item()
                   for a, b in zip(out["float32"], out["bf16"]))

    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(json.dumps({
        "target": args.target, "rows": len(rows), "tokens": tokens, "layers": layers, "threads": torch.get_num_threads(),
        "seconds": seconds, "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "bf16_over_float32_speed": med["float32"] / med["bf16"],
        "max_row_median_relative_error": {"aux": rel("aux"), "h": rel("h")},
        "argmax_agreement": sum(int((a["top"] == b["top"]).sum()) for a, b in zip(out["float32"], out["bf16"])) / tokens,
    }, indent=1))


def compare_argmax(model, rows, layers, args) -> None:
    import torch

    from draftsmith.train.eagle3 import target_aux_rows

    seconds: dict[str, list[float]] = {"with argmax": [], "without": []}
    out = {}
    for r in range(args.repeats):
        for kind in (("with argmax", "without") if r % 2 == 0 else ("without", "with argmax")):
            start = time.perf_counter()
            out[kind] = target_aux_rows(model, rows, layers, top=kind == "with argmax")
            seconds[kind].append(time.perf_counter() - start)
    tokens = sum(len(r["ids"]) for r in out["without"])
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(json.dumps({
        "target": args.target, "rows": len(rows), "tokens": tokens, "layers": layers, "threads": torch.get_num_threads(),
        "seconds": seconds, "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "without_over_with_speed": med["with argmax"] / med["without"],
        "features_equal": all(torch.equal(a["aux"], b["aux"]) and torch.equal(a["h"], b["h"])
                              for a, b in zip(out["with argmax"], out["without"])),
    }, indent=1))


if __name__ == "__main__":
    main()
