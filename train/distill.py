"""The distillation objective: a draft model trained on what the target said (every loss, LoRA, on-policy).

What :func:`~draftsmith.train.loop.fit` runs for ``method.finetune=full|lora``. It writes

    draft/      merged HF model directory with the tokenizer (what serving engines load)
    adapter/    the LoRA adapter (method.finetune=lora only)

Teacher signal: ``online`` runs the frozen target inside the loop (no grad); ``cached`` uses the
top-k log-probs stored by datagen, with the tail mass spread evenly over the other tokens
(``cached_tail="uniform"``, :func:`train.losses.topk_uniform_tail`) or kept as one bucket
(``"bucket"``, :func:`train.losses.topk_buckets`). ``ce`` is sequence-level KD on the target's tokens and needs
no teacher. On-policy batches (DistillSpec / GKD): the draft samples continuations of training
prompts and the online target scores them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.artifacts import atomic_dir
from draftsmith.decode.eos import eos_ids, pretrained_eos_ids
from draftsmith.decode.pair import load_model
from draftsmith.decode.runners import logit_width
from draftsmith.decode.vocab import datagen_vocab
from draftsmith.train.data import Batch, collate
from draftsmith.train.heads import head_at_loss_positions, positions_in, reduced_head, restrict
from draftsmith.train.losses import (ce_per_position, divergence_per_position, masked_mean, topk_buckets,
                                     topk_uniform_tail)
from draftsmith.train.loop import Objective, TrainingError
from draftsmith.train.settings import TrainConfig


class DistillObjective(Objective):
    """A draft model (its every weight, or LoRA adapters; embeddings frozen on request) scored by
    :func:`batch_loss` against the target's distribution (online or cached) or its tokens (``ce``); on-policy
    micro-batches (``method.on_policy_fraction``) are continuations the draft samples."""

    summed = ("on_policy_batches",)

    def __init__(self, cfg: TrainConfig, accelerator, ds, draft_tok):
        self.cfg, self.accelerator, self.tokenizer = cfg, accelerator, draft_tok
        if cfg.draft_from_config:
            from transformers import AutoConfig, AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.draft))
        else:
            model = load_model(cfg.draft, "draft", "float32", "cpu")
        model.train()
        if cfg.finetune == "lora":
            model = apply_lora(model, cfg)
        elif cfg.freeze_embeddings:
            freeze_embeddings(model)
        self.model = model
        teacher = load_model(cfg.target, "target", "auto", accelerator.device) if cfg.target and cfg.needs_target \
            else None
        if teacher is not None:
            teacher.requires_grad_(False)
        self.teacher = teacher
        self.width = logit_width(model) if teacher is None else min(logit_width(model), logit_width(teacher))
        self.pad_id = draft_tok.pad_token_id if draft_tok.pad_token_id is not None else draft_tok.eos_token_id
        self.vocab, self.vocab_info = None, None
        if cfg.reduced_head:  # the eval's ids: the same ranking of the same datagen output, the target's EOS kept
            eos = pretrained_eos_ids(cfg.target, draft_tok) if cfg.target else eos_ids(model.generation_config,
                                                                                       draft_tok)
            vocab, self.vocab_info = datagen_vocab(cfg.data_dir, cfg.draft_vocab, self.width, sorted(eos),
                                                   key="method.reduced_head with eval.draft_vocab")
            self.vocab = vocab.to(accelerator.device)
        self.train_rows = ds["train"]
        self.n_rows = len(self.train_rows)
        self.heldout_rows = [ds["heldout"][i] for i in range(min(cfg.eval_rows, len(ds["heldout"])))]
        self.with_topk = cfg.teacher == "cached" and "topk_ids" in self.train_rows.column_names

    def batch(self, model, rows: list[int], micro: int) -> tuple[Batch, bool]:
        cfg = self.cfg
        batch = collate([self.train_rows[i] for i in rows], self.pad_id, cfg.max_len,
                        self.with_topk).to(self.accelerator.device)
        # the same decision on every rank, so collectives (and a sharded teacher) stay in step
        on_policy = cfg.on_policy_fraction > 0 and (
            torch.rand(1, generator=torch.Generator().manual_seed(cfg.seed + micro)).item() < cfg.on_policy_fraction)
        if on_policy:
            batch = on_policy_batch(self.accelerator.unwrap_model(model), batch, cfg, self.pad_id, cfg.seed + micro)
        return batch, on_policy

    def loss(self, model, batch: tuple[Batch, bool]) -> tuple[torch.Tensor, dict]:
        batch, on_policy = batch
        s_logits = loss_logits(model, batch, self.vocab)
        t_logits = None
        if self.teacher is not None and (on_policy or self.cfg.teacher == "online"):
            with torch.no_grad():
                t_logits = loss_logits(self.teacher, batch)
        loss, metrics = batch_loss(self.cfg, s_logits, batch, t_logits, self.width, self.vocab)
        return loss, {**metrics, "on_policy_batches": int(on_policy)}

    def tokens(self, batch: tuple[Batch, bool]) -> int:
        return int(batch[0].loss_mask.sum())

    def evaluate(self, model) -> dict:
        if not self.heldout_rows:
            return {}
        return evaluate(self.cfg, model, self.teacher, self.heldout_rows, self.pad_id, self.width,
                        self.accelerator.device, self.vocab)

    def record(self, history: dict) -> dict:
        return {"reduced_head": self.vocab_info,
                "on_policy_batches": sum(h.get("on_policy_batches", 0) for h in history["train"])}

    def manifest(self) -> dict:
        return {"outputs": {"draft": "draft", "adapter": "adapter" if self.cfg.finetune == "lora" else None}}

    def save(self, model, out_dir: Path, step: int) -> None:
        if self.cfg.finetune == "lora":
            with atomic_dir(out_dir / "adapter") as tmp:
                model.save_pretrained(tmp)
            model = model.merge_and_unload()
        with atomic_dir(out_dir / "draft") as tmp:
            model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)


# ---------------------------------------------------------------- per-batch losses and metrics


def shared_log_softmax(logits: torch.Tensor, width: int) -> torch.Tensor:
    """log_softmax over the first `width` logits (the tokens both models share), in float32."""
    return torch.log_softmax(logits[..., :width].float(), -1)


def batch_loss(cfg: TrainConfig, student_logits: torch.Tensor, batch: Batch,
               teacher_logits: torch.Tensor | None, width: int,
               vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Loss on completion positions and the agreement metrics of one batch.

    `student_logits` / `teacher_logits` are either [B, T, V] over the whole rows, or [N, V] at the
    N loss positions only (``batch.loss_mask``, in row-major order: what a forward under
    :func:`head_at_loss_positions` returns); only those positions are ever turned into distributions.
    With `vocab` (the sorted draft-vocabulary ids of ``method.reduced_head``) the student's logits are
    [N, len(vocab)] over those ids (:func:`~draftsmith.train.heads.reduced_head`); the teacher is
    renormalised over them for the loss, and ``ce`` positions whose token is outside them carry no loss.

    Returns (loss, metrics) with metrics: top1_agreement (student argmax == teacher argmax, or ==
    the target's token for ce) and expected_acceptance = mean sum min(p, q) where a teacher
    distribution is available (for the cached teacher: over its reconstruction from the top-k, the
    uniform-tail one or the buckets, whose value is an upper bound). Both are what decoding sees: with
    `vocab` the student proposes ids of `vocab` only and the teacher keeps its mass outside them.
    """
    mask = batch.loss_mask
    s_raw = at_loss_positions(student_logits, mask)
    s_logp = shared_log_softmax(s_raw, width) if vocab is None else torch.log_softmax(s_raw.float(), -1)  # [N, V']
    s_top1 = s_logp.argmax(-1) if vocab is None else vocab[s_logp.argmax(-1)]  # as token ids
    labels = batch.input_ids[:, 1:][mask]
    topk_ids = batch.topk_ids[mask] if batch.topk_ids is not None else None
    topk_logprobs = batch.topk_logprobs[mask] if batch.topk_logprobs is not None else None
    metrics = {}
    t_logp = None  # the teacher's log-probs over the full width, when there is a teacher distribution
    every = torch.ones(s_logp.shape[0], dtype=torch.bool, device=s_logp.device)
    if teacher_logits is not None and cfg.loss != "ce":
        t_logp = shared_log_softmax(at_loss_positions(teacher_logits, mask), width)
        t_top1 = t_logp.argmax(-1)
    elif topk_ids is not None and cfg.loss != "ce" and cfg.cached_tail == "uniform":
        t_logp = topk_uniform_tail(topk_ids, topk_logprobs, width)
        t_top1 = topk_ids[..., 0]
    if t_logp is not None:
        per_pos = divergence_per_position(cfg.loss, t_logp if vocab is None else restrict(t_logp, vocab), s_logp,
                                          cfg.beta)
        p = t_logp.exp() if vocab is None else t_logp[:, vocab].exp()
        dists = (p, s_logp.exp())
    elif topk_ids is not None and cfg.loss != "ce":  # the bucket tail (never with a vocab: TrainSettings)
        t_b, s_b = topk_buckets(s_logp, topk_ids, topk_logprobs)
        per_pos = divergence_per_position(cfg.loss, t_b, s_b, cfg.beta)
        t_top1, dists = topk_ids[..., 0], (t_b.exp(), s_b.exp())
    else:
        dists, t_top1 = None, labels
        if teacher_logits is not None:  # ce beside a teacher (on-policy batches): the metrics compare with it
            t_full = shared_log_softmax(at_loss_positions(teacher_logits, mask), width)
            dists = (t_full.exp() if vocab is None else t_full[:, vocab].exp(), s_logp.exp())
            t_top1 = t_full.argmax(-1)
        targets = labels if vocab is None else positions_in(vocab, labels, width)
        every = targets >= 0
        per_pos = ce_per_position(s_logp, targets.clamp(min=0))
    with torch.no_grad():  # metrics only: no autograd graph for them in the training step
        metrics["top1_agreement"] = (s_top1 == t_top1).float().mean().item()
        if dists is not None:
            metrics["expected_acceptance"] = torch.minimum(*dists).sum(-1).mean().item()
    return masked_mean(per_pos, every), metrics


def at_loss_positions(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, V] logits at the loss positions: selected from [B, T, V] (position i predicts token i+1), or as given."""
    if logits.dim() == 2:
        if logits.shape[0] != int(mask.sum()):
            raise ValueError(f"{logits.shape[0]} rows of logits for {int(mask.sum())} loss positions")
        return logits
    return logits[:, :-1][mask]


def loss_logits(model: torch.nn.Module, batch: Batch, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The model's [N, V] logits at the batch's loss positions (the head runs only there; with `vocab` only over
    those ids: [N, len(vocab)])."""
    with head_at_loss_positions(model, batch.loss_mask), reduced_head(model, vocab):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return logits.squeeze(0)


def on_policy_batch(student, batch: Batch, cfg: TrainConfig, pad_id: int, seed: int) -> Batch:
    """Replace the completions of `batch` by continuations sampled from the student (temperature 1)."""
    gen_rows = []
    torch.manual_seed(seed)
    was_training = student.training
    student.eval()
    with torch.no_grad():
        for i, p_len in enumerate(batch.prompt_lens):
            prompt = batch.input_ids[i : i + 1, :p_len]
            out = student.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                   top_k=0, max_new_tokens=cfg.on_policy_max_new_tokens, pad_token_id=pad_id)
            gen_rows.append({"prompt_ids": prompt[0].tolist(), "completion_ids": out[0, p_len:].tolist()})
    student.train(was_training)
    return collate(gen_rows, pad_id, cfg.max_len).to(batch.input_ids.device)


@torch.no_grad()
def evaluate(cfg: TrainConfig, model, teacher, rows, pad_id: int, width: int, device,
             vocab: torch.Tensor | None = None) -> dict:
    """Held-out loss, top-1 agreement and expected acceptance, averaged over micro-batches."""
    model.eval()
    totals: dict[str, float] = {}
    n = 0
    with_topk = "topk_ids" in rows[0]
    for start in range(0, len(rows), cfg.batch_size):
        batch = collate(rows[start : start + cfg.batch_size], pad_id, cfg.max_len, with_topk).to(device)
        s_logits = loss_logits(model, batch, vocab)
        t_logits = None
        if teacher is not None and cfg.teacher == "online":  # a cached teacher reads the batch's top-k
            t_logits = loss_logits(teacher, batch)
        loss, metrics = batch_loss(cfg, s_logits, batch, t_logits, width, vocab)
        for key, value in {"loss": loss.item(), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value
        n += 1
    model.train()
    return {f"heldout/{k}": v / n for k, v in totals.items()}


# ---------------------------------------------------------------- what trains


def apply_lora(model, cfg: TrainConfig):
    """Wrap `model` with a LoRA adapter; a target-module list that matches nothing is a clear error."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:
        names = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise TrainingError(f"method.lora_target_modules={cfg.lora_target_modules!r} matches no module of the draft "
                            f"{cfg.draft!r}; its linear layers are {names} ({exc})") from exc


def freeze_embeddings(model) -> int:
    """Keep the input embedding and the output head fixed (one matrix when tied); returns the frozen count.

    For drafts cut from a large-vocabulary target (``pair.draft_layers``) these matrices hold most of
    the parameters (SmolLM2: 28M of the 2-layer draft's 35M) and already match the target's.
    """
    frozen = 0
    for module in {id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}.values():
        for p in module.parameters():
            if p.requires_grad:
                p.requires_grad_(False)
                frozen += p.numel()
    return frozen
