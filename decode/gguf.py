"""GGUF checkpoints as models: load them through transformers' GGUF support, or turn them into a model directory.

A ``.gguf`` file (llama.cpp's format, usually quantised) is read by ``from_pretrained(DIR,
gguf_file=NAME)``: transformers dequantises its tensors to the requested dtype and builds the
tokenizer from the file's vocabulary. That needs the ``gguf`` package and an architecture
transformers maps (llama, mistral, qwen2, ...). ``draftsmith.pairs.materialize`` writes the result once
as a normal Hugging Face directory (``save_pretrained``: config, safetensors, tokenizer), so that
everything downstream — the lean forward, training, vLLM, the registry — sees an ordinary model
(it lives in draftsmith, not here: the decode engine writes no artifacts).

Light to import: transformers is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from pathlib import Path

from draftsmith.artifacts.errors import UserError

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
    """The tokenizer stored in a GGUF file (built by transformers from its vocabulary and merges).

    Read through a link in an empty directory: ``AutoTokenizer`` also reads the tokenizer files of the
    directory it is given, and a GGUF file kept in a model directory would get that model's tokenizer.
    """
    import tempfile

    from transformers import AutoTokenizer

    path = require_gguf(path, role)
    try:
        with tempfile.TemporaryDirectory(prefix="draftsmith-gguf-") as alone:
            (Path(alone) / path.name).symlink_to(path.resolve())
            tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise _wrap(exc, path, role) from exc
    tokenizer.name_or_path = str(path)  # not the link's directory, gone by now
    return tokenizer


def load_gguf_model(path: str | Path, role: str = "model", dtype=None):
    """AutoModelForCausalLM from a GGUF file, dequantised to `dtype` (a torch dtype; None = float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = require_gguf(path, role)
    try:
        with _quiet_reader_bar():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=dtype or torch.float32, **_dequantize_kwargs())
    except (OSError, ValueError, KeyError) as exc:
        raise _wrap(exc, path, role) from exc
    return _plain(model)


@contextlib.contextmanager
def _quiet_reader_bar():
    """Within the block, transformers' GGUF tensor reader draws no bar when transformers' bars are off.

    The reader (``modeling_gguf_pytorch_utils``) calls tqdm itself, which ``disable_progress_bar()``
    (:func:`draftsmith.artifacts.progress.quiet_library_bars`, for non-interactive logs) does not reach.
    """
    from transformers.utils import logging as hf_logging

    legacy = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bar = getattr(legacy, "tqdm", None)
    if bar is None or hf_logging.is_progress_bar_enabled():
        yield
        return
    legacy.tqdm = lambda *args, **kwargs: bar(*args, **{**kwargs, "disable": True})
    try:
        yield
    finally:
        legacy.tqdm = bar


def _dequantize_kwargs() -> dict:
    """Ask for every weight unpacked into a plain tensor (transformers with ``GgufConfig``; older ones always do)."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _plain(model):
    """`model` without the GGUF quantizer's mark, once its weights are plain tensors.

    Recent transformers load a GGUF file through ``GgufHfQuantizer``, which says it is neither
    serializable nor trainable even when it dequantised everything: ``save_pretrained`` (and so
    :func:`draftsmith.pairs.materialize`) would refuse the model. Packed GGUF modules would not
    survive a save, so they are an error here, not dropped.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or getattr(quantizer.quantization_config, "quant_method", None) != "gguf":  # a str enum
        return model
    if getattr(quantizer, "packed_modules", None):
        raise GgufError(f"{len(quantizer.packed_modules)} weights of the GGUF model stayed packed; draftsmith "
                        "needs them dequantised (does this transformers honour GgufConfig(dequantize=True)?)")
    quantizer.remove_quantization_config(model)
    return model
