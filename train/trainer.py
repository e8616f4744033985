"""train: distill or LoRA-finetune a draft on what the target said (one accelerate loop).

Reads a datagen output, writes to ``cfg.out_dir``:
    draft/              merged HF model directory with the tokenizer (what serving engines load)
    adapter/            the LoRA adapter (method lora only)
    checkpoints/step_N/ accelerate ``save_state`` checkpoints; ``resume`` continues from the last
    train_metrics.json  loss curve and periodic held-out metrics
    manifest.json       resolved config, inputs, provenance; written last, it marks completion

Teacher signal: ``online`` runs the frozen target inside the loop (no grad); ``cached`` uses the
top-k log-probs stored by datagen, with the tail mass kept as one bucket (see
:func:`train.losses.topk_buckets`). ``ce`` is sequence-level KD on the target's tokens and needs
no teacher. On-policy batches (DistillSpec / GKD): the draft samples continuations of training
prompts and the online target scores them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from decode.artifacts import atomic_dir, provenance, tokenizer_hash, write_json
from decode.pair import check_tokenizers, load_model, load_tokenizer
from train.data import Batch, batch_indices, collate
from train.losses import LOSSES, ce_per_position, divergence_per_position, masked_mean, topk_buckets


class TrainingError(RuntimeError):
    """Training cannot start or had to stop; the message says why and what to do."""


@dataclass
class TrainConfig:
    """Settings of the train stage."""

    data_dir: str  # a datagen output directory
    draft: str  # HF directory or hub id of the draft to start from
    out_dir: str
    target: str | None = None  # needed for teacher=online and on-policy batches
    draft_from_config: bool = False  # True: only the draft's config is used (random init)
    method: str = "full"  # full | lora
    loss: str = "fkl"  # ce | fkl | rkl | jsd | tvd
    beta: float = 0.5  # generalized JSD mixing weight
    teacher: str = "online"  # online | cached
    on_policy_fraction: float = 0.0  # share of steps trained on draft-sampled continuations
    on_policy_max_new_tokens: int = 32
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] | str = "all-linear"
    steps: int = 100  # optimizer steps
    batch_size: int = 8  # rows per micro-batch per process
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_len: int | None = None  # truncate rows to this many tokens
    mixed_precision: str = "auto"  # auto | no | bf16 | fp16
    eval_every: int = 50
    eval_rows: int = 64
    save_every: int = 50
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the last checkpoint in out_dir when there is one
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    log_with: str | None = None  # an accelerate tracker name, e.g. "wandb"
    tracker_project: str = "draftsmith"
    tracker_init: dict = field(default_factory=dict)

    def __post_init__(self):
        checks = [
            (self.method in ("full", "lora"), f"train.method must be full or lora, got {self.method!r}"),
            (self.loss in LOSSES, f"train.loss must be one of {', '.join(LOSSES)}, got {self.loss!r}"),
            (self.teacher in ("online", "cached"), f"train.teacher must be online or cached, got {self.teacher!r}"),
            (0.0 <= self.on_policy_fraction <= 1.0, f"train.on_policy_fraction must be in [0, 1], got {self.on_policy_fraction}"),
            (self.steps >= 1 and self.batch_size >= 1 and self.grad_accum >= 1,
             "train.steps, train.batch_size and train.grad_accum must be >= 1"),
            (self.mixed_precision in ("auto", "no", "bf16", "fp16"),
             f"train.mixed_precision must be auto, no, bf16 or fp16, got {self.mixed_precision!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        needs_target = (self.loss != "ce" and self.teacher == "online") or self.on_policy_fraction > 0
        if needs_target and not self.target:
            raise ValueError("train.target is required for teacher=online and for on-policy batches "
                             "(or use teacher=cached with a datagen run that stored top-k log-probs, or loss=ce)")


# ---------------------------------------------------------------- per-batch losses and metrics


def shared_log_softmax(logits: torch.Tensor, width: int) -> torch.Tensor:
    """log_softmax over the first `width` logits (the tokens both models share), in float32."""
    return torch.log_softmax(logits[..., :width].float(), -1)


def batch_loss(cfg: TrainConfig, student_logits: torch.Tensor, batch: Batch,
               teacher_logits: torch.Tensor | None, width: int) -> tuple[torch.Tensor, dict]:
    """Loss on completion positions and the agreement metrics of one batch.

    Returns (loss, metrics) with metrics: top1_agreement (student argmax == teacher argmax, or ==
    the target's token for ce) and expected_acceptance = mean sum min(p, q) where a teacher
    distribution is available (bucketed, an upper bound, for the cached teacher).
    """
    s_logp = shared_log_softmax(student_logits[:, :-1], width)  # [B, T-1, V]
    labels = batch.input_ids[:, 1:]
    mask = batch.loss_mask
    metrics = {}
    if teacher_logits is not None:
        t_logp = shared_log_softmax(teacher_logits[:, :-1], width)
        per_pos = ce_per_position(s_logp, labels) if cfg.loss == "ce" else divergence_per_position(cfg.loss, t_logp, s_logp, cfg.beta)
        t_top1 = t_logp.argmax(-1)
        accept = torch.minimum(t_logp.exp(), s_logp.exp()).sum(-1)
    elif batch.topk_ids is not None and cfg.loss != "ce":
        t_b, s_b = topk_buckets(s_logp, batch.topk_ids, batch.topk_logprobs)
        per_pos = divergence_per_position(cfg.loss, t_b, s_b, cfg.beta)
        t_top1 = batch.topk_ids[..., 0]
        accept = torch.minimum(t_b.exp(), s_b.exp()).sum(-1)
    else:
        per_pos = ce_per_position(s_logp, labels)
        t_top1, accept = labels, None
    with torch.no_grad():
        metrics["top1_agreement"] = masked_mean((s_logp.argmax(-1) == t_top1).float(), mask).item()
        if accept is not None:
            metrics["expected_acceptance"] = masked_mean(accept, mask).item()
    return masked_mean(per_pos, mask), metrics


# ---------------------------------------------------------------- set-up checks


def check_inputs(cfg: TrainConfig, manifest: dict, ds, draft_tok, target_tok) -> None:
    """Every bad input that can be seen before training starts, as one clear error."""
    n_train = len(ds["train"])
    if n_train == 0:
        raise TrainingError(f"{cfg.data_dir}: the training split is empty; run datagen with more prompts")
    if n_train < cfg.batch_size:
        raise TrainingError(f"{cfg.data_dir}: {n_train} training rows, fewer than train.batch_size={cfg.batch_size}; "
                            "lower the batch size or generate more data")
    if cfg.target and manifest.get("target") and target_tok is not None:
        if manifest.get("tokenizer_hash") != tokenizer_hash(target_tok):
            raise TrainingError(f"{cfg.data_dir} was generated by {manifest['target']!r} whose tokenizer differs from "
                                f"the configured target {cfg.target!r}; re-run datagen with this target")
    if manifest.get("tokenizer_hash") and manifest["tokenizer_hash"] != tokenizer_hash(draft_tok):
        if target_tok is not None:  # names the first difference
            check_tokenizers(target_tok, draft_tok, cfg.target, cfg.draft)
        raise TrainingError(f"the draft {cfg.draft!r} tokenizer differs from the one of the data's target "
                            f"{manifest.get('target')!r}; the draft must share the target's tokenizer")
    if cfg.teacher == "cached" and cfg.loss != "ce" and "topk_ids" not in ds["train"].column_names:
        raise TrainingError(f"train.teacher=cached needs top-k log-probs, but {cfg.data_dir} has none; re-run datagen "
                            "with top_k_logprobs > 0, or use teacher=online")


def apply_lora(model, cfg: TrainConfig):
    """Wrap `model` with a LoRA adapter; a target-module list that matches nothing is a clear error."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:
        names = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise TrainingError(f"train.lora_target_modules={cfg.lora_target_modules!r} matches no module of the draft "
                            f"{cfg.draft!r}; its linear layers are {names} ({exc})") from exc


# ---------------------------------------------------------------- checkpoints


def latest_checkpoint(out_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint (one with state.json) and its step."""
    ckpts = []
    for path in (out_dir / "checkpoints").glob("step_*"):
        if (path / "state.json").exists():
            ckpts.append((json.loads((path / "state.json").read_text())["step"], path))
    if not ckpts:
        return None
    step, path = max(ckpts)
    return path, step


def save_checkpoint(accelerator, out_dir: Path, step: int, history: dict, keep: int) -> Path:
    """save_state into a temporary folder, then rename; state.json marks it complete."""
    root = out_dir / "checkpoints"
    final, tmp = root / f"step_{step:07d}", root / f".tmp_step_{step:07d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(tmp / "state.json", {"step": step, "history": history})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


# ---------------------------------------------------------------- the loop


def _lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return f


def _mixed_precision(cfg: TrainConfig, device: str) -> str:
    if cfg.mixed_precision != "auto":
        return cfg.mixed_precision
    return "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "no"


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
def evaluate(cfg: TrainConfig, model, teacher, rows, pad_id: int, width: int, device) -> dict:
    """Held-out loss, top-1 agreement and expected acceptance, averaged over micro-batches."""
    model.eval()
    totals: dict[str, float] = {}
    n = 0
    with_topk = "topk_ids" in rows[0]
    for start in range(0, len(rows), cfg.batch_size):
        batch = collate(rows[start : start + cfg.batch_size], pad_id, cfg.max_len, with_topk).to(device)
        s_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        t_logits = None
        if teacher is not None:
            t_logits = teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss, metrics = batch_loss(cfg, s_logits, batch, t_logits if cfg.teacher == "online" else None, width)
        for key, value in {"loss": loss.item(), **metrics}.items():
            totals[key] = totals.get(key, 0.0) + value
        n += 1
    model.train()
    return {f"heldout/{k}": v / n for k, v in totals.items()}


def run(cfg: TrainConfig) -> dict:
    """Train the draft; returns the metrics written to ``train_metrics.json``."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from train.datagen import load_output

    out_dir = Path(cfg.out_dir)
    ds, manifest = load_output(cfg.data_dir)
    draft_tok = load_tokenizer(cfg.draft, "draft")
    target_tok = load_tokenizer(cfg.target, "target") if cfg.target else None
    check_inputs(cfg, manifest, ds, draft_tok, target_tok)

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=_mixed_precision(cfg, device),
                              gradient_accumulation_steps=cfg.grad_accum, log_with=cfg.log_with,
                              project_dir=str(out_dir))
    set_seed(cfg.seed)
    if cfg.draft_from_config:
        from transformers import AutoConfig, AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.draft))
    else:
        model = load_model(cfg.draft, "draft", "float32", "cpu")
    model.train()
    if cfg.method == "lora":
        model = apply_lora(model, cfg)
    use_online = cfg.target and ((cfg.loss != "ce" and cfg.teacher == "online") or cfg.on_policy_fraction > 0)
    teacher = load_model(cfg.target, "target", "auto", accelerator.device) if use_online else None
    if teacher is not None:
        teacher.requires_grad_(False)
    width = model.get_output_embeddings().weight.shape[0]
    if teacher is not None:
        width = min(width, teacher.get_output_embeddings().weight.shape[0])
    pad_id = draft_tok.pad_token_id if draft_tok.pad_token_id is not None else draft_tok.eos_token_id

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
    # The scheduler is stepped by hand once per optimizer step (a prepared one steps once per
    # process), and registered so that save_state / load_state carry it.
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)

    start_step, history = 0, {"train": [], "eval": []}
    found = latest_checkpoint(out_dir) if cfg.resume else None
    if found is not None:
        accelerator.load_state(str(found[0]))
        start_step, history = found[1], json.loads((found[0] / "state.json").read_text())["history"]
        accelerator.print(f"train: resuming from {found[0]} (step {start_step})")
    if accelerator.is_main_process and cfg.log_with:
        accelerator.init_trackers(cfg.tracker_project, config=asdict(cfg), init_kwargs=cfg.tracker_init)

    train_rows = ds["train"]
    heldout_rows = [ds["heldout"][i] for i in range(min(cfg.eval_rows, len(ds["heldout"])))]
    with_topk = cfg.teacher == "cached" and "topk_ids" in train_rows.column_names
    rank, world = accelerator.process_index, accelerator.num_processes
    bar = tqdm(range(start_step, cfg.steps), desc="train", unit="step", disable=not accelerator.is_main_process,
               initial=start_step, total=cfg.steps, dynamic_ncols=True)
    if cfg.eval_every and start_step == 0 and heldout_rows:  # the baseline before any update
        ev = evaluate(cfg, model, teacher, heldout_rows, pad_id, width, accelerator.device)
        history["eval"].append({"step": 0, **ev})
        accelerator.log(ev, step=0)
    started, tokens = time.perf_counter(), 0
    for step in bar:
        step_metrics: dict[str, float] = {}
        for micro in range(cfg.grad_accum):
            global_micro = step * cfg.grad_accum + micro
            idx = batch_indices(len(train_rows), cfg.batch_size, global_micro, cfg.seed, rank, world)
            batch = collate([train_rows[i] for i in idx], pad_id, cfg.max_len, with_topk).to(accelerator.device)
            # the same decision on every rank, so collectives (and a sharded teacher) stay in step
            on_policy = cfg.on_policy_fraction > 0 and (
                torch.rand(1, generator=torch.Generator().manual_seed(cfg.seed + global_micro)).item() < cfg.on_policy_fraction)
            if on_policy:
                batch = on_policy_batch(accelerator.unwrap_model(model), batch, cfg, pad_id, cfg.seed + global_micro)
            with accelerator.accumulate(model):
                s_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                t_logits = None
                if teacher is not None and (on_policy or cfg.teacher == "online"):
                    with torch.no_grad():
                        t_logits = teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                loss, metrics = batch_loss(cfg, s_logits, batch, t_logits, width)
                finite = accelerator.gather(torch.isfinite(loss.detach()).reshape(1)).all()  # every rank decides alike
                if not finite:
                    last = latest_checkpoint(out_dir)
                    raise TrainingError(f"loss is not finite ({loss.item()}) at step {step}: training stopped. The last good "
                                        f"checkpoint is {last[0] if last else 'none'}; lower train.lr or check the data")
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            tokens += int(batch.loss_mask.sum())
            for key, value in {"loss": loss.item(), **metrics}.items():
                step_metrics[key] = step_metrics.get(key, 0.0) + value / cfg.grad_accum
        step_metrics["lr"] = scheduler.get_last_lr()[0]
        history["train"].append({"step": step + 1, **step_metrics})
        accelerator.log({f"train/{k}": v for k, v in step_metrics.items()}, step=step + 1)
        bar.set_postfix(loss=f"{step_metrics['loss']:.4f}")
        done = step + 1 == cfg.steps
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or done) and heldout_rows:
            ev = evaluate(cfg, model, teacher, heldout_rows, pad_id, width, accelerator.device)
            history["eval"].append({"step": step + 1, **ev})
            accelerator.log(ev, step=step + 1)
        if cfg.save_every and ((step + 1) % cfg.save_every == 0 or done):
            save_checkpoint(accelerator, out_dir, step + 1, history, cfg.keep_checkpoints)
    elapsed = time.perf_counter() - started
    metrics = _finish(cfg, accelerator, model, draft_tok, history, manifest, elapsed, tokens * world)
    accelerator.end_training()
    return metrics


def _finish(cfg, accelerator, model, tokenizer, history, data_manifest, elapsed, tokens) -> dict:
    """Write the draft (merged for LoRA), the adapter, train_metrics.json and manifest.json (main process)."""
    accelerator.wait_for_everyone()
    out_dir = Path(cfg.out_dir)
    # every rank's parameter checksum: they must be identical after data-parallel training
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    rank_checksums = accelerator.gather(checksum.to(accelerator.device)).tolist()
    metrics = {"history": history, "final": history["eval"][-1] if history["eval"] else {},
               "train_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "world_size": accelerator.num_processes,
               "rank_param_checksums": rank_checksums}
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(model)
        if cfg.method == "lora":
            with atomic_dir(out_dir / "adapter") as tmp:
                model.save_pretrained(tmp)
            model = model.merge_and_unload()
        with atomic_dir(out_dir / "draft") as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        write_json(out_dir / "train_metrics.json", metrics)
        write_json(out_dir / "manifest.json", {
            "schema_version": 1, "stage": "train", "config": asdict(cfg), "data": str(cfg.data_dir),
            "data_target": data_manifest.get("target"), "tokenizer_hash": data_manifest.get("tokenizer_hash"),
            "outputs": {"draft": "draft", "adapter": "adapter" if cfg.method == "lora" else None},
            "provenance": provenance(),
        })
    accelerator.wait_for_everyone()
    return metrics


def main(argv: list[str] | None = None) -> None:
    """``python -m train.trainer CONFIG.json``: the train stage from a JSON TrainConfig.

    The form to start under ``torchrun --nproc_per_node N`` or ``accelerate launch``.
    """
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m train.trainer CONFIG.json  (fields of train.trainer.TrainConfig)")
    run(TrainConfig(**json.loads(Path(args[0]).read_text())))


if __name__ == "__main__":
    main()
