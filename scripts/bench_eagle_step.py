"""One EAGLE-head training step (train/eagle.py ``eagle_loss`` + backward + AdamW) as the train stage ran it
before (float32, AdamW unfused), with the fused AdamW of train/loop.py ``new_optimizer``, and with that under
bf16 autocast (``method.mixed_precision=bf16``), side by side.

The head is built over a target of the given shape (default: SmolLM2-135M's: hidden 576, 9 heads / 3 KV heads,
MLP 1536, vocab 49152) with random weights, its loss over the first `--vocab` rows of the head (the preset's
8192-id draft vocabulary); a batch of `--rows` rows of random features whose lengths are drawn from a datagen
output's rows (`--data`: the preset's are 48-317 tokens, median 97) or uniformly in [--min-len, --max-len].
Steps alternate between the variants (the order rotated per repeat); prints JSON with the median seconds per step
of each, their ratios to the first, and each variant's loss on one batch from one starting head (how far bf16
rounds the loss).

    python scripts/bench_eagle_step.py --data runs/smollm2-135m/datagen --repeats 7
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--target-vocab", type=int, default=49152)
    ap.add_argument("--vocab", type=int, default=8192, help="rows of the head the loss runs over")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=60)
    ap.add_argument("--max-len", type=int, default=150)
    ap.add_argument("--data", help="a datagen output whose row lengths (prompt + completion) the batch takes")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.decode.eagle import EagleHead
    from draftsmith.train.eagle import eagle_loss, shifted
    from draftsmith.train.loop import new_optimizer
    from draftsmith.train.settings import TrainConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.target_vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=1, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         tie_word_embeddings=True, max_position_embeddings=4096)
    target = LlamaForCausalLM(config).eval()
    target.requires_grad_(False)
    emb_w = target.get_input_embeddings().weight.detach()
    head_w = target.get_output_embeddings().weight.detach()[:args.vocab]
    lengths = None
    if args.data:
        from draftsmith.train.datagen import load_output

        train = load_output(args.data)[0]["train"]
        lengths = [len(p) + len(c) for p, c in zip(train["prompt_ids"], train["completion_ids"])]
    items = []
    for _ in range(args.rows):
        n = (lengths[int(torch.randint(len(lengths), (1,)))] if lengths
             else int(torch.randint(args.min_len, args.max_len + 1, (1,))))
        items.append({"ids": torch.randint(0, args.target_vocab, (n,)), "h": torch.randn(n, args.hidden),
                      "top": torch.randint(0, args.vocab, (n,)), "prompt_len": n // 3})
    batch = shifted(items)
    start = EagleHead(target)
    variants = {"float32, AdamW unfused": (False, False), "float32, AdamW fused": (False, True),
                "bf16, AdamW fused": (True, True)}
    heads = {name: copy.deepcopy(start).train() for name in variants}
    optims = {}
    for name, (_, fused) in variants.items():
        params = [p for p in heads[name].parameters() if p.requires_grad]
        optims[name] = (new_optimizer(params, TrainConfig(data_dir="", draft="", out_dir="", lr=1e-4)) if fused
                        else torch.optim.AdamW(params, lr=1e-4))

    def step(name: str) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variants[name][0]):
            loss, _ = eagle_loss(heads[name], batch, emb_w, head_w)
        loss.backward()
        optims[name].step()
        optims[name].zero_grad(set_to_none=True)
        return float(loss.detach())

    first = {name: step(name) for name in variants}  # also the warm-up: the same batch from the same head
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            began = time.perf_counter()
            step(name)
            seconds[name].append(time.perf_counter() - began)
    med = {name: statistics.median(s) for name, s in seconds.items()}
    base = names[0]
    report = {"shape": {"hidden": args.hidden, "intermediate": args.intermediate, "vocab": args.vocab,
                        "rows": args.rows, "slots": int(batch.valid.numel()), "tokens": int(batch.valid.sum())},
              "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "s_per_step": {name: round(v, 4) for name, v in med.items()},
              f"speedup_over_{base.replace(', ', '_').replace(' ', '_')}": {name: round(med[base] / v, 3)
                                                                             for name, v in med.items()},
              "seconds": {name: [round(x, 4) for x in s] for name, s in seconds.items()},
              "first_loss": {name: round(v, 5) for name, v in first.items()}}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
