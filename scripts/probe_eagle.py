"""Probe: how much would an EAGLE-1 draft (one decoder layer over the target's own hidden states) agree with
the target, against the cut draft the preset trains? Prints JSON lines; saves the trained head.

An EAGLE-1 draft (Li et al. 2024; vLLM's ``EagleLlamaForCausalLM``, served as ``method: eagle``) predicts token
t+2 from ``fc(cat(embed(x_{t+1}), h_t))`` -> one Llama decoder layer whose input norm is the identity ->
``hidden + residual`` -> the target's lm_head (no final norm), where h_t is the target's last hidden state
(after its final norm) at position t. It reads what the target already computed, so its first proposal of a
round sees the target's features exactly; its second sees its own output in place of h.

What this measures, on a datagen output (``draftsmith ... stages=[datagen]``), teacher-forced (no decode loop):
- ``step1``: top-1 agreement of the draft with the target's argmax at the next position, over completion
  positions of held-out rows. On rows the target generated greedily this *is* greedy K=1 token acceptance
  (``step1_generated``: the rows whose completion equals the target's own argmax at every position).
- ``step2_given_step1``: agreement of the second proposal (its input feature the draft's own output, the keys
  and values of earlier positions from real features, as in a decode round), counted where the first was right.
- ``expected_acceptance_k2``: (a1 + a1*a2) / 2, the per-token acceptance a K=2 round would see.
Compare with the held-out top-1 of a draft cut from the target, distilled on the same datagen output.

    python scripts/probe_eagle.py --target DIR --data DATAGEN_DIR --train-rows 1200 --steps 600
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
import time

import torch
import torch.nn.functional as F

from draftsmith.decode.eagle import EagleHead, save_eagle
from draftsmith.train.eagle import eagle_loss, shifted, target_features


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the target model's directory (float32 HF layout)")
    ap.add_argument("--data", required=True, help="a datagen output (manifest.json + data/)")
    ap.add_argument("--train-rows", type=int, default=1200)
    ap.add_argument("--heldout-rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--w-reg", type=float, default=1.0, help="weight of the smooth-L1 feature regression term "
                    "(EAGLE-1: 10x the cross-entropy's)")
    ap.add_argument("--second", type=float, default=0.0, help="weight of the second proposal's cross-entropy "
                    "(0: EAGLE-1's loss; 1: trained as a K=2 round makes it)")
    ap.add_argument("--head", type=int, default=8192, help="the draft vocabulary (0: the full head)")
    ap.add_argument("--init-layer", type=int, default=-1, help="the target layer the EAGLE layer starts from")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--features", default=None, help="a file to keep the target's features in (reused when it holds "
                    "these rows of this target and data)")
    ap.add_argument("--save", default=None, help="write the trained head here: a vLLM EAGLE checkpoint directory")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    from draftsmith.artifacts.formats import read_datagen
    from draftsmith.decode.pair import load_model, load_tokenizer
    from draftsmith.decode.vocab import datagen_vocab

    target = load_model(args.target, "target", "float32")
    tok = load_tokenizer(args.target, "target")
    for p in target.parameters():
        p.requires_grad_(False)
    data, _ = read_datagen(args.data)
    g = torch.Generator().manual_seed(args.seed)

    def pick(split, n):
        d = data[split]
        idx = torch.randperm(len(d), generator=g)[:n].tolist()
        return [(d[i]["prompt_ids"], d[i]["completion_ids"]) for i in idx]

    t0 = time.perf_counter()
    train, held = pick("train", args.train_rows), pick("heldout", args.heldout_rows)
    key = {"data": str(Path(args.data).resolve()), "target": str(Path(args.target).resolve()),
           "train_rows": args.train_rows, "heldout_rows": args.heldout_rows, "seed": args.seed}
    cached = torch.load(args.features, weights_only=False) if args.features and Path(args.features).exists() else None
    if cached is not None and cached["key"] == key:
        ftrain, fheld = cached["train"], cached["heldout"]
    else:
        ftrain, fheld = target_features(target, train), target_features(target, held)
        if args.features:
            torch.save({"key": key, "train": ftrain, "heldout": fheld}, args.features)
    tokens = sum(len(it["ids"]) for it in ftrain + fheld)
    seconds = time.perf_counter() - t0
    emit(stage="features", rows=len(ftrain) + len(fheld), tokens=tokens, seconds=round(seconds, 1),
         tokens_per_s=round(tokens / seconds, 1), cached=cached is not None and cached["key"] == key)

    width = target.lm_head.weight.shape[0]
    if args.head:
        vocab, info = datagen_vocab(args.data, args.head, width, tok.eos_token_id)
    else:
        vocab, info = torch.arange(width), {"size": width}
    head_w = target.lm_head.weight.detach()[vocab]  # frozen: the draft vocabulary's rows of the target's head
    emb_w = target.model.embed_tokens.weight.detach()
    head = EagleHead(target, args.init_layer)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    # rows the target wrote greedily: its argmax at every completion position is the next completion token
    generated = {i for i, it in enumerate(fheld)
                 if bool((it["top"][it["prompt_len"] - 1:-1] == it["ids"][it["prompt_len"]:]).all())}

    @torch.no_grad()
    def evaluate(step):
        head.eval()
        hits1 = hits2 = cond = total = gen_hits = gen_total = 0
        for start in range(0, len(fheld), args.batch):
            part = list(range(start, min(start + args.batch, len(fheld))))
            s = shifted([fheld[i] for i in part])
            emb = F.embedding(s.next_ids, emb_w)
            out1, kv = head(emb, s.h, s.pos)
            ok1 = (vocab[(out1 @ head_w.T).argmax(-1)] == s.top_next) & s.completion
            own = torch.zeros_like(s.h)  # slot t+1's second proposal reads the head's output at t
            own[:, 1:] = out1[:, :-1]
            ok2 = (vocab[(head.second(emb, own, s.pos, kv) @ head_w.T).argmax(-1)] == s.top_next) & s.completion
            prev_ok = torch.zeros_like(ok1)
            prev_ok[:, 1:] = ok1[:, :-1]  # the first proposal (slot t) was right: x_{t+2} is the target's token
            hits1 += int(ok1.sum())
            total += int(s.completion.sum())
            cond += int((prev_ok & s.completion).sum())
            hits2 += int((prev_ok & ok2).sum())
            for r, i in enumerate(part):
                if i in generated:
                    gen_hits += int(ok1[r].sum())
                    gen_total += int(s.completion[r].sum())
        head.train()
        a1, a2 = hits1 / max(total, 1), hits2 / max(cond, 1)
        return {"step": step, "step1": round(a1, 4), "step1_generated": round(gen_hits / max(gen_total, 1), 4),
                "generated_rows": len(generated), "step2_given_step1": round(a2, 4),
                "expected_acceptance_k2": round((a1 + a1 * a2) / 2, 4), "positions": total}

    emit(stage="eval", head=int(vocab.numel()), heldout_coverage=info.get("heldout_coverage"), **evaluate(0))
    t0 = time.perf_counter()
    perm, at = torch.randperm(len(ftrain), generator=g).tolist(), 0
    for step in range(1, args.steps + 1):
        if at + args.batch > len(perm):
            perm, at = torch.randperm(len(ftrain), generator=g).tolist(), 0
        batch = shifted([ftrain[i] for i in perm[at:at + args.batch]])
        at += args.batch
        loss, parts = eagle_loss(head, batch, emb_w, head_w, args.w_reg, args.second)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % args.eval_every == 0 or step == args.steps:
            emit(stage="eval", **{k: round(v, 4) for k, v in parts.items()},
                 s_per_step=round((time.perf_counter() - t0) / step, 3), **evaluate(step))
    if args.save:
        save_eagle(args.save, head, source=args.data, target=args.target, steps=args.steps, lr=args.lr,
                   w_reg=args.w_reg, second=args.second, train_rows=len(ftrain))
        emit(stage="saved", path=args.save)


if __name__ == "__main__":
    main()
