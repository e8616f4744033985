"""The EAGLE objective (``method.finetune=eagle``): an EAGLE-1 head (decode/eagle.py) trained on the target's own
features, in the one training loop (train/loop.py: resume, early stopping, the best held-out step kept). It writes

    draft/              the head: vLLM's EAGLE layout (config.json naming EagleLlamaForCausalLM, model.safetensors
                        with fc + one layer, no embedding or lm_head: the target's are shared), draftsmith_eagle.json
                        (how it was trained), and the target's tokenizer (the head proposes the target's ids)
    features.pt         the target's teacher-forced features of the rows (computed once, kept for a resume; deleted
                        when the stage completes)

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
as every objective's do.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.artifacts import atomic_dir
from draftsmith.decode.eagle import EagleHead, is_eagle_dir, load_eagle, save_eagle
from draftsmith.decode.eos import pretrained_eos_ids
from draftsmith.decode.pair import load_model
from draftsmith.decode.runners import logit_width
from draftsmith.decode.vocab import datagen_vocab
from draftsmith.train.eagle import Shifted, eagle_loss, shifted, target_features
from draftsmith.train.features import FEATURES, run_features
from draftsmith.train.loop import Objective, TrainingError
from draftsmith.train.settings import TrainConfig

def _on(s: Shifted, device) -> Shifted:
    return Shifted(**{f.name: getattr(s, f.name).to(device) for f in fields(Shifted)})


@torch.no_grad()
def evaluate_head(head: EagleHead, items: list[dict], emb_w, head_w, full_w, vocab, batch_size: int, w_reg: float,
                  second: float, on: str = "all") -> dict:
    """Held-out metrics of `head` on feature rows `items`: the loss (over the slots training covers: `on`), and at
    completion slots top-1 agreement with
    the target's argmax (over its full head), expected acceptance sum min(p, q) (p: the target's full distribution,
    q: the head's on the draft vocabulary) and the second proposal's agreement where the first was right."""
    if any("top" not in it for it in items):
        raise ValueError("held-out figures need the target's argmax: compute these rows with target_features(top=True)")
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


class EagleObjective(Objective):
    """An EAGLE head over the target's teacher-forced features, scored by train/eagle.py ``eagle_loss`` (under
    ``method.mixed_precision``'s autocast; held-out metrics in float32, as the head is served)."""

    label = "train (EAGLE head)"

    def __init__(self, cfg: TrainConfig, accelerator, ds, tokenizer):
        from draftsmith.decode.lean import lean_unsupported

        self.cfg, self.accelerator, self.tokenizer = cfg, accelerator, tokenizer
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
        self.model = head

        width = logit_width(target)
        self.full_w = target.get_output_embeddings().weight.detach()
        self.emb_w = target.get_input_embeddings().weight.detach()
        self.vocab_info = None
        if cfg.reduced_head:
            vocab, self.vocab_info = datagen_vocab(cfg.data_dir, cfg.draft_vocab, width,
                                                   sorted(pretrained_eos_ids(cfg.target, tokenizer)),
                                                   key="method.reduced_head with eval.draft_vocab")
            self.vocab = vocab.to(accelerator.device)
        else:
            self.vocab = torch.arange(width, device=accelerator.device)
        self.head_w = self.full_w[self.vocab]

        self.ftrain, self.fheld = run_features(cfg, accelerator, ds,
                                               lambda rows, top: target_features(target, rows, top=top))
        if accelerator.num_processes > 1 and cfg.eagle_second > 0:
            raise TrainingError("method.eagle_second > 0 runs the head's second proposal, which a multi-process run "
                                "does not wrap: train it in one process, or set method.eagle_second=0")
        self.n_rows = len(self.ftrain)
        self.bare = head

    def prepared(self, model) -> None:
        # the bare head without accelerate's autocast wrapper: held-out metrics (and the best step they pick) in
        # float32, as the head is served; training still runs under the autocast around its loss
        self.bare = self.accelerator.unwrap_model(model, keep_fp32_wrapper=False)
        self.bare.train()

    def batch(self, model, rows: list[int], micro: int) -> Shifted:
        return _on(shifted([self.ftrain[i] for i in rows]), self.accelerator.device)

    def loss(self, model, batch: Shifted) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        with self.accelerator.autocast():  # method.mixed_precision: the head's products, its loss in float32
            loss, parts = eagle_loss(model, batch, self.emb_w, self.head_w, cfg.eagle_w_reg, cfg.eagle_second,
                                     cfg.eagle_loss_on, cfg.eagle_noise)
        return loss, parts

    def tokens(self, batch: Shifted) -> int:
        return int(batch.valid.sum())

    def evaluate(self, model) -> dict:
        if not self.fheld:
            return {}
        cfg = self.cfg
        return evaluate_head(self.bare, self.fheld, self.emb_w, self.head_w, self.full_w, self.vocab, cfg.batch_size,
                             cfg.eagle_w_reg, cfg.eagle_second, cfg.eagle_loss_on)

    def record(self, history: dict) -> dict:
        return {"reduced_head": self.vocab_info, "kind": "eagle",
                "features": {"train_rows": len(self.ftrain), "heldout_rows": len(self.fheld),
                             "tokens": sum(len(it["ids"]) for it in self.ftrain + self.fheld)}}

    def manifest(self) -> dict:
        return {"outputs": {"draft": "draft", "adapter": None}, "kind": "eagle"}

    def save(self, model, out_dir: Path, step: int) -> None:
        cfg = self.cfg
        with atomic_dir(out_dir / "draft") as tmp:
            save_eagle(tmp, self.bare, data=str(cfg.data_dir), target=str(cfg.target), step=step,
                       lr=cfg.lr, w_reg=cfg.eagle_w_reg, second=cfg.eagle_second, loss_on=cfg.eagle_loss_on,
                       noise=cfg.eagle_noise, train_rows=len(self.ftrain),
                       draft_vocab=int(self.vocab.numel()) if cfg.reduced_head else None)
            self.tokenizer.save_pretrained(tmp)

    def finished(self, out_dir: Path) -> None:
        (out_dir / FEATURES).unlink(missing_ok=True)  # the stage is complete: no resume needs them
