"""Mirror a promoted local registry version to W&B Registry (``wandb-registry-model/<collection>``).

The draft is logged as a ``model`` artifact with its eval summary as metadata, then linked to the
collection with the promotion aliases. W&B cannot link offline (``link_artifact`` raises
``NotImplementedError``), so offline the artifact is logged for a later ``wandb sync`` and the link
is recorded in ``<registry root>/wandb_pending_links.json``; the next online promotion (or
``draftsmith-registry link-pending``) re-logs those versions from the local registry (W&B dedupes
identical files) and links them. ``WANDB_MODE=disabled`` makes every call a no-op.

Imports go one way: this module uses draftsmith.tracking (the W&B mode, the artifact of a version);
tracking never imports it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from draftsmith.artifacts import write_json
from draftsmith.tracking import model_artifact, wandb_mode

PENDING = "wandb_pending_links.json"


def _pending(root: Path) -> list[dict]:
    path = Path(root) / PENDING
    return json.loads(path.read_text()) if path.exists() else []


def _pending_lock(root: Path):
    from filelock import FileLock

    return FileLock(str(Path(root) / f"{PENDING}.lock"))


def _link(run, version_dir: Path, name: str, collection: str, aliases: list[str], metadata: dict) -> str:
    """Log and link; returns "linked", "disabled", or raises NotImplementedError offline."""
    artifact = run.log_artifact(model_artifact(version_dir, name, metadata), aliases=list(aliases))
    if getattr(run, "disabled", False):
        return "disabled"
    run.link_artifact(artifact, f"wandb-registry-model/{collection}", aliases=list(aliases))
    return "linked"


def link_model(run, version_dir: Path, name: str, collection: str, aliases: list[str], metadata: dict,
               root: Path, project: str = "draftsmith", mode: str | None = None, wandb_dir: str | None = None) -> dict:
    """Log + link one registry version; offline, record the link as pending. Returns the outcome.

    `run` is the promote stage's wandb run (a ``wandb.Run``), or None to open one just for this (``job_type`` promote)
    in `mode` (online / offline / disabled; None: $WANDB_MODE, else online), writing under `wandb_dir`.
    """
    import wandb

    own = run is None
    wb = wandb.init(project=project, job_type="promote", reinit="create_new", mode=wandb_mode(mode),
                    dir=wandb_dir) if own else run
    try:
        entry = {"version_dir": str(version_dir), "name": name, "collection": collection, "aliases": list(aliases),
                 "metadata": metadata}
        completed = [] if wb.offline else complete_pending(wb, root)
        try:
            status = _link(wb, Path(version_dir), name, collection, aliases, metadata)
        except NotImplementedError:
            with _pending_lock(root):  # sweep jobs promoting offline at once: no entry lost
                write_json(Path(root) / PENDING, _pending(root) + [entry])
            print(f"draftsmith: W&B is offline, so the registry link of {name} to wandb-registry-model/{collection} is "
                  f"pending (recorded in {Path(root) / PENDING}); the artifact is logged for `wandb sync`. Run "
                  "`draftsmith-registry link-pending` online (or promote online) to complete it.", file=sys.stderr)
            status = "pending"
        return {"status": status, "collection": f"wandb-registry-model/{collection}", "completed_pending": completed}
    finally:
        if own:
            wb.finish()


def complete_pending(run, root: Path) -> list[str]:
    """Link every pending version recorded under `root` (online run); returns the linked version dirs."""
    done, left = [], []
    with _pending_lock(root):
        for entry in _pending(root):
            try:
                _link(run, Path(entry["version_dir"]), entry["name"], entry["collection"], entry["aliases"],
                      entry["metadata"])
                done.append(entry["version_dir"])
            except NotImplementedError:
                left.append(entry)
        if done:
            write_json(Path(root) / PENDING, left)
    return done
