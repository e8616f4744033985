"""Training checkpoints: accelerate ``save_state`` folders, written atomically, newest found on resume.

``out_dir/checkpoints/step_NNNNNNN/`` holds the model, optimizer, scheduler and RNG states of every
process plus ``state.json`` (step and metric history), written last: a folder without it is an
interrupted save and is ignored.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
from pathlib import Path

from draftsmith.artifacts import write_json
from draftsmith.artifacts.progress import quiet_logs


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


class _TiedTensorsExpected(logging.Filter):
    """Drops accelerate's "Removed shared tensor {...} while saving" warning when the removed tensors are the model's
    own tied weights (a tied output head is stored once, as transformers saves it too): said for every checkpoint,
    it is noise; any other shared tensor is still reported."""

    def __init__(self, tied: set[str]):
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        match = re.search(r"Removed shared tensor (\{.*?\}) while saving", message)
        if match is None:
            return True
        try:
            removed = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(removed, set) and removed and {_bare(n) for n in removed} <= self.tied)


def _bare(name: str) -> str:
    """A parameter name without the wrappers' prefixes (DDP's ``module.``, PEFT's ``base_model.model.``)."""
    for prefix in ("module.", "base_model.model.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


def tied_parameter_names(model) -> set[str]:
    """The names of `model`'s parameters that share storage with an earlier one (e.g. a head tied to the embedding)."""
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        ptr = param.data_ptr()
        if ptr in seen:
            tied.add(_bare(name))
        seen.add(ptr)
    return tied


BEST_PARAMS = "best_params.pt"  # the trainable parameters of the best held-out evaluation so far (method.keep_best)


def load_best_params(checkpoint: Path) -> dict | None:
    """The best parameters a checkpoint carries (None when it has none)."""
    import torch

    path = checkpoint / BEST_PARAMS
    return torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None


def save_checkpoint(accelerator, out_dir: Path, step: int, history: dict, keep: int, tied: set[str] = frozenset(),
                    best_params: dict | None = None) -> Path:
    """save_state into a temporary folder, then rename; state.json marks it complete. `tied`: the model's tied
    parameter names (:func:`tied_parameter_names`), whose removal accelerate need not warn about; `best_params`:
    the best held-out evaluation's trainable parameters, kept beside the state (:data:`BEST_PARAMS`)."""
    root = out_dir / "checkpoints"
    final, tmp = root / f"step_{step:07d}", root / f".tmp_step_{step:07d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    quiet = _TiedTensorsExpected(set(tied))
    shared_logger = logging.getLogger("accelerate.utils.other")
    shared_logger.addFilter(quiet)
    try:
        with quiet_logs("accelerate"):  # accelerate logs every file it saves at INFO
            accelerator.save_state(str(tmp))
    finally:
        shared_logger.removeFilter(quiet)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if best_params is not None:
            import torch

            torch.save(best_params, tmp / BEST_PARAMS)
        write_json(tmp / "state.json", {"step": step, "history": history})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final
