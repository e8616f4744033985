"""Start-up checks: everything that can be known before the first stage runs, as one line each.

A pipeline can spend hours of target time in datagen; a bad draft, device, output directory or
registry setting must not surface after it. :func:`preflight` runs after the config is built and
validated (``draftsmith.config``) and before any stage; each check raises a user error (one line,
naming the key or the file) and does no work beyond reading files and asking torch about devices.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.artifacts.errors import ConfigError


def check_out_dir(out_dir: Path) -> None:
    """out_dir must be a directory or creatable as one (not an existing file, not under one)."""
    for path in (out_dir, *out_dir.parents):
        if path.exists():
            if not path.is_dir():
                raise ConfigError(f"out_dir={out_dir}: {path} is a file, not a directory; choose another out_dir")
            if not os.access(path, os.W_OK):
                raise ConfigError(f"out_dir={out_dir}: {path} is not writable; choose another out_dir")
            return


def check_device(key: str, device: str) -> None:
    """`device` (cpu, cuda, cuda:N, mps, auto) must exist on this machine; `key` names the setting."""
    if device in ("cpu", "auto"):
        return
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"{key}={device}: torch {torch.__version__} ({build}) sees no CUDA device on this "
                              f"machine; use {key}=cpu, or install a CUDA build of torch on a GPU machine")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={device}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                              f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    elif device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}=mps: the MPS backend is not available on this machine; use {key}=cpu")


def check_registry_root(root: str) -> None:
    """registry.root must be a directory we can write to, or creatable under one."""
    path = Path(root).expanduser()
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"registry.root={root}: {parent} is a file, not a directory; set registry.root "
                                  "to a directory you can write to")
            if not os.access(parent, os.W_OK):
                raise ConfigError(f"registry.root={root}: {parent} is not writable; set registry.root to a "
                                  "directory you can write to")
            return


def check_pair(target: str, draft: str | None) -> None:
    """Target and draft tokenizers agree and their local weight files are whole (no model is loaded); with no draft
    (an EAGLE head is trained from the target alone), the target's alone."""
    from draftsmith.decode.pair import check_tokenizers, check_weight_files, load_tokenizer

    target_tok = load_tokenizer(target, "target")
    check_weight_files(target, "target")
    if draft is not None:
        check_tokenizers(target_tok, load_tokenizer(draft, "draft"), target, draft)
        check_weight_files(draft, "draft")


def check_eagle_target(target: str) -> None:
    """method.finetune=eagle: the target is one an EAGLE head is built for (a Llama without biases), read from its
    config alone, before datagen spends its time (the head itself checks its layers again: decode/eagle.py)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(target)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"method.finetune=eagle: cannot read the config of pair.target={target} ({exc})") from exc
    kind = getattr(config, "model_type", None)
    biased = [key for key in ("attention_bias", "mlp_bias") if getattr(config, key, False)]
    if kind != "llama" or biased:
        why = f"its model type is {kind!r}" if kind != "llama" else f"it has {' and '.join(biased)}"
        raise ConfigError(f"method.finetune=eagle trains vLLM's EagleLlamaForCausalLM head, for Llama targets without "
                          f"biases, but pair.target={target}: {why}; train a draft model instead (method=kd with "
                          "pair.draft or pair.draft_layers)")


def check_eagle3_target(target: str, layers) -> None:
    """method.finetune=eagle3: the target is a decoder draftsmith's loop runs with the head (the lean forward's
    families: it keeps the streams the head reads), with three distinct feature layers, read from its config
    alone before datagen spends its time. The head's own layer is a Llama layer whatever the target's family, so
    biases (Qwen2) and q/k norms (Qwen3) are fine; sliding-window, multimodal and encoder-decoder targets are not
    (their features or their decoding are not what this loop runs)."""
    from transformers import AutoConfig

    from draftsmith.decode.eagle3 import default_layers
    from draftsmith.decode.lean import config_unsupported

    try:
        config = AutoConfig.from_pretrained(target)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"method.finetune=eagle3: cannot read the config of pair.target={target} ({exc})") from exc
    reason = config_unsupported(config)
    if reason is not None:
        raise ConfigError(f"method.finetune=eagle3 trains a head for the targets draftsmith's loop runs it with (its "
                          f"lean forward: Llama, Mistral, Qwen2, Qwen3 with full attention); pair.target={target}: "
                          f"{reason}: train a draft model instead (method=kd with pair.draft or pair.draft_layers)")
    n = int(config.num_hidden_layers)
    chosen = list(layers) if layers is not None else default_layers(n)
    if len(set(chosen)) != 3 or any(not 0 <= i < n for i in chosen):
        raise ConfigError(f"method.eagle_layers={chosen if layers is not None else None}: an EAGLE-3 head reads 3 "
                          f"distinct layers of the target, ids in [0, {n}) (pair.target={target} has {n} layers; the "
                          "default (2, L//2, L-3) needs at least 7): set method.eagle_layers=[a,b,c]")


def check_draft_kind(draft: str | None, finetune: str) -> None:
    """A draft model is trained from a draft model, a head from a head of its kind: an EAGLE head's directory as
    pair.draft needs method=eagle, an EAGLE-3 folder method=eagle3."""
    from draftsmith.decode.eagle import is_eagle_dir
    from draftsmith.decode.eagle3 import is_eagle3_dir

    if draft is not None and finetune != "eagle" and is_eagle_dir(draft):
        raise ConfigError(f"pair.draft={draft} is an EAGLE head (its config.json names EagleLlamaForCausalLM), which "
                          f"method.finetune={finetune} cannot train: train it further with method=eagle, or give a "
                          "draft model")
    if draft is not None and finetune != "eagle3" and is_eagle3_dir(draft):
        raise ConfigError(f"pair.draft={draft} is an EAGLE-3 head (a speculators-format folder), which "
                          f"method.finetune={finetune} cannot train: train it further with method=eagle3, or give a "
                          "draft model")


def check_datagen_engine(data, log=print) -> None:
    """data.engine=auto becomes vllm or hf here (train/datagen_vllm.py ``resolve_engine``: before the stage's hash,
    which covers the engine), said in one line; data.engine=vllm: the server at data.vllm.url answers, or vLLM is
    importable by data.vllm.python."""
    if data.engine == "auto":
        from draftsmith.train.datagen_vllm import resolve_engine

        data.engine, why = resolve_engine(data)
        log(f"draftsmith: datagen: {why} -> data.engine={data.engine}")
        if data.engine == "vllm" and data.vllm.url is None:
            return  # resolve_engine's probe found vLLM importable: no second probe
    if data.engine != "vllm":
        return
    from draftsmith.serve.client import http_get
    from draftsmith.serve.server import require_vllm

    url = data.vllm.url
    if url is None:
        require_vllm(data.vllm.python, key="data.vllm.python", engine_key="data.engine")
    elif http_get(url.rstrip("/") + "/v1/models", timeout_s=10.0)[0] != 200:
        raise ConfigError(f"data.vllm.url={url}: nothing answers {url.rstrip('/')}/v1/models; start vLLM's "
                          "OpenAI-compatible server there, or unset data.vllm.url to start one here")


def resolve_hidden_states(cfg, target: str, draft: str | None = None, log=print) -> None:
    """data.hidden_states=auto becomes eagle3 or none here (before the datagen stage's hash, which covers it), said
    in one line. eagle3 where the train stage would run an EAGLE-3 head's target over the rows in float32 on a CPU
    (no native bf16, or method.mixed_precision other than bf16) at the layers vLLM keeps (its default three), and a
    vLLM started here generates rows (data.engine=vllm, no data.vllm.url, one completion a prompt, not every
    response given): there that forward costs more than vLLM keeping the states as it writes the rows
    (BENCHMARKS.md, "The preset as on an AVX2-only host"). none elsewhere: where the forward runs in bf16 on a CPU it
    cost less (40.7 minutes end to end with the states against 36.2, BENCHMARKS.md "The target's states from
    vLLM"); on a GPU it is not measured. `draft`: pair.draft (an EAGLE-3 folder trained further reads its own
    layers)."""
    data = cfg.data
    if data.hidden_states != "auto":
        return
    why = _states_not_kept(data, cfg.method, target, draft)
    data.hidden_states = "none" if why else "eagle3"
    reason = why or ("the train stage would run the target over the rows in float32 on this CPU; vLLM keeps its "
                     "states as it writes them")
    log(f"draftsmith: datagen: data.hidden_states=auto: {reason} -> data.hidden_states={data.hidden_states}")


def _states_not_kept(data, method, target: str, draft: str | None) -> str | None:
    """Why data.hidden_states=auto resolves to none (:func:`resolve_hidden_states`), or None: eagle3."""
    if method.finetune != "eagle3":
        return f"method.finetune={method.finetune} (vLLM keeps states for an EAGLE-3 head's training only)"
    if data.engine != "vllm":
        return "transformers writes the rows (data.engine=hf)"
    if data.vllm.url:
        return "the server at data.vllm.url was not started with draftsmith's connector"
    if data.n_completions != 1:
        return f"data.n_completions={data.n_completions} (vLLM keeps one sequence's states a request)"
    if data.responses == "given":
        return "every row is a given response (vLLM keeps the states of the rows it generates)"
    from draftsmith.decode.eagle3 import default_layers, is_eagle3_dir, read_eagle3_config
    from draftsmith.train.loop import mixed_precision, run_device
    from draftsmith.train.target_states import layer_count

    device = run_device(method)
    if device != "cpu":
        return f"the train stage runs on {device} (the states from vLLM are not measured there)"
    if mixed_precision(method, device) == "bf16":
        return "the train stage runs the target in bf16 on this CPU, where its forward costs less"
    n = layer_count(target, "data.hidden_states=auto")
    kept = default_layers(n)
    if len(set(kept)) != 3:
        return f"pair.target has {n} layers, too few for vLLM's three distinct default layers ({kept})"
    if draft and is_eagle3_dir(draft):  # a head trained further reads its own layers
        reads, whose = read_eagle3_config(draft)["eagle_aux_hidden_state_layer_ids"], f"the head at pair.draft={draft}"
    else:
        reads, whose = method.eagle_layers, "method.eagle_layers"
    if reads is not None and sorted(reads) != sorted(kept):
        return f"{whose} reads layers {list(reads)}, not vLLM's default layers {kept}"
    return None


def preflight(pipeline) -> None:
    """Every start-up check of `pipeline` (a :class:`draftsmith.pipeline.Pipeline`) before its first stage."""
    cfg = pipeline.cfg
    stages = set(cfg.stages)
    check_out_dir(pipeline.out)
    check_device("pair.device", cfg.pair.device)
    if "train" in stages:
        check_device("method.device", cfg.method.device)
    if "datagen" in stages:
        check_datagen_engine(cfg.data, pipeline.log)
        pipeline.tracker.resolved("data.engine", cfg.data.engine)
    if "promote" in stages:
        check_registry_root(cfg.registry.root)
    target, draft = pipeline.pair()  # builds the demo pair on first use
    if "datagen" in stages:
        resolve_hidden_states(cfg, target, draft, pipeline.log)
        pipeline.tracker.resolved("data.hidden_states", cfg.data.hidden_states)
    if "train" in stages:
        check_draft_kind(draft, cfg.method.finetune)
        if cfg.method.finetune == "eagle":
            check_eagle_target(target)
        elif cfg.method.finetune == "eagle3":
            check_eagle3_target(target, cfg.method.eagle_layers)
    if stages & {"train", "eval", "promote"}:
        check_pair(target, draft)
    else:
        from draftsmith.decode.pair import check_weight_files, load_tokenizer

        load_tokenizer(target, "target")
        check_weight_files(target, "target")
    if stages & {"eval", "promote"}:
        pipeline.check_registry_target(target)
    if "serve" in stages:
        pipeline.resolve_serving_engine()
        pipeline.tracker.resolved("serve.engine", cfg.serve.engine)
