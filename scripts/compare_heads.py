"""Drafts side by side in draftsmith's loop at batch 1: one eval (eval/runner.py, the eval stage's code) over the
same held-out prompts for every draft and K, interleaved prompt by prompt, one plain run per prompt serving as every
cell's baseline; prints JSON per draft and K: speedup and its 95% interval, token acceptance, per-position
acceptance, tau, c and c_v, greedy equality; and the product forms the lean forward measured in the process (the
plain baseline's speed depends on them). Drafts may be draft models, EAGLE-1 heads or EAGLE-3 folders (read from
each directory).

    python scripts/compare_heads.py --target DIR --data DATAGEN_DIR --draft eagle1=DIR eagle3=DIR --k 1 2 3 \\
        --prompts 12 --max-new-tokens 64 --draft-vocab 8192 --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True, help="a datagen output: its held-out prompts")
    ap.add_argument("--draft", nargs="+", required=True, help="NAME=DIR ...")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-vocab", type=int, default=0, help="eval.draft_vocab for draft models and EAGLE-1 heads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="the eval's output folder (default: a temporary one)")
    args = ap.parse_args(argv)

    from draftsmith.eval.runner import EvalConfig
    from draftsmith.eval.runner import run as run_eval

    drafts = dict(d.split("=", 1) for d in args.draft)
    out = args.out or tempfile.mkdtemp(prefix="compare-heads-")
    metrics = run_eval(EvalConfig(target=args.target, drafts=drafts, data_dir=args.data, out_dir=out, k=list(args.k),
                                  temperature=[0.0], max_new_tokens=args.max_new_tokens, max_prompts=args.prompts,
                                  draft_vocab=args.draft_vocab, repeats=args.repeats, hf_ab=False))
    rows = {}
    for r in metrics["records"]:
        rows.setdefault(r["draft"], {})[r["k"]] = {
            "speedup": r["speedup"], "speedup_ci95": r.get("speedup_ci95"), "token_acceptance": r["token_acceptance"],
            "per_position_acceptance": r["per_position_acceptance"], "tau": r["mean_accepted_tokens"],
            "c": r["c"], "c_v": r["c_v"], "greedy_match": r["greedy_match"], "repeats": r["repeats"],
            "backend": r["backend"]}
    report = {"target": args.target, "drafts": drafts, "settings": vars(args), "machine": platform.machine(),
              "per_draft": rows, "block_forms": metrics["block_forms"], "out_dir": out}
    print(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
