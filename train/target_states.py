"""The target's hidden states kept beside a datagen output (``data.hidden_states=eagle3``), written by vLLM as it
generates the rows and read by an EAGLE-3 train stage instead of a forward of its own.

vLLM's ``extract_hidden_states`` speculative method keeps, for every token that goes through a forward, the
residual streams entering the layers it is given; a KV connector writes them per request when the request ends
(serve/vllm_hidden_states.py ``CpuHiddenStatesConnector``, vLLM's own connector without its CUDA copy). Asked for
the layers an EAGLE-3 head reads and for layer L (the stream after the last layer, the final norm's input), with
``include_output_tokens``, it keeps a row's prompt and every generated token but the last (never an input):

    OUT/datagen/hidden_states/{split}/{row}.safetensors
        hidden_states   [N, len(layers) + 1, H] in the served dtype (float32 here), N = prompt + completion - 1
        token_ids       [N]: the tokens they were computed over (checked against the row)

The train stage (:func:`stored_features`) makes of each file what train/eagle3.py ``target_aux_rows`` makes of a
forward: ``aux`` (the layers' streams, concatenated), ``h`` (the last stream through the target's final norm: what
its head reads) and, for held-out rows, ``top`` (the argmax of the target's head over ``h``). A row's last token has
no states, so its last slot (the one predicting past the row) is not trained on. On SmolLM2 vLLM-CPU's states were
within ~1e-4 (relative, per token) of transformers' float32 forward, and the final features picked the same argmax
(scripts/probe_vllm_hidden_states.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Optional

STATES_DIR = "hidden_states"


def layer_count(target: str, key: str) -> int:
    """The layer count L of a target folder or hub id, from its config (a ConfigError naming `key` and pair.target
    where it cannot be read)."""
    from transformers import AutoConfig

    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.decode.eagle3 import target_text_config

    try:
        return int(target_text_config(AutoConfig.from_pretrained(target)).num_hidden_layers)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot read the config of pair.target={target} ({exc})") from exc


def state_layers(target: str) -> tuple[list[int], int]:
    """(the layers an EAGLE-3 head reads by default, the target's layer count L) of a target folder or hub id: vLLM
    keeps the streams entering those layers and layer L's (after the last layer)."""
    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.decode.eagle3 import default_layers

    n = layer_count(target, "data.hidden_states=eagle3")
    layers = default_layers(n)
    if not 0 <= layers[0] < layers[1] < layers[2] < n:
        raise ConfigError(f"data.hidden_states=eagle3: {target} has {n} layers, too few for an EAGLE-3 head's "
                          f"three distinct ones ({layers}); set data.hidden_states=none")
    return layers, n


def extraction_configs(layers: list[int], final: int, folder: str, module: str | None) -> tuple[dict, dict]:
    """(speculative_config, kv_transfer_config) that make vLLM keep the streams at `layers` and `final` and write
    them into `folder` through draftsmith's connector module `module` (serve/vllm_hidden_states.py, on vLLM's
    PYTHONPATH), or vLLM's own connector when `module` is None."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [*layers, final]}}}
    transfer = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": folder}}
    if module is not None:
        transfer.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path=module)
    return spec, transfer


def vllm_server_args(layers: list[int], final: int, module: str, folder: str) -> list[str]:
    """The api_server arguments of :func:`extraction_configs` with draftsmith's connector."""
    spec, transfer = extraction_configs(layers, final, folder, module)
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(transfer)]


def wait_written(path: str, timeout_s: float = 120.0) -> bool:
    """Block until the connector has written `path` (it holds an exclusive lock on ``path.lock`` until then; the file
    is polled for as well, up to `timeout_s`) -> whether it exists."""
    import time

    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def keep_states(rows: dict[str, list[dict]], out: Path, log=print) -> dict:
    """Move each row's states file (its ``hidden_states_path``, dropped from the row) to ``out/hidden_states/
    {split}/{row}.safetensors`` -> the manifest's counts: rows kept per split, rows left without (a file vLLM did not
    write, or one not computed over the row's tokens: the train stage runs the target over those), the dtype."""
    from safetensors import safe_open

    kept, missing, dtype = {}, [], None
    for split, split_rows in rows.items():
        folder = out / STATES_DIR / split
        folder.mkdir(parents=True, exist_ok=True)
        kept[split] = 0
        for i, row in enumerate(split_rows):
            path = row.pop("hidden_states_path", None)
            if path is None:
                continue
            fed = None
            if wait_written(path, timeout_s=5.0):  # datagen waited for them with the server up (settle_states)
                with safe_open(path, "pt") as f:
                    fed = f.get_tensor("token_ids").tolist()
                    dtype = dtype or str(f.get_slice("hidden_states").get_dtype())
            if fed != (list(row["prompt_ids"]) + list(row["completion_ids"]))[:-1]:
                missing.append(f"{split} {i}")
                Path(path).unlink(missing_ok=True)
            else:
                shutil.move(path, folder / f"{i}.safetensors")
                kept[split] += 1
            Path(path + ".lock").unlink(missing_ok=True)
    if missing:
        log(f"draftsmith: datagen: vLLM kept no states of the rows' own tokens for {len(missing)} rows "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): the train stage runs the target over those")
    return {"rows": kept, "rows_without": len(missing), "dtype": dtype}


def states_file(data_dir: str | Path, split: str, row: int) -> Path:
    return Path(data_dir) / STATES_DIR / split / f"{row}.safetensors"


def stored_layers(manifest: dict) -> Optional[tuple[list[int], int]]:
    """(layers, final layer) of the states a datagen output keeps (its manifest's ``hidden_states``), or None."""
    kept = manifest.get("hidden_states")
    if not kept:
        return None
    return list(kept["layers"]), int(kept["final_layer"])


def stored_features(path: Path, prompt: list[int], completion: list[int], n_layers: int, norm, head_w, top: bool,
                    dtype) -> dict:
    """One row's features from its states file, as train/eagle3.py ``target_aux_rows`` gives them (on the CPU): ``ids``
    (the row's tokens that went through vLLM's forward: all but its last), ``aux`` [N, n_layers*H], ``h`` [N, H] (the
    last stream through `norm`, the target's final norm, computed in float32 on the target's device),
    ``prompt_len`` and with `top` the argmax of `head_w` (the target's head) over ``h``. `dtype`: the precision the
    rows are kept in (aux and h cast to it: the training rows' under bf16)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(path), device=str(head_w.device))
    ids = list(prompt) + list(completion)
    states, fed = saved["hidden_states"], saved["token_ids"].tolist()
    m = min(len(ids), len(fed))
    if fed[:m] != ids[:m] or states.shape[1] != n_layers + 1:
        raise ValueError(f"{path}: its states are not of this row's tokens at {n_layers} layers and the last "
                         "stream; regenerate the datagen output (or set data.hidden_states=none)")
    states = states[:m].float()
    with torch.no_grad():
        h = norm(states[:, -1])  # in float32, then kept in `dtype`
        item = {"ids": torch.tensor(ids[:m]), "aux": states[:, :-1].reshape(m, -1).to(dtype).cpu(),
                "h": h.to(dtype).cpu(), "prompt_len": len(prompt)}
        if top:
            item["top"] = (h @ head_w.float().T).argmax(-1).cpu()
    return item
