"""datagen: run the target on domain prompts and keep what it says.

Output (written atomically to ``cfg.out_dir``): a ``datasets.DatasetDict`` saved with
``save_to_disk`` under ``data/`` with splits ``train`` and ``heldout``, one row per completion:

    prompt_ids       list[int]   the prompt, as tokenized for the target
    completion_ids   list[int]   the target's new tokens (ends with EOS when `finished`)
    finished         bool        the completion ended with EOS before max_new_tokens
    prompt_index     int         index of the prompt within its split
    topk_ids         list[list[int]]    (top_k_logprobs > 0) the target's top-k token ids per completion position
    topk_logprobs    list[list[float]]  their log-probabilities (temperature 1, before any filter)

and ``manifest.json`` (target, tokenizer hash, sampling settings, the engine, counts, timings, provenance);
the format's reader and writer are draftsmith.artifacts.formats (every stage reads it there).

Two engines make the same rows (``data.engine``): ``hf`` runs transformers' ``generate`` here in
left-padded batches; ``vllm`` sends the same prompt token ids to vLLM's server (train/datagen_vllm.py).
Both end a completion at the first token of the same EOS set (decode/eos.py's ``eos_ids``, :func:`trim_at_eos`).
Prompt reading, the held-out split, the manifest and the atomic write are shared (:func:`run`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftsmith.artifacts import atomic_dir, provenance, tokenizer_hash
from draftsmith.artifacts.formats import read_datagen, write_datagen
from draftsmith.decode.eos import eos_ids, pretrained_eos_ids
from draftsmith.decode.pair import load_model, load_tokenizer
from draftsmith.artifacts.progress import progress
from draftsmith.artifacts.errors import check
from draftsmith.train.prompts import PromptError, prepare_prompts, read_prompts
from draftsmith.train.settings import DatagenSettings

SCHEMA_VERSION = 1


@dataclass(kw_only=True)
class DatagenConfig(DatagenSettings):
    """A datagen run: the settings plus what the pipeline wires in (target, output, precision)."""

    target: str  # HF directory or hub id of the target
    out_dir: str  # output directory (replaced atomically)
    dtype: str = "float32"
    device: str = "cpu"
    extra: dict = field(default_factory=dict)  # free-form provenance from the caller

    def __post_init__(self):
        super().__post_init__()
        check(bool(self.prompts), "data.prompts is required: a .jsonl / .parquet file, a folder or a HF dataset id")


@torch.inference_mode()
def generate_batch(model, tokenizer, prompts: list[list[int]], cfg: DatagenConfig,
                   generator_seed: int) -> list[dict]:
    """Generate for a batch of prompts with left padding; one dict per completion, in prompt order."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):  # left padding: real tokens at the right end
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    sampling = cfg.temperature > 0
    torch.manual_seed(generator_seed)  # HF generate samples from the global generator
    out = model.generate(
        input_ids=input_ids.to(cfg.device), attention_mask=mask.to(cfg.device), max_new_tokens=cfg.max_new_tokens,
        do_sample=sampling, temperature=cfg.temperature if sampling else None, top_p=cfg.top_p if sampling else None,
        top_k=0 if sampling else None, num_return_sequences=cfg.n_completions, pad_token_id=pad,
        return_dict_in_generate=True, output_logits=cfg.top_k_logprobs > 0,
    )
    new = out.sequences[:, width:].cpu()  # [B*n, T]
    eos = eos_ids(model.generation_config, tokenizer)
    if cfg.top_k_logprobs:
        logp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # [B*n, T, V]
        top = torch.topk(logp, cfg.top_k_logprobs, dim=-1)
    records = []
    for row in range(new.shape[0]):
        tokens, finished = trim_at_eos(new[row].tolist(), eos)
        rec = {"prompt_ids": prompts[row // cfg.n_completions], "completion_ids": tokens, "finished": finished}
        if cfg.top_k_logprobs:
            rec["topk_ids"] = top.indices[row, : len(tokens)].tolist()
            rec["topk_logprobs"] = top.values[row, : len(tokens)].tolist()
        records.append(rec)
    return records


def trim_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """(`tokens` up to and including the first EOS, whether there was one): where a completion ends, for both engines."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), None)
    return (tokens[:end], True) if end is not None else (list(tokens), False)


def generate_all(model, tokenizer, prompts: list[list[int]], cfg: DatagenConfig, desc: str) -> list[dict]:
    """All completions for `prompts`, batched by similar length (less padding), returned in prompt order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: dict[int, list[dict]] = {}
    bar = progress(total=len(prompts), desc=desc, unit="prompt")  # rare whole lines when stderr is a log
    started, n_tokens = time.perf_counter(), 0
    for b in range(0, len(order), cfg.batch_size):
        idx = order[b : b + cfg.batch_size]
        recs = generate_batch(model, tokenizer, [prompts[i] for i in idx], cfg, cfg.seed + b)
        for j, i in enumerate(idx):
            results[i] = recs[j * cfg.n_completions : (j + 1) * cfg.n_completions]
        n_tokens += sum(len(r["completion_ids"]) for r in recs)
        bar.update(len(idx))
        bar.set_postfix(tok_s=f"{n_tokens / (time.perf_counter() - started):.1f}")
    bar.close()
    rows = []
    for i in range(len(prompts)):
        for rec in results[i]:
            rows.append({**rec, "prompt_index": i})
    return rows


def generate_splits(cfg: DatagenConfig, tokenizer, prompts: dict[str, list[list[int]]]):
    """Every split's rows from the configured engine -> (rows per split, generate seconds, the manifest's engine
    record, log files for the output). The engine's start-up (model load, vLLM server) is outside the seconds."""
    if cfg.engine == "vllm":
        from draftsmith.train import datagen_vllm

        eos = pretrained_eos_ids(cfg.target, tokenizer)
        log = Path(tempfile.mkdtemp(prefix="draftsmith-datagen-")) / "vllm_server.log"  # kept (quoted) on failure
        with datagen_vllm.engine(cfg, log) as served:
            started = time.perf_counter()
            splits = {name: datagen_vllm.generate_all(served.url, served.model, ids, cfg, eos, f"datagen {name}")
                      for name, ids in prompts.items()}
            gen_s = time.perf_counter() - started
        if not log.exists():  # data.vllm.url: nothing was launched
            shutil.rmtree(log.parent, ignore_errors=True)
        return splits, gen_s, served.info, [log] if log.exists() else []
    model = load_model(cfg.target, "target", cfg.dtype, cfg.device)
    started = time.perf_counter()
    splits = {name: generate_all(model, tokenizer, ids, cfg, f"datagen {name}") for name, ids in prompts.items()}
    return splits, time.perf_counter() - started, {"name": "hf"}, []  # transformers' version: provenance


def run(cfg: DatagenConfig) -> dict:
    """Run datagen end to end; returns the manifest (also written to ``out_dir/manifest.json``)."""
    import datasets

    started = time.time()
    tokenizer = load_tokenizer(cfg.target, "target")
    texts = read_prompts(cfg.source(), tokenizer)
    prepared = prepare_prompts(texts, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                               heldout_fraction=cfg.heldout_fraction, max_prompts=cfg.max_prompts)
    if len(prepared.train) < cfg.min_prompts:
        raise PromptError(f"data.prompts={cfg.prompts!r}: only {len(prepared.train)} usable training prompts "
                         f"(need >= {cfg.min_prompts}; counts: {prepared.counts}). Add prompts or raise "
                         "data.max_prompt_tokens.")
    splits, gen_s, engine, logs = generate_splits(cfg, tokenizer, {"train": prepared.train, "heldout": prepared.heldout})
    n_tokens = sum(len(r["completion_ids"]) for rows in splits.values() for r in rows)
    features = _features(cfg.top_k_logprobs > 0)
    ds = datasets.DatasetDict({name: datasets.Dataset.from_list(rows, features=features)
                               for name, rows in splits.items()})
    manifest = {
        "schema_version": SCHEMA_VERSION, "stage": "datagen", "target": cfg.target,
        "tokenizer_hash": tokenizer_hash(tokenizer), "config": asdict(cfg), "engine": engine,
        "counts": {**prepared.counts, "completions": {k: len(v) for k, v in splits.items()},
                   "completion_tokens": n_tokens},
        "timing": {"generate_s": gen_s, "tokens_per_s": n_tokens / gen_s if gen_s else 0.0,
                   "total_s": time.time() - started},
        "provenance": provenance(),
    }
    with atomic_dir(cfg.out_dir) as tmp:
        write_datagen(tmp, ds, manifest)
        for log in logs:
            shutil.copy(log, tmp / log.name)
    for log in logs:
        shutil.rmtree(log.parent, ignore_errors=True)
    return manifest


def _features(with_topk: bool):
    import datasets

    f = {"prompt_ids": datasets.Sequence(datasets.Value("int32")),
         "completion_ids": datasets.Sequence(datasets.Value("int32")),
         "finished": datasets.Value("bool"), "prompt_index": datasets.Value("int32")}
    if with_topk:
        f["topk_ids"] = datasets.Sequence(datasets.Sequence(datasets.Value("int32")))
        f["topk_logprobs"] = datasets.Sequence(datasets.Sequence(datasets.Value("float32")))
    return datasets.Features(f)


def load_output(out_dir: str | Path):
    """(DatasetDict, manifest) of a datagen output (:func:`draftsmith.artifacts.formats.read_datagen`: a clear
    error naming the directory when it is missing or incomplete)."""
    return read_datagen(out_dir)
