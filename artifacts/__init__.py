"""Stage outputs on disk: atomic writes (a crash never leaves a half-written output), and the
provenance every manifest carries (git revision, package versions, device, command line).

A package of its own at the bottom of the import graph: `train`, `eval` and the spine
(`draftsmith`: registry, sweep report, demo) write artifacts; the decode engine does not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `final`; on success it replaces `final` in one rename.

    On any exception the temporary directory is removed and `final` is left as it was, so a crash
    never leaves a half-written output that could be mistaken for a complete one.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | Path, data: dict) -> Path:
    """Write JSON through a temporary file and a rename; returns the path."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return Path(path)


def tokenizer_hash(tokenizer) -> str:
    """A short hash of a tokenizer's vocab mapping and special tokens (what decoding depends on)."""
    blob = json.dumps({"vocab": sorted(tokenizer.get_vocab().items()),
                       "special": sorted(map(str, tokenizer.all_special_tokens))})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def provenance() -> dict:
    """Git revision, package versions, interpreter and command line, for manifests."""
    import torch
    import transformers

    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {"git_revision": rev, "python": sys.version.split()[0], "platform": platform.platform(),
            "torch": torch.__version__, "transformers": transformers.__version__, "argv": sys.argv}
