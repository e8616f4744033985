"""A draft head's proposal cost in the decode's round pattern, with each product form for its matrices (CPU).

    python scripts/bench_head_step.py --target TARGET_DIR --head HEAD_DIR [--k 2] [--context 200] [--repeats 30]

The head (an EAGLE-3 folder, or an EAGLE-1 head with its draft vocabulary) runs in its decode-time runner
(decode/eagle3.py ``Eagle3Runner``, decode/eagle.py ``EagleRunner``): after `--context` cached positions, each
repeat times a plain target step, a verification forward of K+1 tokens (which streams the target's weights, so the
head's are read from memory as in a decode), then the round's K proposals: the real slots (two: one accepted
draft and the bonus token, their features through ``fc``; a decode fuses the K+1 verified positions' features) and
K-1 speculative slots, each scored over the draft vocabulary and its argmax taken. The proposals run once with
``F.linear`` for every product (``products`` left out) and once with the target's lean forward's measured form
(``LeanModel.block_product``, what a decode hands the runner), in alternating order; the rest of the runner (the
grouped KV cache, the rotary table) is the same for both, so the ratio is the product form's alone. Prints JSON:
the medians of per-repeat ratios c = (proposal seconds / K) / plain step per form, the milliseconds behind them,
their ratio, and whether the two forms proposed the same tokens.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def _round(runner, fuse, one_aux, tokens, p: int, k: int) -> tuple[float, list[int]]:
    """Seconds of one round's K proposals after `p` cached slots; the cache is cropped back after."""
    started = time.perf_counter()
    hidden = runner.forward(tokens[:2], fuse(one_aux))[-1:]  # the real slots the last round accepted
    proposed = [int(runner.logits(hidden)[-1].argmax())]
    for i in range(1, k):
        hidden = runner.forward(tokens[1 + i: 2 + i], hidden)
        proposed.append(int(runner.logits(hidden)[-1].argmax()))
    seconds = time.perf_counter() - started
    runner.crop(p)
    return seconds, proposed


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True, help="an EAGLE-3 folder or an EAGLE-1 head")
    ap.add_argument("--vocab", help="an EAGLE-1 head's draft vocabulary (a datagen output's draft_vocab file)")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)

    from draftsmith.decode.eagle import EagleRunner, load_eagle
    from draftsmith.decode.eagle3 import Eagle3Runner, is_eagle3_dir, load_eagle3
    from draftsmith.decode.lean import LeanModel
    from draftsmith.decode.pair import load_model
    from draftsmith.decode.runners import logit_width

    target = load_model(args.target, "target", "float32", "cpu")
    embed = target.get_input_embeddings().weight
    capacity = args.context + args.k + 8
    tgt = LeanModel(target, capacity=capacity)
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, embed.shape[0], (1, args.context), generator=gen)
    tokens = torch.randint(0, embed.shape[0], (args.k + 2,), generator=gen)
    if is_eagle3_dir(args.head):
        head = load_eagle3(args.head, target)
        tgt.keep_layers = tuple(head.layers)

        def make(products):
            return Eagle3Runner(head, embed, logit_width(target), capacity, products=products)

        feature_width = len(head.layers) * head.target_hidden
    else:
        from draftsmith.decode.vocab import load_vocab

        head = load_eagle(args.head, target)
        vocab = load_vocab(args.vocab) if args.vocab else None
        tgt.keep_features = True

        def make(products):
            return EagleRunner(head, embed, target.get_output_embeddings().weight, capacity, vocab=vocab,
                               products=products)

        feature_width = head.h
    forms = {"F.linear": None, "lean": tgt.block_product}
    one = context[:, -1:]
    ratios = {name: [] for name in forms}
    ms = {name: [] for name in forms}
    plain_ms, proposals = [], {name: [] for name in forms}
    with torch.inference_mode():
        tgt.forward(context, keep=1)
        runners, fuses = {}, {}
        for name, products in forms.items():
            runner = runners[name] = make(products)
            fuses[name] = getattr(runner, "fuse", lambda aux: aux)
            runner.forward(context[0, 1:], fuses[name](torch.zeros(args.context - 1, feature_width)))
        aux = torch.randn(2, feature_width, generator=gen)
        for r in range(args.repeats + 2):  # two warm-up repeats
            started = time.perf_counter()
            tgt.forward(one, keep=1)
            plain = time.perf_counter() - started
            tgt.crop(args.context)
            for name in (list(forms) if r % 2 else list(forms)[::-1]):
                tgt.forward(one.repeat(1, args.k + 1), keep=args.k + 1)  # the verification before the round
                tgt.crop(args.context)
                seconds, proposed = _round(runners[name], fuses[name], aux, tokens, args.context - 1, args.k)
                if r >= 2:
                    ratios[name].append(seconds / args.k / plain)
                    ms[name].append(seconds / args.k * 1e3)
                    proposals[name].append(proposed)
            if r >= 2:
                plain_ms.append(plain * 1e3)
    c = {name: statistics.median(v) for name, v in ratios.items()}
    out = {"target": args.target, "head": args.head, "k": args.k, "context": args.context, "repeats": args.repeats,
           "threads": torch.get_num_threads(), "machine": platform.machine(),
           "lean_forms": tgt.chosen_forms(),
           "plain_step_ms": round(statistics.median(plain_ms), 3),
           "proposal_ms": {name: round(statistics.median(v), 3) for name, v in ms.items()},
           "c": {name: round(v, 4) for name, v in c.items()},
           "c_ratio_lean_over_linear": round(c["lean"] / c["F.linear"], 3),
           "same_proposals": proposals["lean"] == proposals["F.linear"]}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
