"""The one training loop: :func:`fit` runs an :class:`Objective` (how a kind of draft is scored and saved).

Every kind of draft trains here — a draft model by distillation (every loss, cached or online teacher), LoRA and
on-policy batches (train/distill.py), an EAGLE-1 head over the target's features (train/eagle_objective.py), an
EAGLE-3 head with the training-time test (train/eagle3_objective.py) — so
resume, gradient accumulation, the non-finite check, clipping, the learning-rate schedule, held-out evaluation,
keeping the best step, patience, checkpoints and the metrics record have one home. What ``fit`` writes:

    checkpoints/step_N/ accelerate ``save_state`` checkpoints (train/checkpoints.py); a re-run resumes from the last
    train_metrics.json  the loss curve, periodic held-out metrics, the best step, throughput, every rank's checksum
    manifest.json       the resolved config, inputs and provenance; written last, it marks completion

and the objective writes its own artifact (``draft/``, ``adapter/``) from the best held-out step's parameters.

Resume is exact: a run killed after checkpoint N and started again ends with the same weights, bit for bit, as one
that never stopped (model, optimizer, scheduler and RNG states are restored; batch order is a function of the step).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from draftsmith.artifacts import provenance, write_json
from draftsmith.artifacts.errors import UserError
from draftsmith.train.checkpoints import latest_checkpoint, load_best_params, save_checkpoint, tied_parameter_names
from draftsmith.train.data import batch_indices


class TrainingError(UserError, RuntimeError):
    """Training cannot start or had to stop; the message says why and what to do."""


class Objective:
    """How one kind of draft is trained: what :func:`fit` asks of it.

    Set by the objective: ``model`` (the module to train, before ``accelerate.prepare``), ``n_rows`` (training rows:
    the population :func:`~draftsmith.train.data.batch_indices` draws from), ``label`` (the progress bar's) and
    ``summed`` (metrics a step adds over its micro-batches; the others are averaged).
    """

    label: str = "train"
    summed: tuple[str, ...] = ()
    model: torch.nn.Module
    n_rows: int

    def prepared(self, model: torch.nn.Module) -> None:
        """Called once with the module ``accelerate.prepare`` returned, before any step or evaluation."""

    def batch(self, model: torch.nn.Module, rows: list[int], micro: int) -> Any:
        """The micro-batch of training rows `rows` (the step's `micro`-th, counted over the whole run)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, dict]:
        """(scalar loss, float metrics) of `batch`."""
        raise NotImplementedError

    def tokens(self, batch: Any) -> int:
        """The positions `batch` trains on (throughput)."""
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module) -> dict:
        """Held-out metrics (``heldout/...`` keys); {} where there are no held-out rows."""
        return {}

    def record(self, history: dict) -> dict:
        """Fields this objective adds to ``train_metrics.json`` (`history`: the run's train and eval records)."""
        return {}

    def manifest(self) -> dict:
        """Fields this objective adds to ``manifest.json`` (at least ``outputs``)."""
        return {}

    def save(self, model: torch.nn.Module, out_dir: Path, step: int) -> None:
        """Write the trained artifact(s) under `out_dir`, each atomically (main process only); `step` is the
        optimizer step whose parameters `model` holds."""
        raise NotImplementedError

    def finished(self, out_dir: Path) -> None:
        """The stage is complete (main process): drop what only a resume needed."""


# ---------------------------------------------------------------- the run's accelerator, optimizer and schedule


def new_accelerator(cfg, device: str):
    """The run's Accelerator. accelerate keeps its settings (mixed precision, ...) in process-wide state that refuses
    a second Accelerator with other settings ("AcceleratorState has already been initialized"), so a second run in
    one process (a Hydra multirun over method.mixed_precision, the tests) starts from a cleared AcceleratorState.
    A single process also clears its PartialState (which holds the device: a run on another ``method.device``
    must not inherit the first run's); a launched process keeps it (its rank and process group)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    single = not PartialState._shared_state or PartialState().num_processes == 1
    AcceleratorState._reset_state(reset_partial_state=single)
    return Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision(cfg, device),
                       gradient_accumulation_steps=cfg.grad_accum, log_with=cfg.log_with,
                       project_dir=str(cfg.out_dir))


def run_device(cfg) -> str:
    """``method.device``, with auto resolved: cuda where torch sees one, else cpu."""
    return cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AMX-BF16 or AVX512-BF16, from /proc/cpuinfo's flags);
    elsewhere bf16 is emulated, and slower. False where the flags cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def mixed_precision(cfg, device: str) -> str:
    """``method.mixed_precision``; auto: bf16 on a GPU that has it; on a CPU, bf16 for an EAGLE head where the CPU
    has native bf16 products (a head's step is mostly matrix products), float32 for a draft model (not measured
    faster in bf16 on a CPU), else no."""
    if cfg.mixed_precision != "auto":
        return cfg.mixed_precision
    if device == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if device == "cpu" and cfg.finetune in ("eagle", "eagle3") and cpu_has_native_bf16() else "no"


def _fused_adamw_fits(params: list) -> bool:
    """Whether torch's fused AdamW kernel takes every parameter (floating point, on a device it is built for): torch
    checks this only at the first ``step()``, so it is asked here, before the optimizer is built."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except (ImportError, AttributeError):  # another torch: no fused kernel assumed
        return False
    return all(p.device.type in devices and torch.is_floating_point(p) for p in params)


def new_optimizer(params, cfg) -> torch.optim.Optimizer:
    """AdamW over `params`, fused where torch has the kernel for them (CPU and CUDA since torch 2.4): one pass over
    each parameter instead of a dozen memory-bound elementwise ones; the arithmetic is AdamW's either way."""
    params = list(params)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=_fused_adamw_fits(params))


def lr_lambda(cfg):
    """The learning-rate factor of optimizer step n: linear warm-up over ``method.warmup_steps``, then cosine to 0."""
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return f


# ---------------------------------------------------------------- keeping the best step


def checkpoint_score(ev: dict, best_by: str = "auto") -> tuple[str, float]:
    """(key, value) that ranks a held-out evaluation: `best_by` (method.best_by) when measured; ``auto`` (and a
    figure not measured: method.loss=ce without a teacher has no distribution) takes expected acceptance, else
    top-1 agreement. An objective that measures ``heldout/acceptance_length`` (EAGLE-3: the accepted tokens per
    round its agreement per position implies, greedy) is ranked by it unless `best_by` is expected_acceptance."""
    order = ("heldout/expected_acceptance", "heldout/top1_agreement")
    if best_by == "top1_agreement":
        order = order[::-1]
    if best_by != "expected_acceptance":
        order = ("heldout/acceptance_length", *order)
    key = next(k for k in order if k in ev)
    return key, ev[key]


def improves(best: dict | None, ev: dict, best_by: str = "auto") -> bool:
    """Whether held-out evaluation `ev` beats `best` ({"step", "metric", "value"} or None: none yet)."""
    key, value = checkpoint_score(ev, best_by)
    return best is None or best["metric"] != key or value > best["value"]


def evals_since_best(history: dict) -> int:
    """How many held-out evaluations came after the best one (0 without a best)."""
    best = history.get("best")
    return 0 if best is None else sum(1 for e in history["eval"] if e["step"] > best["step"])


def trainable_params(model) -> dict[str, torch.Tensor]:
    """A copy (on the CPU) of `model`'s trainable parameters: what training changes, the best step's state."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_trainable_params(model, params: dict[str, torch.Tensor]) -> None:
    """Put :func:`trainable_params` back into `model`."""
    own = dict(model.named_parameters())
    missing = sorted(set(params) - set(own))
    if missing:
        raise TrainingError(f"the best checkpoint's parameters {missing[:3]} are not in the draft being trained; "
                            "delete the train output (or set method.keep_best=false) and train again")
    for name, value in params.items():
        own[name].copy_(value)


# ---------------------------------------------------------------- the loop


def fit(cfg, accelerator, objective: Objective, inputs: dict) -> dict:
    """Train `objective.model` for ``cfg.steps`` optimizer steps (``cfg``: a train/settings.py ``TrainConfig``),
    resuming from the last checkpoint in ``cfg.out_dir``; write the artifact, ``train_metrics.json`` and, last,
    ``manifest.json`` (with `inputs`: the data it read). Returns the metrics written.

    One optimizer step: for each of ``method.grad_accum`` micro-batches (rows drawn by step, seed and rank), the
    objective's loss; a non-finite loss on any rank stops the run naming the last good checkpoint; gradients are
    clipped to ``method.max_grad_norm``; AdamW steps and the warm-up/cosine schedule advances. Every
    ``method.eval_every`` steps (and at the end) the held-out evaluation; the best one's parameters are kept
    (``method.keep_best``) and ``method.patience`` evaluations without a better one stop the run.
    """
    from draftsmith.artifacts.progress import progress, quiet_logs

    out_dir = Path(cfg.out_dir)
    params = [p for p in objective.model.parameters() if p.requires_grad]
    optimizer = new_optimizer(params, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    # The scheduler is stepped by hand once per optimizer step (a prepared one steps once per
    # process), and registered so that save_state / load_state carry it.
    model, optimizer = accelerator.prepare(objective.model, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    objective.prepared(model)

    start_step, history, best_params = 0, {"train": [], "eval": [], "best": None, "stopped_at": None}, None
    found = latest_checkpoint(out_dir) if cfg.resume else None
    if found is not None:
        with quiet_logs("accelerate"):  # no INFO line per loaded file
            accelerator.load_state(str(found[0]))
        start_step, history = found[1], {**history, **json.loads((found[0] / "state.json").read_text())["history"]}
        best_params = load_best_params(found[0])
        accelerator.print(f"train: resuming from {found[0]} (step {start_step})")
    if accelerator.is_main_process and cfg.log_with:
        accelerator.init_trackers(cfg.tracker_project, config=asdict(cfg), init_kwargs=cfg.tracker_init)

    rank, world = accelerator.process_index, accelerator.num_processes
    last_step = history["stopped_at"] or cfg.steps  # a run that stopped early and was resumed stays stopped
    bar = progress(range(start_step, last_step), desc=objective.label, unit="step",
                   disable=not accelerator.is_main_process, initial=start_step, total=cfg.steps)

    def evaluate(step: int) -> dict:
        ev = objective.evaluate(model)
        if ev:
            history["eval"].append({"step": step, **ev})
            accelerator.log(ev, step=step)
        return ev

    if cfg.eval_every and start_step == 0:  # the baseline before any update
        evaluate(0)
    started, tokens, heldout = time.perf_counter(), 0, None
    for step in bar:
        step_metrics: dict[str, float] = {k: 0 for k in objective.summed}
        for micro in range(cfg.grad_accum):
            global_micro = step * cfg.grad_accum + micro
            rows = batch_indices(objective.n_rows, cfg.batch_size, global_micro, cfg.seed, rank, world)
            batch = objective.batch(model, rows, global_micro)
            with accelerator.accumulate(model):
                loss, metrics = objective.loss(model, batch)
                finite = accelerator.gather(torch.isfinite(loss.detach()).reshape(1)).all()  # every rank decides alike
                if not finite:
                    last = latest_checkpoint(out_dir)
                    raise TrainingError(f"loss is not finite ({loss.item()}) at step {step}: training stopped. The last "
                                        f"good checkpoint is {last[0] if last else 'none'}; lower method.lr or check "
                                        "the data")
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # FSDP: its own sharded clip
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            tokens += objective.tokens(batch)
            for key, value in {"loss": loss.item(), **metrics}.items():
                step_metrics[key] = step_metrics.get(key, 0.0) + (value if key in objective.summed
                                                                  else value / cfg.grad_accum)
        step_metrics["lr"] = scheduler.get_last_lr()[0]
        history["train"].append({"step": step + 1, **step_metrics})
        accelerator.log({f"train/{k}": v for k, v in step_metrics.items()}, step=step + 1)
        done = step + 1 == cfg.steps
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or done):
            ev = evaluate(step + 1)
            if ev:
                key, value = checkpoint_score(ev, cfg.best_by)
                heldout = f"{key.split('/')[-1]}@{step + 1}={value:.3f}"  # shown on the bar until the next evaluation
                if improves(history["best"], ev, cfg.best_by):
                    history["best"] = {"step": step + 1, "metric": key, "value": value}
                    if cfg.keep_best:
                        best_params = trainable_params(accelerator.unwrap_model(model))
                if not done and cfg.patience and evals_since_best(history) >= cfg.patience:
                    history["stopped_at"], done = step + 1, True
                    accelerator.print(f"train: stopping at step {step + 1}: {cfg.patience} held-out evaluations "
                                      f"without a better {history['best']['metric']} than step "
                                      f"{history['best']['step']}'s {history['best']['value']:.4f} (method.patience)")
        bar.set_postfix(loss=f"{step_metrics['loss']:.4f}", **({"heldout": heldout} if heldout else {}))
        if cfg.save_every and ((step + 1) % cfg.save_every == 0 or done):
            save_checkpoint(accelerator, out_dir, step + 1, history, cfg.keep_checkpoints,
                            tied=tied_parameter_names(accelerator.unwrap_model(model)), best_params=best_params)
        if done:
            break
    elapsed = time.perf_counter() - started
    if cfg.keep_best and best_params is not None:  # the artifact written is the best held-out step's
        load_trainable_params(accelerator.unwrap_model(model), best_params)
    metrics = _finish(cfg, accelerator, model, objective, history, elapsed, tokens * world, inputs)
    if accelerator.num_processes > 1:
        # the data-parallel wrapper goes before the process group: its reducer, freed last, would destroy gloo's
        # group holding the GIL while a gloo worker releasing the last collective's tensors waits for it (a hang at
        # the end of about one run in five on 2 CPU processes); freed here, the group goes with
        # destroy_process_group, whose binding releases the GIL
        del model
        accelerator.free_memory()
    accelerator.end_training()
    return metrics


def _finish(cfg, accelerator, model, objective: Objective, history: dict, elapsed: float, tokens: int,
            inputs: dict) -> dict:
    """Write the objective's artifact, ``train_metrics.json`` and ``manifest.json`` (main process); -> the metrics."""
    accelerator.wait_for_everyone()
    out_dir = Path(cfg.out_dir)
    bare = accelerator.unwrap_model(model)
    # every rank's parameter checksum: they must be identical after data-parallel training
    checksum = torch.stack([p.detach().double().sum() for p in bare.parameters()]).sum().reshape(1)
    rank_checksums = accelerator.gather(checksum.to(accelerator.device)).tolist()
    written = history["best"]["step"] if cfg.keep_best and history["best"] else None  # None: the last step's
    evals = {e["step"]: e for e in history["eval"]}
    metrics = {"history": history, "final": evals.get(written, history["eval"][-1] if history["eval"] else {}),
               "draft_step": written or (history["train"][-1]["step"] if history["train"] else 0),
               "best": history["best"], "stopped_at": history["stopped_at"],
               "train_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "world_size": accelerator.num_processes,
               "mixed_precision": accelerator.mixed_precision,  # what auto resolved to on this machine
               "rank_param_checksums": rank_checksums, **objective.record(history)}
    if accelerator.is_main_process:
        objective.save(bare, out_dir, metrics["draft_step"])
        write_json(out_dir / "train_metrics.json", metrics)
        write_json(out_dir / "manifest.json", {"schema_version": 1, "stage": "train", "config": asdict(cfg), **inputs,
                                               **objective.manifest(), "provenance": provenance()})
        objective.finished(out_dir)
    accelerator.wait_for_everyone()
    return metrics
