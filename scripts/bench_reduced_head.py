"""One training step (forward, loss, backward) of a draft with its full head vs its head restricted to the draft
vocabulary (method.reduced_head), on the same batches.

    python scripts/bench_reduced_head.py --draft DRAFT_DIR --data DATAGEN_DIR --vocab 8192 [--freeze] [--repeats 3]

Interleaved (the order alternates per repeat), `--repeats` passes over 4 batches of 16 training rows, medians;
prints JSON: seconds per step of each, their ratio, and each loss (they differ: the reduced head's softmax and
the teacher are over the vocabulary's ids; tests/test_train_reduced_head.py checks that it is the masked
full-head loss).
"""
import argparse
import json
import statistics
import time

import torch

from draftsmith.artifacts.formats import read_datagen
from draftsmith.decode.pair import load_model
from draftsmith.decode.runners import logit_width
from draftsmith.decode.vocab import datagen_vocab
from draftsmith.train import trainer
from draftsmith.train import distill, loop
from draftsmith.train.checkpoints import latest_checkpoint
from draftsmith.train.data import collate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--freeze", action="store_true", help="freeze the embedding/head (method.freeze_embeddings)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ds, _ = read_datagen(args.data)
    rows = [ds["train"][i] for i in range(64)]
    model = load_model(args.draft, "draft", "float32", "cpu")
    model.train()
    if args.freeze:
        distill.freeze_embeddings(model)
    width = logit_width(model)
    eos = model.generation_config.eos_token_id
    vocab, _ = datagen_vocab(args.data, args.vocab, width, eos)
    cfg = trainer.TrainConfig(data_dir="d", draft="x", out_dir="o", loss="fkl", teacher="cached")
    times = {"full": [], "reduced": []}
    losses = {"full": [], "reduced": []}
    for rep in range(args.repeats):
        for b in range(0, 64, 16):
            batch = collate(rows[b:b + 16], 2, None, True)
            for name in (("full", "reduced") if rep % 2 == 0 else ("reduced", "full")):
                ids = vocab if name == "reduced" else None
                model.zero_grad(set_to_none=True)
                started = time.perf_counter()
                loss, _ = distill.batch_loss(cfg, distill.loss_logits(model, batch, ids), batch, None, width, ids)
                loss.backward()
                times[name].append(time.perf_counter() - started)
                losses[name].append(loss.item())
    full, reduced = statistics.median(times["full"]), statistics.median(times["reduced"])
    print(json.dumps({"draft": args.draft, "vocab": int(vocab.numel()), "freeze": args.freeze,
                      "threads": torch.get_num_threads(), "steps_each": len(times["full"]),
                      "full_s": round(full, 4), "reduced_s": round(reduced, 4), "ratio": round(full / reduced, 3),
                      "loss_full_median": round(statistics.median(losses["full"]), 4),
                      "loss_reduced_median": round(statistics.median(losses["reduced"]), 4)}, indent=1))


if __name__ == "__main__":
    main()
