"""Held-out metrics of several trained EAGLE heads on the same rows: one datagen output's held-out split.

The train stage scores each head on the first ``method.eval_rows`` held-out rows of its own datagen output, so two
heads trained on different data (more prompts, more passages) are scored on different rows and their figures do
not compare. This script scores every head on one output's held-out rows with the train stage's own
``evaluate_head`` (top-1 agreement with the target's argmax at completion slots, expected acceptance, the second
proposal's agreement), each head on its own draft vocabulary (ranked from the datagen output it was trained on,
as ``method.reduced_head`` trained it and draftsmith's loop serves it), or on the full head.

    python scripts/compare_eagle_heads.py --data runs/x/datagen --rows 64 runs/a/train/draft runs/b/train/draft

Prints JSON: the rows, and per head its metrics, the step it was kept at and the data it was trained on.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> dict:
    from draftsmith.decode.eagle import load_eagle
    from draftsmith.decode.eos import pretrained_eos_ids
    from draftsmith.decode.pair import load_model, load_tokenizer
    from draftsmith.decode.runners import logit_width
    from draftsmith.decode.vocab import datagen_vocab
    from draftsmith.train.datagen import load_output
    from draftsmith.train.eagle import target_features
    from draftsmith.train.eagle_objective import evaluate_head
    from draftsmith.train.features import split_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+", help="EAGLE head directories (a train stage's draft/)")
    ap.add_argument("--data", required=True, help="the datagen output whose held-out rows every head is scored on")
    ap.add_argument("--rows", type=int, default=64, help="the first N held-out rows (the train stage's eval_rows)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    infos = {}
    for head_dir in args.heads:
        path = Path(head_dir) / "draftsmith_eagle.json"
        if not path.exists():
            raise SystemExit(f"{head_dir}: no draftsmith_eagle.json: not an EAGLE head written by the train stage")
        infos[head_dir] = json.loads(path.read_text())
    targets = {info["target"] for info in infos.values()}
    if len(targets) != 1:
        raise SystemExit(f"the heads were trained for different targets {sorted(targets)}: compare heads of one target")
    target_path = targets.pop()
    ds, _ = load_output(args.data)
    heldout = ds["heldout"].select(range(min(args.rows, len(ds["heldout"]))))
    tokenizer = load_tokenizer(target_path, "target")
    target = load_model(target_path, "target", "float32", "cpu")
    target.requires_grad_(False)
    feats = target_features(target, split_rows(heldout, None))
    full_w = target.get_output_embeddings().weight.detach()
    emb_w = target.get_input_embeddings().weight.detach()
    width = logit_width(target)
    eos = sorted(pretrained_eos_ids(target_path, tokenizer))

    out = {"data": str(args.data), "rows": len(feats), "heads": {}}
    for head_dir, info in infos.items():
        head = load_eagle(head_dir, target)
        if info.get("draft_vocab"):
            vocab, _ = datagen_vocab(info["data"], info["draft_vocab"], width, eos, key="the head's draft_vocab")
        else:
            vocab = torch.arange(width)
        metrics = evaluate_head(head, feats, emb_w, full_w[vocab], full_w, vocab, args.batch_size,
                                info.get("w_reg", 1.0), info.get("second", 0.0), info.get("loss_on", "all"))
        n, p = metrics["heldout/positions"], metrics["heldout/top1_agreement"]
        metrics["top1_standard_error"] = math.sqrt(p * (1 - p) / n) if n else None
        out["heads"][head_dir] = {**metrics, "step": info.get("step"), "trained_on": info.get("data"),
                                  "train_rows": info.get("train_rows"), "noise": info.get("noise", 0.0)}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
