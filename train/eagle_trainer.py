"""train, ``method.finetune=eagle``: an EAGLE-1 head (decode/eagle.py) trained on the target's own features.

The same stage contract as train/trainer.py (what it reads, what it writes, resume, early stopping, the best
held-out checkpoint kept), with a head in place of a draft model:

    draft/              the head: vLLM's EAGLE layout (config.json naming EagleLlamaForCausalLM, model.safetensors
                        with fc + one layer, no embedding or lm_head: the target's are shared), draftsmith_eagle.json
                        (how it was trained), and the target's tokenizer (the head proposes the target's ids)
    checkpoints/step_N/ accelerate ``save_state`` checkpoints; ``resume`` continues from the last
    features.pt         the target's teacher-forced features of the rows (computed once, kept for a resume; deleted
                        when the stage completes)
    train_metrics.json  loss curve and periodic held-out metrics
    manifest.json       resolved config, inputs, provenance; written last, it marks completion

The teacher is the target itself: one teacher-forced forward over every datagen row (prompt + completion) gives
its post-norm features h_t, and the distribution at t+1 is its head over h_{t+1}; so ``method.loss``,
``method.teacher`` and datagen's stored top-k do not apply. The loss is train/eagle.py ``eagle_loss``: soft
cross-entropy on the draft vocabulary (``method.reduced_head`` with ``eval.draft_vocab``: the ids draftsmith's
loop proposes from, ranked as for a draft model; vLLM's EAGLE proposes over the target's full head, whose other
rows the cross-entropy then never pushes towards or away, so the hidden state is trained for those ids only;
else the full head), plus ``method.eagle_w_reg`` x the feature regression, plus ``method.eagle_second`` x the
second proposal's cross-entropy, over every slot or the completion's only (``method.eagle_loss_on``), the features
the head reads jittered by ``method.eagle_noise`` (uniform, training steps only). The head
starts from ``cfg.draft`` when that is an EAGLE head's directory (a production head trained further on new data:
the monitor's retrain command), else from the target's last layer (decode/eagle.py ``EagleHead``). Held-out
metrics at completion slots, where a decode round proposes: ``top1_agreement`` (the head's argmax is the target's: greedy K=1 token
acceptance on rows the target wrote greedily), ``expected_acceptance`` (sum min(p, q), p the target's full
distribution) and ``step2_given_step1``.

The features live in memory (float32, rows x tokens x hidden: 0.5 GB for the SmolLM2 preset's 2,000 rows).
Every process computes them all and the main one writes ``features.pt``; a multi-process run shards the batches
as train/trainer.py does.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.artifacts import atomic_dir, provenance, write_json
from draftsmith.decode.eagle import EagleHead, is_eagle_dir, load_eagle, save_eagle
from draftsmith.decode.eos import pretrained_eos_ids
from draftsmith.decode.pair import load_model, load_tokenizer
from draftsmith.decode.runners import logit_width
from draftsmith.decode.vocab import datagen_vocab
from draftsmith.train.checkpoints import latest_checkpoint, load_best_params, save_checkpoint
from draftsmith.train.data import batch_indices
from draftsmith.train.eagle import Shifted, eagle_loss, shifted, target_features

FEATURES = "features.pt"
FEATURES_FORMAT = 1  # bump when what features.pt holds changes: older files are then computed again


def _rows(split, max_len: int | None) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, completion_ids) of a datagen split, cut to `max_len` tokens in all (method.max_len)."""
    out = []
    for row in split:
        prompt, completion = list(row["prompt_ids"]), list(row["completion_ids"])
        if max_len is not None:
            prompt = prompt[:max_len]
            completion = completion[:max(0, max_len - len(prompt))]
        if len(prompt) + len(completion) >= 2:
            out.append((prompt, completion))
    return out


def features_key(cfg, n_train: int, n_heldout: int) -> dict:
    """What makes ``features.pt`` reusable: the format, the datagen output (its path and the sha256 of its
    manifest.json, which a regenerated output at the same path changes: its timings, counts, config), the target,
    the rows."""
    import hashlib

    from draftsmith.artifacts.formats import DATAGEN_MANIFEST

    manifest = hashlib.sha256((Path(cfg.data_dir) / DATAGEN_MANIFEST).read_bytes()).hexdigest()
    return {"format": FEATURES_FORMAT, "data": str(Path(cfg.data_dir).resolve()), "data_manifest": manifest,
            "target": str(cfg.target), "max_len": cfg.max_len, "train_rows": n_train, "heldout_rows": n_heldout}


def load_features(out_dir: Path, key: dict, target, train_rows, heldout_rows, log=print,
                  write: bool = True) -> tuple[list, list]:
    """The target's features of both splits: read from ``out_dir/features.pt`` when it holds these rows of this
    target (its key equals `key`), else computed (one teacher-forced forward per batch of rows) and, with `write`
    (the main process), written there atomically; a torn or foreign file is computed again."""
    path = out_dir / FEATURES
    if path.exists():
        try:
            cached = torch.load(path, weights_only=False)
        except Exception:  # a torn or foreign file: computed again
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key:
            return cached["train"], cached["heldout"]
    start = time.perf_counter()
    train, heldout = target_features(target, train_rows), target_features(target, heldout_rows)
    tokens = sum(len(it["ids"]) for it in train + heldout)
    log(f"train: the target's features of {len(train) + len(heldout)} rows ({tokens} tokens) in "
        f"{time.perf_counter() - start:.0f} s")
    if write:
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"key": key, "train": train, "heldout": heldout}, tmp)
        os.replace(tmp, path)
    return train, heldout


def _on(s: Shifted, device) -> Shifted:
    return Shifted(**{f.name: getattr(s, f.name).to(device) for f in fields(Shifted)})


@torch.no_grad()
def evaluate_head(head: EagleHead, items: list[dict], emb_w, head_w, full_w, vocab, batch_size: int, w_reg: float,
                  second: float, on: str = "all") -> dict:
    """Held-out metrics of `head` on feature rows `items`: the loss (over the slots training covers: `on`), and at
    completion slots top-1 agreement with
    the target's argmax (over its full head), expected acceptance sum min(p, q) (p: the target's full distribution,
    q: the head's on the draft vocabulary) and the second proposal's agreement where the first was right."""
    was_training = head.training
    head.eval()
    device = emb_w.device
    loss_sum = batches = hits1 = total = cond = hits2 = 0
    overlap = 0.0
    for start in range(0, len(items), batch_size):
        s = _on(shifted(items[start:start + batch_size]), device)
        loss, _ = eagle_loss(head, s, emb_w, head_w, w_reg, second, on)
        loss_sum, batches = loss_sum + float(loss), batches + 1
        emb = F.embedding(s.next_ids, emb_w)
        out, kv = head(emb, s.h, s.pos)
        logits = out @ head_w.T
        ok1 = (vocab[logits.argmax(-1)] == s.top_next) & s.completion
        p = torch.softmax(s.h_next[s.completion] @ full_w.T, dim=-1)[:, vocab]
        q = torch.softmax(logits[s.completion], dim=-1)
        overlap += float(torch.minimum(p, q).sum())
        own = torch.zeros_like(s.h)
        own[:, 1:] = out[:, :-1]  # slot t+1's second proposal reads the head's output at t
        ok2 = (vocab[(head.second(emb, own, s.pos, kv) @ head_w.T).argmax(-1)] == s.top_next) & s.completion
        prev_ok = torch.zeros_like(ok1)
        prev_ok[:, 1:] = ok1[:, :-1]
        hits1, total = hits1 + int(ok1.sum()), total + int(s.completion.sum())
        cond, hits2 = cond + int((prev_ok & s.completion).sum()), hits2 + int((prev_ok & ok2).sum())
    head.train(was_training)
    return {"heldout/loss": loss_sum / max(batches, 1), "heldout/top1_agreement": hits1 / max(total, 1),
            "heldout/expected_acceptance": overlap / max(total, 1),
            "heldout/step2_given_step1": hits2 / max(cond, 1), "heldout/positions": total}


def run(cfg) -> dict:
    """Train an EAGLE head for ``cfg.target`` (a train/trainer.py ``TrainConfig`` with ``finetune="eagle"``) on the
    datagen output ``cfg.data_dir``; returns the metrics written to ``train_metrics.json``."""
    from accelerate.utils import set_seed

    from draftsmith.artifacts.progress import progress, quiet_logs
    from draftsmith.decode.lean import lean_unsupported
    from draftsmith.train.datagen import load_output
    from draftsmith.train.trainer import (TrainingError, _lr_lambda, check_inputs, checkpoint_score, evals_since_best,
                                          improves, load_trainable_params, new_accelerator, new_optimizer,
                                          trainable_params)

    out_dir = Path(cfg.out_dir)
    ds, manifest = load_output(cfg.data_dir)
    tokenizer = load_tokenizer(cfg.target, "target")
    # the head proposes the target's own ids, and learns from the target's features (no stored top-k needed)
    check_inputs(replace(cfg, draft=cfg.target, teacher="online"), manifest, ds, tokenizer, tokenizer)
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    accelerator = new_accelerator(cfg, device)
    set_seed(cfg.seed)
    target = load_model(cfg.target, "target", "float32", accelerator.device)
    target.requires_grad_(False)
    reason = lean_unsupported(target)
    if reason is not None:
        raise TrainingError(f"method.finetune=eagle: the target {cfg.target!r} is not one an EAGLE head is served "
                            f"with here ({reason}): draftsmith's loop runs the head on the lean forward; train a "
                            "draft model instead (method.finetune=full)")
    try:
        if is_eagle_dir(cfg.draft):  # a head trained before, trained further
            head = load_eagle(cfg.draft, target).train()
            accelerator.print(f"train: the EAGLE head starts from {cfg.draft}")
        else:
            head = EagleHead(target)
    except (ValueError, RuntimeError) as exc:
        raise TrainingError(f"method.finetune=eagle: {exc}") from exc

    width = logit_width(target)
    full_w = target.get_output_embeddings().weight.detach()
    emb_w = target.get_input_embeddings().weight.detach()
    vocab_info = None
    if cfg.reduced_head:
        vocab, vocab_info = datagen_vocab(cfg.data_dir, cfg.draft_vocab, width,
                                          sorted(pretrained_eos_ids(cfg.target, tokenizer)),
                                          key="method.reduced_head with eval.draft_vocab")
        vocab = vocab.to(accelerator.device)
    else:
        vocab = torch.arange(width, device=accelerator.device)
    head_w = full_w[vocab]

    heldout_split = ds["heldout"].select(range(min(cfg.eval_rows, len(ds["heldout"]))))
    key = features_key(cfg, len(ds["train"]), len(heldout_split))
    out_dir.mkdir(parents=True, exist_ok=True)
    ftrain, fheld = load_features(out_dir, key, target, _rows(ds["train"], cfg.max_len),
                                  _rows(heldout_split, cfg.max_len), log=accelerator.print,
                                  write=accelerator.is_main_process)
    accelerator.wait_for_everyone()
    world = accelerator.num_processes
    if len(ftrain) < cfg.batch_size * world:
        raise TrainingError(f"{cfg.data_dir}: {len(ftrain)} usable training rows, fewer than method.batch_size="
                            f"{cfg.batch_size} x {world} processes; lower method.batch_size or generate more data")

    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = new_optimizer(params, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
    if accelerator.num_processes > 1 and cfg.eagle_second > 0:
        raise TrainingError("method.eagle_second > 0 runs the head's second proposal, which a multi-process run "
                            "does not wrap: train it in one process, or set method.eagle_second=0")
    head, optimizer = accelerator.prepare(head, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    start_step, history, best_params = 0, {"train": [], "eval": [], "best": None, "stopped_at": None}, None
    found = latest_checkpoint(out_dir) if cfg.resume else None
    if found is not None:
        with quiet_logs("accelerate"):
            accelerator.load_state(str(found[0]))
        start_step, history = found[1], {**history, **json.loads((found[0] / "state.json").read_text())["history"]}
        best_params = load_best_params(found[0])
        accelerator.print(f"train: resuming from {found[0]} (step {start_step})")
    if accelerator.is_main_process and cfg.log_with:
        accelerator.init_trackers(cfg.tracker_project, config=asdict(cfg), init_kwargs=cfg.tracker_init)

    # the bare head without accelerate's autocast wrapper: held-out metrics (and the best step they pick) in
    # float32, as the head is served; training still runs under the autocast around its loss
    bare = accelerator.unwrap_model(head, keep_fp32_wrapper=False)

    def evaluate() -> dict:
        return evaluate_head(bare, fheld, emb_w, head_w, full_w, vocab, cfg.batch_size, cfg.eagle_w_reg,
                             cfg.eagle_second, cfg.eagle_loss_on)

    rank = accelerator.process_index
    last_step = history["stopped_at"] or cfg.steps
    bar = progress(range(start_step, last_step), desc="train (EAGLE head)", unit="step",
                   disable=not accelerator.is_main_process, initial=start_step, total=cfg.steps)
    if cfg.eval_every and start_step == 0 and fheld:
        ev = evaluate()
        history["eval"].append({"step": 0, **ev})
        accelerator.log(ev, step=0)
    started, tokens, heldout = time.perf_counter(), 0, None
    head.train()
    for step in bar:
        step_metrics: dict[str, float] = {}
        for micro in range(cfg.grad_accum):
            idx = batch_indices(len(ftrain), cfg.batch_size, step * cfg.grad_accum + micro, cfg.seed, rank, world)
            s = _on(shifted([ftrain[i] for i in idx]), accelerator.device)
            with accelerator.accumulate(head):
                with accelerator.autocast():  # method.mixed_precision: the head's products, its loss in float32
                    loss, parts = eagle_loss(head, s, emb_w, head_w, cfg.eagle_w_reg, cfg.eagle_second,
                                             cfg.eagle_loss_on, cfg.eagle_noise)
                finite = accelerator.gather(torch.isfinite(loss.detach()).reshape(1)).all()
                if not finite:
                    last = latest_checkpoint(out_dir)
                    raise TrainingError(f"loss is not finite ({loss.item()}) at step {step}: training stopped. The "
                                        f"last good checkpoint is {last[0] if last else 'none'}; lower method.lr")
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            tokens += int(s.valid.sum())
            for k, v in {"loss": float(loss.detach()), **parts}.items():
                step_metrics[k] = step_metrics.get(k, 0.0) + v / cfg.grad_accum
        step_metrics["lr"] = scheduler.get_last_lr()[0]
        history["train"].append({"step": step + 1, **step_metrics})
        accelerator.log({f"train/{k}": v for k, v in step_metrics.items()}, step=step + 1)
        done = step + 1 == cfg.steps
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or done) and fheld:
            ev = evaluate()
            history["eval"].append({"step": step + 1, **ev})
            accelerator.log(ev, step=step + 1)
            metric, value = checkpoint_score(ev, cfg.best_by)
            heldout = f"{metric.split('/')[-1]}@{step + 1}={value:.3f}"
            if improves(history["best"], ev, cfg.best_by):
                history["best"] = {"step": step + 1, "metric": metric, "value": value}
                if cfg.keep_best:
                    best_params = trainable_params(bare)
            if not done and cfg.patience and evals_since_best(history) >= cfg.patience:
                history["stopped_at"], done = step + 1, True
                accelerator.print(f"train: stopping at step {step + 1}: {cfg.patience} held-out evaluations without "
                                  f"a better {history['best']['metric']} than step {history['best']['step']}'s "
                                  f"{history['best']['value']:.4f} (method.patience)")
        bar.set_postfix(loss=f"{step_metrics['loss']:.4f}", **({"heldout": heldout} if heldout else {}))
        if cfg.save_every and ((step + 1) % cfg.save_every == 0 or done):
            save_checkpoint(accelerator, out_dir, step + 1, history, cfg.keep_checkpoints, best_params=best_params)
        if done:
            break
    elapsed = time.perf_counter() - started
    if cfg.keep_best and best_params is not None:
        load_trainable_params(bare, best_params)
    written = history["best"]["step"] if cfg.keep_best and history["best"] else None
    evals = {e["step"]: e for e in history["eval"]}
    metrics = {"history": history, "final": evals.get(written, history["eval"][-1] if history["eval"] else {}),
               "draft_step": written or (history["train"][-1]["step"] if history["train"] else 0),
               "best": history["best"], "stopped_at": history["stopped_at"], "reduced_head": vocab_info,
               "train_tokens_per_s": tokens * world / elapsed if elapsed > 0 else 0.0,
               "world_size": world, "kind": "eagle",
               "features": {"train_rows": len(ftrain), "heldout_rows": len(fheld),
                            "tokens": sum(len(it["ids"]) for it in ftrain + fheld)}}
    accelerator.wait_for_everyone()
    # every rank's parameter checksum: identical after data-parallel training (as train/trainer.py records it)
    checksum = torch.stack([p.detach().double().sum() for p in bare.parameters()]).sum().reshape(1)
    metrics["rank_param_checksums"] = accelerator.gather(checksum.to(accelerator.device)).tolist()
    if accelerator.is_main_process:
        with atomic_dir(out_dir / "draft") as tmp:
            save_eagle(tmp, bare, data=str(cfg.data_dir), target=str(cfg.target), step=metrics["draft_step"],
                       lr=cfg.lr, w_reg=cfg.eagle_w_reg, second=cfg.eagle_second, loss_on=cfg.eagle_loss_on,
                       noise=cfg.eagle_noise,
                       train_rows=len(ftrain),
                       draft_vocab=int(vocab.numel()) if cfg.reduced_head else None)
            tokenizer.save_pretrained(tmp)
        write_json(out_dir / "train_metrics.json", metrics)
        write_json(out_dir / "manifest.json", {
            "schema_version": 1, "stage": "train", "config": asdict(cfg), "data": str(cfg.data_dir),
            "data_target": manifest.get("target"), "tokenizer_hash": manifest.get("tokenizer_hash"),
            "outputs": {"draft": "draft", "adapter": None}, "kind": "eagle", "provenance": provenance(),
        })
        (out_dir / FEATURES).unlink(missing_ok=True)  # the stage is complete: no resume needs them
    accelerator.end_training()
    return metrics
