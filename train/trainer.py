"""train: the train stage — a draft (or an EAGLE head) trained on what the target said, in the one loop.

Reads a datagen output, writes to ``cfg.out_dir``:
    draft/              what serving engines load: a merged HF model directory with the tokenizer, or an EAGLE
                        head's folder (``method.finetune=eagle``; ``eagle3``: a speculators-format folder)
    adapter/            the LoRA adapter (method.finetune=lora only)
    checkpoints/step_N/ accelerate ``save_state`` checkpoints; ``resume`` continues from the last
    train_metrics.json  loss curve and periodic held-out metrics
    manifest.json       resolved config, inputs, provenance; written last, it marks completion

This module picks the objective for ``method.finetune`` (train/distill.py for a draft model, train/eagle_objective.py
for an EAGLE-1 head, train/eagle3_objective.py for an EAGLE-3 head) and hands it to train/loop.py ``fit``, which
owns everything a run shares.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from draftsmith.decode.pair import load_tokenizer
from draftsmith.train.inputs import check_inputs
from draftsmith.train.loop import TrainingError, fit, new_accelerator, run_device
from draftsmith.train.settings import HEADS, RENAMED, TrainConfig

__all__ = ["TrainConfig", "TrainingError", "run", "main"]


def run(cfg: TrainConfig) -> dict:
    """Train the draft (or head) of `cfg`; returns the metrics written to ``train_metrics.json``."""
    from accelerate.utils import set_seed

    from draftsmith.train.datagen import load_output

    ds, manifest = load_output(cfg.data_dir)
    if cfg.finetune in HEADS:
        from draftsmith.train.eagle3_objective import Eagle3Objective
        from draftsmith.train.eagle_objective import EagleObjective

        tokenizer = load_tokenizer(cfg.target, "target")
        # the head proposes the target's own ids, and learns from the target's features (no stored top-k needed)
        check_inputs(replace(cfg, draft=cfg.target, teacher="online"), manifest, ds, tokenizer, tokenizer)
        accelerator = new_accelerator(cfg, run_device(cfg))
        set_seed(cfg.seed)
        kind = EagleObjective if cfg.finetune == "eagle" else Eagle3Objective
        objective = kind(cfg, accelerator, ds, tokenizer)
    else:
        from draftsmith.train.distill import DistillObjective

        draft_tok = load_tokenizer(cfg.draft, "draft")
        target_tok = load_tokenizer(cfg.target, "target") if cfg.target else None
        check_inputs(cfg, manifest, ds, draft_tok, target_tok)
        accelerator = new_accelerator(cfg, run_device(cfg))
        set_seed(cfg.seed)
        objective = DistillObjective(cfg, accelerator, ds, draft_tok)
    inputs = {"data": str(cfg.data_dir), "data_target": manifest.get("target"),
              "tokenizer_hash": manifest.get("tokenizer_hash")}
    return fit(cfg, accelerator, objective, inputs)


def main(argv: list[str] | None = None) -> None:
    """``python -m draftsmith.train.trainer CONFIG.json``: the train stage from a JSON TrainConfig.

    The form to start under ``torchrun --nproc_per_node N`` or ``accelerate launch``.
    """
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m draftsmith.train.trainer CONFIG.json  (fields of draftsmith.train.trainer.TrainConfig)")
    fields = json.loads(Path(args[0]).read_text())
    renamed = [f"the field {old!r} is now {new!r}" for old, new in RENAMED.items() if old in fields]
    if renamed:
        raise SystemExit(f"{args[0]}: {'; '.join(renamed)}: rename it in the JSON (fields of TrainConfig)")
    run(TrainConfig(**fields))


if __name__ == "__main__":
    main()
