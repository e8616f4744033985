"""Benchmark draftsmith's speculative loop against an earlier revision of itself: a refactor of decode/loop.py must
not cost speed or change an output.

Prints one JSON document. The earlier revision is a copy of decode/loop.py from another commit (``git show
REV:decode/loop.py > old_loop.py``), imported beside the installed one; both decode the same held-out prompts of a
datagen output with the same models, K and draft vocabulary, greedy, no EOS stop, alternating which goes first
per prompt, for `--repeats` passes. Per loop (an EAGLE head with ``--eagle``: ``eagle_generate``; a draft model
with ``--draft``: ``speculative_generate``) and K: the new revision's seconds / the old one's per pass (median over
passes, each pass's kept), whether every output of the two is equal, and whether their decodes went alike:
the same rounds, draft forwards and accepted tokens per draft position (greedy outputs are the target's whatever
the proposer does; these are not).

    git show HEAD~1:decode/loop.py > /tmp/old_loop.py
    python scripts/bench_loop_revision.py --old /tmp/old_loop.py --target DIR --eagle DIR --data DATAGEN_DIR --k 1 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from draftsmith.decode import loop as new_loop  # noqa: E402
from draftsmith.decode.eagle import load_eagle  # noqa: E402
from draftsmith.decode.pair import load_model, load_tokenizer  # noqa: E402
from draftsmith.decode.vocab import datagen_vocab  # noqa: E402
from draftsmith.eval.runner import heldout_prompts  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a copy of decode/loop.py from the revision to compare with")
    ap.add_argument("--target", required=True)
    ap.add_argument("--eagle", help="an EAGLE head's checkpoint: times eagle_generate")
    ap.add_argument("--eagle3", help="an EAGLE-3 folder: times eagle3_generate (its own vocabulary; the runner is the "
                    "installed decode/eagle3.py's on both sides: only the loop is compared)")
    ap.add_argument("--draft", help="a draft model: times speculative_generate")
    ap.add_argument("--ngram", action="store_true", help="times ngram_generate (prompt lookup, window 2-4)")
    ap.add_argument("--data", required=True, help="a datagen output: its held-out prompts, its draft vocabulary")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="0: the full head")
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args(argv)


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("draftsmith_old_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode_of(stats) -> tuple:
    """What two decodes of one prompt share when their loops are equivalent, beside the output."""
    return (stats.rounds, stats.target_forwards, stats.draft_forwards, stats.drafted, stats.accepted,
            tuple(stats.accepted_per_position), tuple(stats.drafted_per_position))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not (args.eagle or args.draft or args.eagle3 or args.ngram):
        raise SystemExit("bench_loop_revision.py: give --eagle DIR, --eagle3 DIR, --draft DIR and/or --ngram")
    old_loop = load_old(args.old)
    target = load_model(args.target, "target", "float32")
    tok = load_tokenizer(args.target, "target")
    width = target.get_output_embeddings().weight.shape[0]
    vocab = datagen_vocab(args.data, args.draft_vocab, width, tok.eos_token_id)[0] if args.draft_vocab else None
    prompts = heldout_prompts(args.data, args.prompts)
    sides = {}
    if args.eagle:
        head = load_eagle(args.eagle, target)
        sides["eagle"] = (lambda mod, p, k: mod.eagle_generate(target, head, p, k=k, max_new_tokens=args.max_new_tokens,
                                                               draft_vocab=vocab))
    if args.eagle3:
        from draftsmith.decode.eagle3 import load_eagle3

        head3 = load_eagle3(args.eagle3, target)
        sides["eagle3"] = (lambda mod, p, k: mod.eagle3_generate(target, head3, p, k=k,
                                                                 max_new_tokens=args.max_new_tokens))
    if args.draft:
        draft = load_model(args.draft, "draft", "float32")
        sides["draft"] = (lambda mod, p, k: mod.speculative_generate(target, draft, p, k=k,
                                                                     max_new_tokens=args.max_new_tokens,
                                                                     draft_vocab=vocab))
    if args.ngram:
        from draftsmith.decode.ngram import DEFAULT

        sides["ngram"] = (lambda mod, p, k: mod.ngram_generate(target, DEFAULT, p, k=k,
                                                               max_new_tokens=args.max_new_tokens))
    for run in sides.values():  # warm-up
        for mod in (old_loop, new_loop):
            run(mod, prompts[0], args.k[0])
    cells = {(name, k): {"old_s": [], "new_s": [], "equal": True, "same_decode": True} for name in sides
             for k in args.k}
    for r in range(args.repeats):
        for (name, k), cell in cells.items():
            old_s = new_s = 0.0
            for i, prompt in enumerate(prompts):
                order = (old_loop, new_loop) if (i + r) % 2 == 0 else (new_loop, old_loop)
                outs = {}
                for mod in order:
                    start = time.perf_counter()
                    outs[mod is new_loop] = sides[name](mod, prompt, k)
                    seconds = time.perf_counter() - start
                    if mod is new_loop:
                        new_s += seconds
                    else:
                        old_s += seconds
                cell["equal"] &= torch.equal(outs[True].sequences, outs[False].sequences)
                cell["same_decode"] &= decode_of(outs[True].stats) == decode_of(outs[False].stats)
            cell["old_s"].append(old_s)
            cell["new_s"].append(new_s)
    report = {"old": args.old, "target": args.target, "eagle": args.eagle, "eagle3": args.eagle3, "draft": args.draft,
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "draft_vocab": args.draft_vocab,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "cells": [{"loop": name, "k": k, "new_over_old": statistics.median(n / o for n, o in
                                                                                  zip(c["new_s"], c["old_s"])),
                         "per_pass": [round(n / o, 4) for n, o in zip(c["new_s"], c["old_s"])],
                         "old_s": c["old_s"], "new_s": c["new_s"], "outputs_equal": c["equal"],
                         "same_rounds_forwards_and_acceptance": c["same_decode"]}
                        for (name, k), c in cells.items()]}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
