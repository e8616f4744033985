"""datagen: run the target on domain prompts and keep what it says.

Output (written atomically to ``cfg.out_dir``): a ``datasets.DatasetDict`` saved with
``save_to_disk`` under ``data/`` with splits ``train`` and ``heldout``, one row per completion:

    prompt_ids       list[int]   the prompt, as tokenized for the target
    completion_ids   list[int]   the target's new tokens (ends with EOS when `finished`)
    finished         bool        the completion ended with EOS before max_new_tokens
    prompt_index     int         index of the prompt within its split
    topk_ids         list[list[int]]    (top_k_logprobs > 0) the target's top-k token ids per completion position
    topk_logprobs    list[list[float]]  their log-probabilities (temperature 1, before any filter)

and ``manifest.json`` (target, tokenizer hash, sampling settings, the engine, counts, timings, where the
completions came from, provenance); the format's reader and writer are draftsmith.artifacts.formats (every
stage reads it there). With ``data.hidden_states=eagle3`` on vLLM, ``hidden_states/{split}/{row}.safetensors``
beside them: the target's streams at an EAGLE-3 head's layers, kept by vLLM as it wrote the rows
(train/target_states.py).

Two engines make the same rows (``data.engine``): ``hf`` runs transformers' ``generate`` here in
left-padded batches; ``vllm`` sends the same prompt token ids to vLLM's server (train/datagen_vllm.py).
Both end a completion at the first token of the same EOS set (decode/eos.py: ``eos_ids``, ``trim_at_eos``).
Prompt reading, the held-out split, the manifest and the atomic write are shared (:func:`run`).

A record may carry its own response (``data.responses=given|auto``: train/prompts.py says which records do).
Then nothing is generated for it: the response is the completion (cut after its first EOS and at
``data.max_new_tokens``, as a generated one ends), and the HF engine scores it with one teacher-forced forward
per row (:func:`score_all`), keeping the same top-k log-probs that ``generate`` records: log_softmax of the
raw logits at temperature 1; the vLLM engine takes them from the server's prompt log-probs over prompt +
response (train/datagen_vllm.py ``score_all``: one prefill per row, ``data.batch_size`` in flight), generating
for the records without a response on the same server.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from draftsmith.artifacts import atomic_dir, provenance, tokenizer_hash
from draftsmith.artifacts.formats import read_datagen, write_datagen
from draftsmith.decode.eos import eos_ids, pretrained_eos_ids, trim_at_eos
from draftsmith.decode.pair import load_model, load_tokenizer
from draftsmith.artifacts.progress import progress
from draftsmith.artifacts.errors import check
from draftsmith.train.prompts import PreparedPrompts, PromptError, prepare_prompts, read_records
from draftsmith.train.settings import DatagenSettings
from draftsmith.train.target_states import STATES_DIR, keep_states

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
        if self.hidden_states == "auto":  # the Python API's: no train stage here to keep them for (the pipeline
            self.hidden_states = "none"  # resolves auto from its method.*: draftsmith/preflight.py)


@torch.inference_mode()
def generate_batch(model, tokenizer, prompts: list[list[int]], cfg: DatagenConfig,
                   generator_seed: int) -> list[dict]:
    """Generate for a batch of prompts with left padding; one dict per completion, in prompt order."""
    pad = _pad_id(tokenizer)
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


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


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


# -- given responses: scored, not generated -------------------------------------------------------
def given_completion(response: list[int], eos: set[int], max_new_tokens: int) -> tuple[list[int], bool, bool]:
    """A given response as a completion row keeps it -> (tokens, finished, truncated): up to and including its first
    EOS (finished), at most `max_new_tokens` (truncated, not finished), as a generated completion would end."""
    tokens, finished = trim_at_eos(response, eos)
    if len(tokens) > max_new_tokens:
        return tokens[:max_new_tokens], False, True
    return tokens, finished, False


@contextlib.contextmanager
def head_at(model: torch.nn.Module, select: torch.Tensor):
    """Within the block, `model`'s output head runs only where `select` [B, T] is True: logits come out [1, N, V],
    the N selected positions row by row, in order. A forward pre-hook on ``get_output_embeddings()`` picks the
    hidden states before the head (as train/heads.py ``head_at_loss_positions``, for any model family), so
    the prompt positions, usually most of a row, cost no [T, V] head."""
    head = model.get_output_embeddings()

    def pick(module, args):
        hidden = args[0]  # [B, T, H]
        return (hidden[select.to(hidden.device)].unsqueeze(0), *args[1:])  # [1, N, H]

    handle = head.register_forward_pre_hook(pick)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def score_batch(model, rows: list[tuple[list[int], list[int]]], k: int, pad: int,
                device: str) -> list[tuple[list[list[int]], list[list[float]]]]:
    """The target's top-`k` log-probs at every response position of each (prompt ids, response ids) row, from one
    teacher-forced forward -> (top-k ids, top-k log-probs) per row, one entry per response token.

    Right padding with an attention mask: every row's real tokens start at position 0, so positions need no
    adjustment. Position p + j - 1 of a row with a p-token prompt predicts response token j (0-based), and
    only there does the head run. log_softmax in float32 at temperature 1: the quantity :func:`generate_batch`
    keeps (generate's ``output_logits``, the raw logits before any processor).
    """
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    select = torch.zeros((len(rows), width), dtype=torch.bool)  # the positions that predict a response token
    for row, (prompt, response) in enumerate(rows):  # right padding: real tokens at the left end
        n = len(prompt) + len(response)
        input_ids[row, :n] = torch.tensor(prompt + response)
        mask[row, :n] = 1
        select[row, len(prompt) - 1 : n - 1] = True
    with head_at(model, select):
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    top = torch.topk(torch.log_softmax(logits[0].float(), -1), k, dim=-1)  # [N, k], N = sum of response lengths
    out, at = [], 0
    for _, response in rows:
        out.append((top.indices[at : at + len(response)].tolist(), top.values[at : at + len(response)].tolist()))
        at += len(response)
    return out


def score_all(model, tokenizer, prompts: list[list[int]], responses: list[list[int]], cfg: DatagenConfig,
              desc: str) -> tuple[list[dict], int]:
    """Rows for prompts that come with their responses -> (rows in prompt order, as :func:`generate_all`'s; how many
    responses were cut at data.max_new_tokens). The completion is the response (:func:`given_completion`); with
    data.top_k_logprobs the target's top-k log-probs at its positions (:func:`score_batch`, data.batch_size rows
    per forward, batched by similar length: less padding)."""
    rows, truncated = given_rows(prompts, responses, eos_ids(model.generation_config, tokenizer), cfg.max_new_tokens)
    if cfg.top_k_logprobs and rows:
        order = sorted(range(len(rows)), key=lambda i: len(prompts[i]) + len(rows[i]["completion_ids"]))
        bar = progress(total=len(rows), desc=desc, unit="response")
        for b in range(0, len(order), cfg.batch_size):
            idx = order[b : b + cfg.batch_size]
            tops = score_batch(model, [(rows[i]["prompt_ids"], rows[i]["completion_ids"]) for i in idx],
                               cfg.top_k_logprobs, _pad_id(tokenizer), cfg.device)
            for i, (ids, logprobs) in zip(idx, tops):
                rows[i]["topk_ids"], rows[i]["topk_logprobs"] = ids, logprobs
            bar.update(len(idx))
        bar.close()
    return rows, truncated


def given_rows(prompts: list[list[int]], responses: list[list[int]], eos: set[int],
               max_new_tokens: int) -> tuple[list[dict], int]:
    """The rows of prompts that come with their responses, before scoring -> (rows in prompt order: prompt_ids,
    completion_ids (the response, :func:`given_completion`), finished, prompt_index; how many responses were cut at
    `max_new_tokens`). Both engines score these."""
    made = [given_completion(r, eos, max_new_tokens) for r in responses]
    rows = [{"prompt_ids": p, "completion_ids": c, "finished": f, "prompt_index": i}
            for i, (p, (c, f, _)) in enumerate(zip(prompts, made))]
    return rows, sum(truncated for *_, truncated in made)


# -- every split's rows, from either engine ---------------------------------------------------------
@dataclass
class Completions:
    """What the engine made: rows per split, seconds generating, the manifest's engine record and ``responses``
    counts (rows given and generated, given responses cut at data.max_new_tokens, scoring seconds and rate), log
    files for the output."""

    splits: dict[str, list[dict]]
    generate_s: float
    engine: dict
    responses: dict
    logs: list[Path] = field(default_factory=list)
    scored: dict[str, list[dict]] = field(default_factory=dict)  # complete_vllm: the scored rows, before the merge
    states_dir: Optional[Path] = None  # data.hidden_states: where vLLM wrote the rows' states (removed after the run)


def merge_rows(generated: list[dict], generated_at: list[int], scored: list[dict], scored_at: list[int]) -> list[dict]:
    """One split's generated and scored rows in prompt order: each row's prompt_index (its prompt's place in its own
    list) becomes the prompt's index in the split (`*_at`); a prompt's completions keep their order."""
    rows = [{**r, "prompt_index": generated_at[r["prompt_index"]]} for r in generated]
    rows += [{**r, "prompt_index": scored_at[r["prompt_index"]]} for r in scored]
    return sorted(rows, key=lambda r: r["prompt_index"])  # stable


def complete_vllm(cfg: DatagenConfig, tokenizer, to_generate: dict[str, list[list[int]]],
                  to_score: dict[str, tuple[list[list[int]], list[list[int]]]]) -> Completions:
    """Every split's rows from one vLLM server: generated for `to_generate`'s prompts, scored (its prompt log-probs
    over prompt + response, train/datagen_vllm.py score_all) for `to_score`'s (prompts, responses); rows carry
    prompt_index into their own list (merged by the caller). The server's start-up is outside the seconds."""
    from draftsmith.train import datagen_vllm

    eos = pretrained_eos_ids(cfg.target, tokenizer)
    log = Path(tempfile.mkdtemp(prefix="draftsmith-datagen-")) / "vllm_server.log"  # kept (quoted) on failure
    scored, truncated = {}, 0
    with datagen_vllm.engine(cfg, log) as served:
        started = time.perf_counter()
        generated = {name: datagen_vllm.generate_all(served.url, served.model, ids, cfg, eos, f"datagen {name}")
                     for name, ids in to_generate.items()}
        gen_s, started = time.perf_counter() - started, time.perf_counter()
        for name, (prompts, responses) in to_score.items():
            rows, cut = given_rows(prompts, responses, eos, cfg.max_new_tokens)
            scored[name] = datagen_vllm.score_all(served.url, served.model, rows, cfg, f"datagen {name} (scoring)")
            truncated += cut
        score_s = time.perf_counter() - started
        if cfg.hidden_states != "none":
            datagen_vllm.settle_states(served.url, served.model, [r for rows in generated.values() for r in rows], cfg)
    if not log.exists():  # data.vllm.url: nothing was launched
        shutil.rmtree(log.parent, ignore_errors=True)
    states_dir = (served.info.get("hidden_states") or {}).pop("workdir", None)
    return Completions(generated, gen_s, served.info, responses_counts(generated, scored, truncated, score_s),
                       [log] if log.exists() else [], scored=scored,
                       states_dir=Path(states_dir) if states_dir else None)


def complete_splits(cfg: DatagenConfig, tokenizer, prepared: PreparedPrompts) -> Completions:
    """Every split's rows from the configured engine: generated for the prompts without a response, scored for
    those with one, in prompt order. The engine's start-up (model load, vLLM server) is outside the seconds."""
    names = ("train", "heldout")
    given_at = {n: [i for i, r in enumerate(prepared.responses[n]) if r is not None] for n in names}
    new_at = {n: [i for i, r in enumerate(prepared.responses[n]) if r is None] for n in names}
    to_generate = {n: [getattr(prepared, n)[i] for i in new_at[n]] for n in names}
    to_score = {n: ([getattr(prepared, n)[i] for i in given_at[n]], [prepared.responses[n][i] for i in given_at[n]])
                for n in names}
    engine = cfg.engine
    if engine == "auto":  # the Python API's (the pipeline resolves it before the stage's hash: draftsmith/preflight.py)
        from draftsmith.train.datagen_vllm import resolve_engine

        engine = resolve_engine(cfg)[0]
    if engine == "vllm":
        made = complete_vllm(cfg, tokenizer, to_generate, to_score)
        made.splits = {n: merge_rows(made.splits[n], new_at[n], made.scored[n], given_at[n]) for n in names}
        return made
    model = load_model(cfg.target, "target", cfg.dtype, cfg.device)
    started = time.perf_counter()
    generated = {n: generate_all(model, tokenizer, ids, cfg, f"datagen {n}") if ids else []
                 for n, ids in to_generate.items()}
    gen_s, started = time.perf_counter() - started, time.perf_counter()
    scored, truncated = {}, 0
    for n in names:
        scored[n], cut = score_all(model, tokenizer, *to_score[n], cfg, f"datagen {n} (scoring)")
        truncated += cut
    score_s = time.perf_counter() - started
    splits = {n: merge_rows(generated[n], new_at[n], scored[n], given_at[n]) for n in names}
    return Completions(splits, gen_s, {"name": "hf"},  # transformers' version: provenance
                       responses_counts(generated, scored, truncated, score_s))


def responses_counts(generated: dict[str, list[dict]], scored: dict[str, list[dict]], truncated: int,
                     score_s: float) -> dict:
    """The manifest's ``responses`` counts: rows scored from given responses and rows generated, the given ones cut
    at data.max_new_tokens, the scoring's seconds and scored tokens per second."""
    tokens = sum(len(r["completion_ids"]) for rows in scored.values() for r in rows)
    return {"given": sum(map(len, scored.values())), "generated": sum(map(len, generated.values())),
            "truncated": truncated, "score_s": score_s, "score_tokens_per_s": tokens / score_s if score_s else 0.0}


def run(cfg: DatagenConfig, log=print) -> dict:
    """Run datagen end to end; returns the manifest (also written to ``out_dir/manifest.json``).

    ``timing.tokens_per_s`` is every completion token over the engine's seconds, generating and scoring; the
    manifest's ``responses`` says how many rows were scored from given responses and how many generated.
    """
    started = time.time()
    tokenizer = load_tokenizer(cfg.target, "target")
    records = read_records(cfg.source(), tokenizer, cfg.responses)
    prepared = prepare_prompts(records, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                               heldout_fraction=cfg.heldout_fraction, max_prompts=cfg.max_prompts)
    if len(prepared.train) < cfg.min_prompts:
        raise PromptError(f"data.prompts={cfg.prompts!r}: only {len(prepared.train)} usable training prompts "
                         f"(need >= {cfg.min_prompts}; counts: {prepared.counts}). Add prompts or raise "
                         "data.max_prompt_tokens.")
    made = complete_splits(cfg, tokenizer, prepared)
    with _states_folder_removed(made.states_dir):
        return _write(cfg, made, prepared, started, tokenizer, log)


def _write(cfg: DatagenConfig, made: "Completions", prepared: PreparedPrompts, started: float, tokenizer,
           log) -> dict:
    """The output of a datagen run: rows, states, manifest and logs, written atomically."""
    import datasets

    if made.responses["truncated"]:
        log(f"draftsmith: datagen: {made.responses['truncated']} given responses were longer than "
            f"data.max_new_tokens={cfg.max_new_tokens} and were cut to it (finished=False); raise it to keep them "
            "whole")
    kept = made.engine.get("hidden_states")
    if cfg.hidden_states != "none" and kept is None:
        log(f"draftsmith: datagen: data.hidden_states={cfg.hidden_states} keeps what vLLM writes; transformers wrote "
            "these rows (data.engine), so the train stage runs the target over them itself")
    n_tokens = sum(len(r["completion_ids"]) for rows in made.splits.values() for r in rows)
    engine_s = made.generate_s + made.responses["score_s"]
    manifest = {
        "schema_version": SCHEMA_VERSION, "stage": "datagen", "target": cfg.target,
        "tokenizer_hash": tokenizer_hash(tokenizer), "config": asdict(cfg), "engine": made.engine,
        "counts": {**prepared.counts, "completions": {k: len(v) for k, v in made.splits.items()},
                   "completion_tokens": n_tokens},
        "responses": {"mode": cfg.responses, **made.responses},
        "timing": {"generate_s": made.generate_s, "tokens_per_s": n_tokens / engine_s if engine_s else 0.0,
                   "total_s": time.time() - started},
        "provenance": provenance(),
    }
    with atomic_dir(cfg.out_dir) as tmp:
        if kept is not None:  # the states files into the output, each row's path out of the row
            manifest["hidden_states"] = {"layers": kept["layers"], "final_layer": kept["final_layer"],
                                         **keep_states(made.splits, tmp, log),
                                         "files": f"{STATES_DIR}/{{split}}/{{row}}.safetensors"}
        features = _features(cfg.top_k_logprobs > 0)
        ds = datasets.DatasetDict({name: datasets.Dataset.from_list(rows, features=features)
                                   for name, rows in made.splits.items()})
        write_datagen(tmp, ds, manifest)
        for path in made.logs:
            shutil.copy(path, tmp / path.name)
    for path in made.logs:
        shutil.rmtree(path.parent, ignore_errors=True)
    return manifest


@contextlib.contextmanager
def _states_folder_removed(folder: Optional[Path]):
    """Remove the folder vLLM wrote the rows' states into (beside the output) once they are kept, or on failure."""
    try:
        yield
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


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
