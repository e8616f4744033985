"""Training checkpoints: accelerate ``save_state`` folders, written atomically, newest found on resume.

``out_dir/checkpoints/step_NNNNNNN/`` holds the model, optimizer, scheduler and RNG states of every
process plus ``state.json`` (step and metric history), written last: a folder without it is an
interrupted save and is ignored.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from draftsmith.artifacts import write_json
from draftsmith.decode.progress import quiet_logs


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
    with quiet_logs("accelerate"):  # accelerate logs every file it saves at INFO
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
