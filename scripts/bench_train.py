"""Benchmark draft training throughput: online teacher (target forward in the loop) vs cached top-k.

Builds one datagen output with top-k log-probs from the demo target (or --target), then trains
the same draft initialisation for the same steps with each teacher, alternating, and prints JSON
with training tokens/s (completion tokens per second) per mode, medians over repeats.

    python scripts/bench_train.py --steps 20 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.demo import DraftSpec, build_demo_target, demo_prompts, make_model  # noqa: E402
from draftsmith.train import datagen, trainer  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target dir (default: the demo target)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    target = args.target or str(build_demo_target(log=lambda m: print(m, file=sys.stderr)))
    tokenizer = AutoTokenizer.from_pretrained(target)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jsonl = tmp / "prompts.jsonl"
        jsonl.write_text("".join(json.dumps({"prompt": tokenizer.decode(p[0])}) + "\n"
                                 for p in demo_prompts(tokenizer, args.prompts, 48, seed=3)))
        datagen.run(datagen.DatagenConfig(target=target, prompts=str(jsonl), out_dir=str(tmp / "data"),
                                          max_new_tokens=48, batch_size=32, top_k_logprobs=args.top_k,
                                          max_prompt_tokens=256))
        make_model(DraftSpec().model, tokenizer, 128, seed=1).save_pretrained(tmp / "init")
        tokenizer.save_pretrained(tmp / "init")
        rates = {"online": [], "cached": []}
        for rep in range(args.repeats):
            for teacher in ("online", "cached") if rep % 2 == 0 else ("cached", "online"):
                metrics = trainer.run(trainer.TrainConfig(
                    data_dir=str(tmp / "data"), draft=str(tmp / "init"), target=target, out_dir=str(tmp / f"t{rep}{teacher}"),
                    loss="fkl", teacher=teacher, steps=args.steps, batch_size=args.batch_size, eval_every=0,
                    save_every=0, device="cpu"))
                rates[teacher].append(metrics["train_tokens_per_s"])
    tps = {k: statistics.median(v) for k, v in rates.items()}
    report = {"target": target, "settings": vars(args), "train_tokens_per_s": tps, "all_repeats": rates,
              "cached_vs_online": tps["cached"] / tps["online"]}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
