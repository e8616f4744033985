"""GGUF checkpoints as models: load them through transformers' GGUF support, or turn them into a model directory.

A ``.gguf`` file (llama.cpp's format, usually quantised) is read by ``from_pretrained(DIR,
gguf_file=NAME)``: transformers dequantises its tensors to the requested dtype and builds the
tokenizer from the file's vocabulary. That needs the ``gguf`` package and an architecture
transformers maps (llama, mistral, qwen2, ...). :func:`materialize` writes the result once as a
normal Hugging Face directory (``save_pretrained``: config, safetensors, tokenizer), so that
everything downstream — the lean forward, training, vLLM, the registry — sees an ordinary model.

Light to import: transformers is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from decode.errors import UserError

GGUF_HINT = "install the gguf package: pip install gguf"


class GgufError(UserError, ValueError):
    """A GGUF file that cannot be used; the message names the file and says what to do."""


def is_gguf(name_or_path: str | Path) -> bool:
    """Whether `name_or_path` names a GGUF file (by its suffix)."""
    return str(name_or_path).lower().endswith(".gguf")


def require_gguf(path: str | Path, role: str = "model") -> Path:
    """The GGUF file as a Path; :class:`GgufError` when it is missing or the ``gguf`` package is not installed."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise GgufError(f"the {role} GGUF file {path} does not exist")
    if importlib.util.find_spec("gguf") is None:
        raise GgufError(f"the {role} is a GGUF file ({path}) and reading it needs the gguf package: {GGUF_HINT}")
    return path


def _wrap(exc: Exception, path: Path, role: str) -> GgufError:
    text = str(exc)
    if "not supported" in text:
        return GgufError(f"the {role} GGUF file {path}: {text} transformers maps llama, mistral, qwen2, qwen3, "
                         "gemma, phi3 and a few more; convert the checkpoint to a Hugging Face directory instead")
    return GgufError(f"cannot read the {role} GGUF file {path}: {text}")


def load_gguf_tokenizer(path: str | Path, role: str = "model"):
    """The tokenizer stored in a GGUF file (built by transformers from its vocabulary and merges)."""
    from transformers import AutoTokenizer

    path = require_gguf(path, role)
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise _wrap(exc, path, role) from exc


def load_gguf_model(path: str | Path, role: str = "model", dtype=None):
    """AutoModelForCausalLM from a GGUF file, dequantised to `dtype` (a torch dtype; None = float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = require_gguf(path, role)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                    dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise _wrap(exc, path, role) from exc


def file_digest(path: str | Path, chunk: int = 1 << 23) -> str:
    """sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def materialize(path: str | Path, root: str | Path, dtype: str = "float32", role: str = "model", log=print) -> Path:
    """The model directory made from a GGUF file (dequantised to `dtype`), written once under `root`.

    The directory is keyed by the file's content hash and the dtype, written atomically and reused
    by later runs (and by concurrent sweep runs: the first writer wins, the others find it).
    """
    import torch

    from artifacts import atomic_dir, write_json

    path = require_gguf(path, role)
    digest = file_digest(path)
    entry = Path(root) / f"gguf-{path.stem[:40]}-{digest[:12]}-{dtype}"
    if (entry / "gguf_source.json").exists():
        return entry
    log(f"draftsmith: dequantising the {role} {path.name} to {dtype} (once; cached in {entry})")
    model = load_gguf_model(path, role, getattr(torch, dtype))
    tokenizer = load_gguf_tokenizer(path, role)
    with atomic_dir(entry) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "gguf_source.json", {"file": str(path.resolve()), "sha256": digest, "dtype": dtype,
                                              "parameters": model.num_parameters()})
    return entry
