"""One EAGLE-3 training step (the training-time test's loss + backward + AdamW) with the unrolled steps over whole
rows (decode/eagle3.py ``Eagle3Head.ttt``) and over the completion's slots only (``ttt_window``, what
train/eagle3.py ``eagle3_loss`` runs for ``method.eagle_loss_on=completion``), side by side.

The head is built over a target of the given shape (default: SmolLM2-135M's: hidden 576, 9 heads / 3 KV heads,
MLP 1536, vocab 49152, 30 layers' features; random weights) with a `--vocab`-id draft vocabulary (default 8192,
the preset's until 2026-12-06; 4096 since); a batch of `--rows` rows of random features whose prompt and completion lengths are drawn from a datagen
output's rows (`--data`) or set by --prompt-len / --completion-len. Both variants start from one head and take
the same batch; steps alternate (the order rotated per repeat), under `--precision` (bf16 autocast, as
``method.mixed_precision=auto`` trains on a CPU with AMX, or float32). Prints JSON: median seconds per step, the
ratio whole / window, and both losses on the first step (equal up to rounding: the same sum).

    python scripts/bench_eagle3_step.py --data runs/smollm2-135m/datagen --steps 2 --repeats 7

With ``--compare-vocab N`` it compares draft vocabularies instead: the completion-window step of a head over
``--vocab`` ids against one over N ids (``method.draft_vocab``), same batch, alternating; the JSON gives their
ratio (``first_over_second``) in place of ``whole_over_window``.

    python scripts/bench_eagle3_step.py --data OUT/datagen --precision float32 --compare-vocab 4096 --repeats 9
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
import torch.nn.functional as F  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=30, help="the target's layers (the head reads 3 of them)")
    ap.add_argument("--target-vocab", type=int, default=49152)
    ap.add_argument("--vocab", type=int, default=8192, help="the head's draft vocabulary")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--data", help="a datagen output whose rows' prompt and completion lengths the batch takes")
    ap.add_argument("--steps", type=int, default=2, help="unrolled steps of the training-time test")
    ap.add_argument("--precision", choices=["bf16", "float32"], default="bf16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--compare-vocab", type=int, help="compare the window step at --vocab ids with one at this many")
    args = ap.parse_args(argv)

    from draftsmith.decode.eagle3 import Eagle3Head, default_layers
    from draftsmith.train.eagle3 import eagle3_loss, shifted3, ttt_loss
    from draftsmith.train.loop import new_optimizer
    from draftsmith.train.settings import TrainConfig

    torch.manual_seed(0)
    cfg = {"hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
           "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads, "rms_norm_eps": 1e-5,
           "vocab_size": args.target_vocab, "rope_theta": 100000.0}
    layers = default_layers(args.layers)
    start = Eagle3Head(cfg, layers, torch.arange(args.vocab))
    emb_w = torch.randn(args.target_vocab, args.hidden) * 0.02
    full_w = torch.randn(args.target_vocab, args.hidden) * 0.02
    shapes = None
    if args.data:
        from draftsmith.train.datagen import load_output

        train = load_output(args.data)[0]["train"]
        shapes = [(len(p), len(c)) for p, c in zip(train["prompt_ids"], train["completion_ids"])]
    items = []
    for _ in range(args.rows):
        p, c = (shapes[int(torch.randint(len(shapes), (1,)))] if shapes else (args.prompt_len, args.completion_len))
        n = p + c
        items.append({"ids": torch.randint(0, args.target_vocab, (n,)), "aux": torch.randn(n, 3 * args.hidden),
                      "h": torch.randn(n, args.hidden), "top": torch.randint(0, args.vocab, (n,)), "prompt_len": p})
    batch = shifted3(items)
    bf16 = args.precision == "bf16"

    def whole(head):
        outs = head(batch.aux, F.embedding(batch.next_ids, emb_w), batch.pos, args.steps)
        return ttt_loss(head, outs, batch, full_w, 0.8, "completion")[0]

    def window(head):
        return eagle3_loss(head, batch, emb_w, full_w, args.steps, 0.8, "completion")[0]

    variants = {"whole rows": whole, "completion window": window}
    heads = {name: copy.deepcopy(start).train() for name in variants}
    if args.compare_vocab:
        torch.manual_seed(0)
        variants = {f"vocab {args.vocab}": window, f"vocab {args.compare_vocab}": window}
        heads = {f"vocab {args.vocab}": copy.deepcopy(start).train(),
                 f"vocab {args.compare_vocab}": Eagle3Head(cfg, layers, torch.arange(args.compare_vocab)).train()}
    optims = {name: new_optimizer(list(heads[name].parameters()),
                                  TrainConfig(data_dir="", draft="", out_dir="", lr=1e-4)) for name in variants}

    def step(name: str) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = variants[name](heads[name])
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
    report = {"shape": {"hidden": args.hidden, "vocab": args.vocab, "rows": args.rows, "ttt_steps": args.steps,
                        "slots": int(batch.valid.numel()), "tokens": int(batch.valid.sum()),
                        "completion_slots": int((batch.valid & batch.completion).sum())},
              "precision": args.precision, "threads": torch.get_num_threads(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "s_per_step": {name: round(v, 4) for name, v in med.items()},
              **({"first_over_second": round(med[names[0]] / med[names[1]], 3)} if args.compare_vocab else
                 {"whole_over_window": round(med["whole rows"] / med["completion window"], 3)}),
              "seconds": {name: [round(x, 4) for x in s] for name, s in seconds.items()},
              "first_loss": {name: round(v, 5) for name, v in first.items()}}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
