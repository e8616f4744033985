"""The target's features of a datagen output's rows, computed once per train run and kept for a resume.

An EAGLE head learns from the target's teacher-forced features (EAGLE-1: its last post-norm features; EAGLE-3: the
streams entering three layers and its final features). They are computed before the first step and written to
``OUT/train/features.pt`` with a key (:func:`features_key`: the datagen output, the target, the rows, the kind of
head and its layers, the training rows' precision), so a resumed run reads them back instead of computing them
again; the objective deletes the file when the stage completes.

The training rows' features are computed in bf16 when the training runs in it (``method.mixed_precision=bf16``, or
auto where it resolves to bf16: a GPU that has it, a CPU with AMX or AVX512-BF16), else in float32 (fp16 is not
used for the target's forward: its activations may overflow it); the held-out rows' always in float32, as the
head is served and its held-out figures (the best step) are read. Why: the pass runs ~2x faster where bf16 is
native, and the head is no worse for it (BENCHMARKS.md, "The preset's cheaper stages"). Only the held-out rows carry
the target's argmax over its full head (``top``, read by the held-out figures; the loss reads the final features):
its product with the whole vocabulary is a fifth of a small target's forward.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable

import torch

FEATURES = "features.pt"
FEATURES_FORMAT = 2  # bump when what features.pt holds changes: older files are then computed again (2: the
# training rows without the target's argmax)


def split_rows(split, max_len: int | None) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, completion_ids) of a datagen split, cut to `max_len` tokens in all (method.max_len)."""
    return indexed_split_rows(split, max_len)[1]


def indexed_split_rows(split, max_len: int | None) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(each kept row's index in the split, :func:`split_rows`): rows of fewer than 2 tokens are left out."""
    index, out = [], []
    for i, row in enumerate(split):
        prompt, completion = list(row["prompt_ids"]), list(row["completion_ids"])
        if max_len is not None:
            prompt = prompt[:max_len]
            completion = completion[:max(0, max_len - len(prompt))]
        if len(prompt) + len(completion) >= 2:
            index.append(i)
            out.append((prompt, completion))
    return index, out


def with_stored(compute: Callable[..., list], stored: Callable[..., dict | None], train_index: list[int],
                heldout_index: list[int]) -> Callable[..., list]:
    """`compute` that first asks `stored(split, row_index, prompt, completion, top)` for each row's features (the
    states a datagen output keeps: train/target_states.py) and runs `compute` on the rows without them only, in
    order. The training rows are the ones asked for without `top`, the held-out ones with it (load_features)."""
    def both(rows, top: bool) -> list:
        split, index = ("heldout", heldout_index) if top else ("train", train_index)
        items = [stored(split, i, prompt, completion, top) for i, (prompt, completion) in zip(index, rows)]
        missing = [j for j, item in enumerate(items) if item is None]
        if missing:
            for j, item in zip(missing, compute([rows[j] for j in missing], top)):
                items[j] = item
        return items
    return both


def features_key(cfg, n_train: int, n_heldout: int, train_precision: str = "no", **kind) -> dict:
    """What makes ``features.pt`` reusable: the format, the datagen output (its path and the sha256 of its
    manifest.json, which a regenerated output at the same path changes: its timings, counts, config), the target,
    the rows, the precision of the training rows' features (`train_precision`: bf16, or no: float32) and `kind`
    (what the head reads: EAGLE-3's kind and layers)."""
    import hashlib

    from draftsmith.artifacts.formats import DATAGEN_MANIFEST

    manifest = hashlib.sha256((Path(cfg.data_dir) / DATAGEN_MANIFEST).read_bytes()).hexdigest()
    return {"format": FEATURES_FORMAT, "data": str(Path(cfg.data_dir).resolve()), "data_manifest": manifest,
            "target": str(cfg.target), "max_len": cfg.max_len, "train_rows": n_train, "heldout_rows": n_heldout,
            "train_precision": train_precision, **kind}


def load_features(out_dir: Path, key: dict, compute: Callable[..., list], train_rows, heldout_rows, log=print,
                  write: bool = True, train_precision=contextlib.nullcontext) -> tuple[list, list]:
    """The target's features of both splits: read from ``out_dir/features.pt`` when it holds these rows of this
    target (its key equals `key`), else computed (`compute(rows, top)`: teacher-forced forwards, with the target's
    argmax where `top`: the held-out rows; the training rows inside `train_precision()`, an autocast) and, with
    `write` (the main process), written there atomically; a torn or foreign file is computed again."""
    path = out_dir / FEATURES
    if path.exists():
        try:
            cached = torch.load(path, weights_only=False)
        except Exception:  # a torn or foreign file: computed again
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key:
            return cached["train"], cached["heldout"]
    start = time.perf_counter()
    with train_precision():
        train = compute(train_rows, False)
    heldout = compute(heldout_rows, True)
    tokens = sum(len(it["ids"]) for it in train + heldout)
    log(f"train: the target's features of {len(train) + len(heldout)} rows ({tokens} tokens) in "
        f"{time.perf_counter() - start:.0f} s")
    if write:
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"key": key, "train": train, "heldout": heldout}, tmp)
        os.replace(tmp, path)
    return train, heldout


def run_features(cfg, accelerator, ds, compute: Callable[..., list], stored: Callable[..., dict | None] | None = None,
                 **kind) -> tuple[list, list]:
    """A train run's features (:func:`load_features` in ``cfg.out_dir``, keyed by :func:`features_key` and `kind`)
    of the datagen splits `ds`: every training row and the first ``method.eval_rows`` held-out ones, cut to
    ``method.max_len``, the training rows under the accelerator's autocast when it is bf16, the held-out ones in
    float32; the main process writes them, every process waits for it. With `stored`, a row's features come from
    it where it has them (:func:`with_stored`), from `compute` elsewhere. A TrainingError when fewer
    usable training rows than one batch per process remain."""
    from draftsmith.train.loop import TrainingError

    heldout = ds["heldout"].select(range(min(cfg.eval_rows, len(ds["heldout"]))))
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bf16 = str(accelerator.mixed_precision) == "bf16"
    key = features_key(cfg, len(ds["train"]), len(heldout), train_precision="bf16" if bf16 else "no", **kind)
    train_index, train_rows = indexed_split_rows(ds["train"], cfg.max_len)
    heldout_index, heldout_rows = indexed_split_rows(heldout, cfg.max_len)
    if stored is not None:
        compute = with_stored(compute, stored, train_index, heldout_index)
    train, held = load_features(out_dir, key, compute, train_rows, heldout_rows, log=accelerator.print,
                                write=accelerator.is_main_process,
                                train_precision=accelerator.autocast if bf16 else contextlib.nullcontext)
    accelerator.wait_for_everyone()
    world = accelerator.num_processes
    if len(train) < cfg.batch_size * world:
        raise TrainingError(f"{cfg.data_dir}: {len(train)} usable training rows, fewer than method.batch_size="
                            f"{cfg.batch_size} x {world} processes; lower method.batch_size or generate more data")
    return train, held
