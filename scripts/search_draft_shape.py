"""Choose the draft's shape by measurement: depths x head sizes, costed, distilled briefly, ranked by predicted speedup.

For a target, every candidate draft — the target's first N decoder layers for each --layers N
(draftsmith.pairs.layer_draft, cached), each --sibling model directory, and with --eagle an EAGLE-1 head
(decode/eagle.py: one layer over the target's own features, method.finetune=eagle) — with each --heads size
(a reduced draft vocabulary of that many ids, decode/vocab.py datagen_vocab; 0 = the full head) is:

1. costed without training: c and c_v per K on the --backend forward at a mid-decode context of a
   held-out prompt of --data (decode/timing.py cost_ratios, medians over --cost-repeats), because
   the cost is the shape's, not the weights' (c_v, the target's verify forward, is the same for every
   draft: the median over the candidates is used for all, each one's own reading kept as c_v_own);
2. distilled --steps steps into OUT/<candidate>/train (draftsmith.train.trainer.run: embeddings
   frozen, the reduced head trained on the same ids, the best held-out evaluation kept), because
   the acceptance of an untrained cut says little about the trained one;
3. ranked by the speedup eval/shapes.py predicts from its held-out token acceptance α (top-1
   agreement at --temperature 0, where greedy verification accepts exactly the target's argmax;
   expected acceptance Σ min(p, q) for sampling, the distributions at temperature 1) and its costs,
   at its best K of --k.

Writes OUT/shapes.json (every candidate's figures, predicted speedups and rank) and OUT/shapes.png
(α against the cost of a round at the winner's K, with iso-speedup lines), and prints the JSON.
With --train-full-steps N the winner is then trained N steps into OUT/winner/train. A candidate
whose OUT/<candidate>/candidate.json records the same training settings is not trained again.

    python scripts/search_draft_shape.py --target DIR --data RUN/datagen --layers 2 3 4 --heads 0 8192 \
        --k 2 3 4 --steps 60 --out shapes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from draftsmith.artifacts import provenance, write_json  # noqa: E402
from draftsmith.artifacts.errors import UserError  # noqa: E402
from draftsmith.decode.settings import BACKENDS  # noqa: E402
from draftsmith.eval.shapes import Candidate, Ranked, iso_curve, rank  # noqa: E402

ISO_SPEEDUPS = (1.0, 1.2, 1.4, 1.6)
HELDOUT_ROWS = 64  # the held-out rows each short distillation is scored on (all of them when fewer)


class ShapeSearchError(UserError, ValueError):
    """The search cannot run as asked; the message names the flag and says what to do."""


# ---------------------------------------------------------------- arguments


def layer_spec(text: str):
    """--layers value: "3" -> 3 (the first 3 layers), "0,1,-1" -> [0, 1, -1] (those indices)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of layers (3) or layer indices (0,1,-1)") from None
    return values[0] if len(values) == 1 and "," not in text else values


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target: a model directory, .gguf file or package:MODULE/PATH")
    ap.add_argument("--data", required=True, help="the target's datagen output (RUN/datagen): its train split is "
                                                  "distilled on and ranks the head's ids, its held-out rows score α")
    ap.add_argument("--layers", type=layer_spec, nargs="*", default=[],
                    help="draft shapes: N (the target's first N layers) or comma-separated layer indices, negative "
                         "from the end (0,1,-1: the first two and the last; pair.draft_layers=[0,1,-1])")
    ap.add_argument("--sibling", nargs="*", default=[], help="sibling draft model directories, as candidates too")
    ap.add_argument("--eagle", action="store_true", help="an EAGLE-1 head over the target's features as a candidate "
                    "too (method.finetune=eagle; Llama targets)")
    ap.add_argument("--heads", type=int, nargs="+", default=[0], help="head sizes (reduced vocabulary ids; 0 = full)")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3, 4], help="draft tokens per round to rank at")
    ap.add_argument("--steps", type=int, default=60, help="distillation steps per candidate")
    ap.add_argument("--out", required=True, help="output directory (shapes.json, shapes.png, one folder per candidate)")
    ap.add_argument("--train-full-steps", type=int, default=None, help="then train the winner this many steps")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: alpha is the held-out top-1 agreement (greedy); > 0: the expected acceptance")
    ap.add_argument("--cost-repeats", type=int, default=10, help="timed repeats per cost (medians)")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="the decode length costs are timed for (at the prompt + half of it)")
    ap.add_argument("--backend", default="lean", choices=BACKENDS, help="the cached forward the costs are timed on")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--teacher", default="auto", choices=("auto", "cached", "online"),
                    help="auto: the datagen output's top-k log-probs when it kept them, else the target online")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--cache", default=None, help="where built drafts are kept (default: $DRAFTSMITH_CACHE or "
                                                  "~/.cache/draftsmith)")
    ap.add_argument("--iso", type=float, nargs="+", default=list(ISO_SPEEDUPS), help="iso-speedup lines of the plot")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """The flags' own ranges, before any model is loaded (depths against the target: :func:`check_depths`)."""
    if not args.layers and not args.sibling and not args.eagle:
        raise ShapeSearchError("no candidate: give draft depths with --layers (e.g. --layers 2 3 4), sibling "
                               "draft directories with --sibling, and/or --eagle")
    depths = [n for n in args.layers if isinstance(n, int)]
    for flag, values, low in (("--layers", depths, 1), ("--heads", args.heads, 0), ("--k", args.k, 1)):
        bad = [v for v in values if v < low]
        if bad:
            what = {"--layers": "a draft keeps the target's first N decoder layers, N >= 1",
                    "--heads": "a head size is a number of token ids, 0 for the full head",
                    "--k": "K is the number of draft tokens per round, >= 1"}[flag]
            raise ShapeSearchError(f"{flag} {' '.join(map(str, bad))}: {what}; give values >= {low}")
    for flag, value in (("--steps", args.steps), ("--cost-repeats", args.cost_repeats),
                        ("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ShapeSearchError(f"{flag} {value}: must be >= 1")
    if args.train_full_steps is not None and args.train_full_steps < 1:
        raise ShapeSearchError(f"--train-full-steps {args.train_full_steps}: must be >= 1 (or leave it out)")
    if args.eagle and args.backend == "hf":  # the head's loop runs the target on the lean forward
        raise ShapeSearchError("--eagle with --backend hf: an EAGLE head runs with the target on the lean forward, "
                               "so its costs would not be comparable to the other candidates'; give --backend lean "
                               "(the default) or auto")
    if args.temperature < 0:
        raise ShapeSearchError(f"--temperature {args.temperature}: must be >= 0 (0 = greedy)")
    if args.lr <= 0:
        raise ShapeSearchError(f"--lr {args.lr}: must be > 0")
    if any(s <= 0 for s in args.iso):
        raise ShapeSearchError(f"--iso {' '.join(map(str, args.iso))}: speedups must be > 0")


def check_depths(layers: list, total: int) -> None:
    """Every depth cuts the target short: a draft as deep as the target is the target; index lists name layers it
    has (draftsmith.pairs.layer_indices)."""
    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.pairs import layer_indices

    for spec in layers:
        if not isinstance(spec, int):
            try:
                layer_indices(spec, total)
            except ConfigError as exc:
                raise ShapeSearchError(f"--layers {','.join(map(str, spec))}: {exc}") from None
    bad = [n for n in layers if isinstance(n, int) and n >= total]
    if bad:
        raise ShapeSearchError(f"--layers {' '.join(map(str, bad))}: the target has {total} decoder layers, so a "
                               f"draft keeps 1..{total - 1} of them; give smaller depths")


def check_heads(heads: list[int], width: int) -> None:
    """A reduced head is smaller than the vocabulary (its whole width is the full head, --heads 0)."""
    bad = [h for h in heads if h >= width]
    if bad:
        raise ShapeSearchError(f"--heads {' '.join(map(str, bad))}: the vocabulary has {width} ids, so a reduced "
                               f"head is smaller; give sizes below {width}, or 0 for the full head")


# ---------------------------------------------------------------- inputs


def read_data(data_dir: str) -> dict:
    """What the search needs of the datagen output: a held-out prompt, the held-out row count, whether it kept top-k."""
    from draftsmith.artifacts.formats import read_datagen

    try:
        data, manifest = read_datagen(data_dir)
    except UserError as exc:
        raise ShapeSearchError(f"--data {data_dir}: {exc}") from None
    heldout, train = data["heldout"], data["train"]
    if len(heldout) == 0:
        raise ShapeSearchError(f"--data {data_dir}: the held-out split is empty, and alpha is measured on it; run "
                               "datagen with data.heldout_fraction > 0")
    return {"prompt_ids": list(heldout[0]["prompt_ids"]), "heldout_rows": len(heldout), "train_rows": len(train),
            "topk": "topk_ids" in train.column_names, "target": manifest.get("target")}


def cache_dir(flag: str | None) -> Path:
    """--cache, else the draftsmith cache ($DRAFTSMITH_CACHE or the platform's, where the pipeline keeps its own)."""
    if flag:
        return Path(flag).expanduser()
    from draftsmith.demo import cache_root

    return cache_root()


def log(message: str) -> None:
    """Progress on stderr: stdout carries the JSON only."""
    print(f"search_draft_shape: {message}", file=sys.stderr, flush=True)


def library_log(message: str) -> None:
    """What draftsmith.pairs says (building a draft, dequantising a GGUF file; already prefixed), on stderr."""
    print(message, file=sys.stderr, flush=True)


def drafts(args, target: str, cache: Path, tokenizer) -> list[dict]:
    """The candidate drafts before heads: {name, source, path, layers}, depths first, then siblings."""
    from transformers import AutoConfig

    from draftsmith.decode.pair import check_tokenizers, load_tokenizer
    from draftsmith.pairs import layer_draft

    specs = list({str(n): n for n in args.layers}.values())  # distinct, in the order given
    out = [{"name": f"layers{n}" if isinstance(n, int) else "layers" + "_".join(map(str, n)), "source": "layers",
            "path": layer_draft(target, n, cache, log=library_log), "layers": n if isinstance(n, int) else len(n),
            "indices": None if isinstance(n, int) else list(n)} for n in specs]
    for path in dict.fromkeys(args.sibling):
        if not (Path(path) / "config.json").is_file():
            raise ShapeSearchError(f"--sibling {path}: not a model directory (no config.json); give a local Hugging "
                                   "Face model directory (download it first, e.g. huggingface-cli download)")
        try:
            check_tokenizers(tokenizer, load_tokenizer(path, "sibling draft"), target, path)
        except UserError as exc:
            raise ShapeSearchError(f"--sibling {path}: {exc}") from None
        name = f"sibling-{Path(path).resolve().name}"
        while any(d["name"] == name for d in out):
            name += "+"
        out.append({"name": name, "source": "sibling", "path": str(Path(path).resolve()),
                    "layers": getattr(AutoConfig.from_pretrained(path), "num_hidden_layers", None)})
    if args.eagle:  # no model to cut: the head is built from the target when it is costed and trained
        out.append({"name": "eagle", "source": "eagle", "path": None, "layers": 1})
    return out


# ---------------------------------------------------------------- one candidate


def candidate_name(draft: dict, head: int) -> str:
    return f"{draft['name']}-{'full' if head == 0 else f'head{head}'}"


def measure_costs(args, target_model, draft_model, context, ids) -> dict:
    """c and c_v per K of one shape (untrained weights cost what trained ones do), on --backend."""
    from draftsmith.artifacts.errors import ConfigError
    from draftsmith.decode.timing import cost_ratios

    try:
        return cost_ratios(target_model, draft_model, context, sorted(set(args.k)), repeats=args.cost_repeats,
                           backend=args.backend, draft_vocab=ids)
    except ConfigError as exc:  # the lean forward does not cover one of the models
        raise ShapeSearchError(f"--backend {args.backend}: {exc}; or give --backend auto") from None


def train_config(args, data: dict, draft_path: str | None, head: int, out_dir: Path, steps: int, target: str, *,
                 save_every: int = 0, resume: bool = False):
    """The distillation of one candidate: frozen embeddings, the reduced head on the head's ids, the best kept; an
    EAGLE head (`draft_path` None) trained on the target's features (method.finetune=eagle).

    A short run keeps no checkpoints (save_every 0) and starts afresh; the winner's long one saves and resumes.
    """
    from draftsmith.train.trainer import TrainConfig

    teacher = args.teacher if args.teacher != "auto" else ("cached" if data["topk"] else "online")
    eagle = draft_path is None
    return TrainConfig(data_dir=args.data, draft=target if eagle else draft_path, target=target,
                       out_dir=str(out_dir), steps=steps, finetune="eagle" if eagle else "full",
                       batch_size=args.batch_size, lr=args.lr, warmup_steps=steps // 10,
                       eval_every=max(1, steps // 4), eval_rows=min(HELDOUT_ROWS, data["heldout_rows"]),
                       save_every=save_every, keep_best=True, freeze_embeddings=not eagle, reduced_head=head > 0,
                       draft_vocab=head, teacher=teacher, resume=resume, device=args.device)


def as_json(value):
    """`value` as JSON would read it back (tuples become lists, int keys strings): for comparing settings."""
    return json.loads(json.dumps(value, default=str))


def distill(cfg, name: str) -> tuple[dict, float]:
    """Train (or reuse a finished training with the same settings) -> (train_metrics, train seconds).

    OUT/<candidate>/candidate.json records the settings when training starts and its seconds when it ends; a
    training directory left by other settings (another winner, other --steps) is removed first, so that a
    resumed run never continues another's checkpoints.
    """
    import shutil

    from draftsmith.train.trainer import run

    out = Path(cfg.out_dir)
    record = out.parent / "candidate.json"
    settings = as_json(asdict(cfg))
    done = json.loads(record.read_text()) if record.is_file() else {}
    if done.get("train_config") == settings and "train_s" in done and (out / "train_metrics.json").is_file():
        log(f"{name}: reusing the training in {out} (the same settings)")
        return json.loads((out / "train_metrics.json").read_text()), done["train_s"]
    if out.exists() and done.get("train_config") != settings:
        log(f"{name}: {out} holds a training with other settings; starting afresh")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(record, {"train_config": settings})
    log(f"{name}: distilling {cfg.steps} steps into {out}")
    started = time.perf_counter()
    try:
        metrics = run(cfg)
    except UserError as exc:
        raise ShapeSearchError(f"candidate {name}: {exc}") from None
    seconds = time.perf_counter() - started
    write_json(record, {"train_config": settings, "train_s": seconds})
    return metrics, seconds


def alpha_of(metrics: dict, temperature: float, name: str) -> tuple[str, float]:
    """(key, α) from the train metrics' final held-out evaluation (the one the draft written was taken at)."""
    key = "heldout/top1_agreement" if temperature == 0 else "heldout/expected_acceptance"
    final = metrics.get("final") or {}
    if key not in final:
        raise ShapeSearchError(f"candidate {name}: its training recorded no {key} (held-out evaluations: "
                               f"{sorted(final) or 'none'}); use --temperature 0 (top-1 agreement) or a teacher "
                               "distribution (--teacher online, or a datagen output with top-k log-probs)")
    return key, float(final[key])


# ---------------------------------------------------------------- the search


def search(args) -> dict:
    """The whole search: check, cost every candidate, distil and rank them, write and plot; returns shapes.json."""
    import torch

    from draftsmith.decode.pair import load_model, load_tokenizer

    check_args(args)
    cache = cache_dir(args.cache)
    target = resolve_target(args.target, cache)
    total = target_layers(target)
    check_depths(args.layers, total)
    data = read_data(args.data)
    check_data(args, data, target)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(target, "target")
    target_model = load_model(target, "target", "float32", device)
    found = drafts(args, target, cache, tokenizer)
    costed = cost_candidates(args, target, target_model, tokenizer, found, data, out, device)
    del target_model  # training loads what it needs
    ranked = rank([train_candidate(args, data, target, c) for c in costed], args.k)
    doc = report(args, target, total, data, ranked)
    write_json(out / "shapes.json", doc)
    plot(ranked, out / "shapes.png", args.iso)
    if args.train_full_steps:
        doc["winner"]["full_training"] = train_winner(args, data, target, ranked[0])
        write_json(out / "shapes.json", doc)
    return doc


def resolve_target(ref: str, cache: Path) -> str:
    """--target as a model directory (a .gguf file or package:... path made into one, as the pipeline does)."""
    from draftsmith.pairs import resolve_model

    target = resolve_model(ref, "--target", cache, log=library_log)
    if not (Path(target) / "config.json").is_file():
        raise ShapeSearchError(f"--target {ref}: not a local model directory, .gguf file or package:... path; "
                               "download the model first (e.g. huggingface-cli download)")
    return target


def target_layers(target: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(target).num_hidden_layers


def check_data(args, data: dict, target: str) -> None:
    """The datagen output is this target's and has a batch of training rows: said before any cost is timed."""
    def model_id(name: str) -> str:  # a local directory by its resolved path, a hub id as written (as training)
        return str(Path(name).resolve()) if Path(name).exists() else name

    if data["target"] and model_id(data["target"]) != model_id(target):
        raise ShapeSearchError(f"--data {args.data} was generated by {data['target']!r}, not by --target {target!r}; "
                               "give the target that generated it, or run datagen with this target")
    if data["train_rows"] < args.batch_size:
        raise ShapeSearchError(f"--batch-size {args.batch_size}: {args.data} has {data['train_rows']} training rows; "
                               "lower --batch-size or generate more data")


def cost_candidates(args, target: str, target_model, tokenizer, found: list[dict], data: dict, out: Path,
                    device) -> list[dict]:
    """c and c_v per K of every draft x head, timed back to back before any training (one machine state for all).

    A reduced head's ids are ranked from the datagen output as training's reduced head ranks them (the target's
    EOS kept), and written to OUT/<candidate>/draft_vocab.json.
    """
    import torch

    from draftsmith.decode.eos import pretrained_eos_ids
    from draftsmith.decode.pair import load_model
    from draftsmith.decode.runners import logit_width
    from draftsmith.decode.timing import mid_decode_context
    from draftsmith.decode.vocab import datagen_vocab, save_vocab

    eos = sorted(pretrained_eos_ids(target, tokenizer))
    context = mid_decode_context(torch.tensor([data["prompt_ids"]], device=device), args.max_new_tokens)
    vocabs: dict[tuple[int, int], tuple] = {}  # (head, width) -> (ids, info): ranked once
    costed = []
    for draft in found:
        if draft["source"] == "eagle":  # untrained: a shape costs what its trained weights cost
            from draftsmith.decode.eagle import EagleHead

            try:
                draft_model = EagleHead(target_model)
            except ValueError as exc:
                raise ShapeSearchError(f"--eagle: {exc}") from None
            width = logit_width(target_model)
        else:
            draft_model = load_model(draft["path"], draft["name"], "float32", device)
            width = min(logit_width(target_model), logit_width(draft_model))
        check_heads(args.heads, width)
        for head in dict.fromkeys(args.heads):
            name = candidate_name(draft, head)
            ids, vocab_info = None, None
            if head:
                if (head, width) not in vocabs:
                    vocabs[head, width] = datagen_vocab(args.data, head, width, eos, key="--heads")
                ids, vocab_info = vocabs[head, width]
                (out / name).mkdir(exist_ok=True)
                save_vocab(out / name, ids, **vocab_info)  # the ids eval.draft_vocab=N ranks alike
                ids = ids.to(device)
            log(f"{name}: timing c and c_v at K={sorted(set(args.k))} ({args.backend} forward)")
            costs = measure_costs(args, target_model, draft_model, context, ids)
            costed.append({"draft": draft, "head": head, "name": name, "costs": costs, "vocab": vocab_info,
                           "parameters": sum(p.numel() for p in draft_model.parameters()),
                           "context_tokens": int(context.shape[1])})
        del draft_model
    return pooled_verify_costs(costed)


def pooled_verify_costs(costed: list[dict]) -> list[dict]:
    """Every candidate's c_v replaced by the median over the candidates, per K (each one's own kept as c_v_own).

    c_v is the target's forward over K+1 positions against its one-token forward: the same forward whatever the
    draft, so its differences between candidates are timing noise, which can be as wide as the predicted speedups'
    differences: ranked on their own c_v, the candidates would be ordered by that noise.
    """
    import statistics

    ks = costed[0]["costs"]["c_v"].keys() if costed else ()
    pooled = {k: statistics.median(c["costs"]["c_v"][k] for c in costed) for k in ks}
    for c in costed:
        c["costs"] = {**c["costs"], "c_v_own": dict(c["costs"]["c_v"]), "c_v": dict(pooled)}
    return costed


def train_candidate(args, data: dict, target: str, found: dict) -> Candidate:
    """Distil one costed candidate briefly and make it a :class:`Candidate` with its α."""
    name, head, draft = found["name"], found["head"], found["draft"]
    cfg = train_config(args, data, draft["path"], head, Path(args.out) / name / "train", args.steps, target)
    metrics, seconds = distill(cfg, name)
    key, alpha = alpha_of(metrics, args.temperature, name)
    costs = found["costs"]
    return Candidate(name=name, layers=draft["layers"], head=head, alpha=alpha, c=dict(costs["c"]),
                     c_v=dict(costs["c_v"]), parameters=found["parameters"], train_s=seconds,
                     info={"source": draft["source"], "base_draft": draft["path"], "alpha_key": key,
                           "indices": draft.get("indices"),
                           "train_dir": cfg.out_dir, "draft": str(Path(cfg.out_dir) / "draft"),
                           "target_step_s": costs["target_step_s"], "draft_step_s": costs["draft_step_s"],
                           "vocab": found["vocab"], "best_eval_step": metrics.get("draft_step"),
                           "context_tokens": found["context_tokens"]})


def train_winner(args, data: dict, target: str, winner: Ranked) -> dict:
    """The winner trained --train-full-steps steps (checkpointed every 100, resumable) into OUT/winner/train."""
    c = winner.candidate
    cfg = train_config(args, data, c.info["base_draft"], c.head, Path(args.out) / "winner" / "train",
                       args.train_full_steps, target, save_every=100, resume=True)
    metrics, seconds = distill(cfg, f"winner ({c.name})")
    key, alpha = alpha_of(metrics, args.temperature, c.name)
    return {"candidate": c.name, "steps": args.train_full_steps, "draft": str(Path(cfg.out_dir) / "draft"),
            "draft_vocab": c.head, "alpha": alpha, "alpha_key": key, "train_s": seconds,
            "predicted_speedup": {str(k): v for k, v in rank([_with_alpha(c, alpha)], args.k)[0].predicted.items()}}


def _with_alpha(c: Candidate, alpha: float) -> Candidate:
    return Candidate(name=c.name, layers=c.layers, head=c.head, alpha=alpha, c=c.c, c_v=c.c_v)


def report(args, target: str, total: int, data: dict, ranked: list[Ranked]) -> dict:
    """shapes.json: the settings, then every candidate in rank order with its figures."""
    rows = []
    for r in ranked:
        c = r.candidate
        rows.append({"rank": r.rank, "name": c.name, "source": c.info["source"], "layers": c.layers,
                     "layer_indices": c.info.get("indices"), "head": c.head,
                     "parameters": c.parameters, "alpha": c.alpha, "c": {str(k): v for k, v in c.c.items()},
                     "c_v": {str(k): v for k, v in c.c_v.items()},
                     "predicted_speedup": {str(k): v for k, v in r.predicted.items()}, "best_k": r.best_k,
                     "speedup_at_best_k": r.speedup, "round_cost_at_best_k": r.round_cost, "train_s": c.train_s,
                     "target_step_s": c.info["target_step_s"], "draft_step_s": c.info["draft_step_s"],
                     "head_coverage_heldout": (c.info["vocab"] or {}).get("heldout_coverage"),
                     "best_eval_step": c.info["best_eval_step"], "base_draft": c.info["base_draft"],
                     "draft": c.info["draft"]})
    winner = ranked[0]
    return {"target": target, "target_layers": total, "data": str(args.data), "ks": sorted(set(args.k)),
            "steps": args.steps, "temperature": args.temperature, "alpha_key": winner.candidate.info["alpha_key"],
            "backend": args.backend, "cost_repeats": args.cost_repeats,
            "context_tokens": ranked[0].candidate.info["context_tokens"],
            "heldout_rows_scored": min(HELDOUT_ROWS, data["heldout_rows"]), "candidates": rows,
            "winner": {"name": winner.candidate.name, "best_k": winner.best_k, "speedup": winner.speedup,
                       "draft": winner.candidate.info["draft"], "draft_vocab": winner.candidate.head},
            "plot": "shapes.png", "provenance": provenance()}


# ---------------------------------------------------------------- the plot


def plot(ranked: list[Ranked], path: Path, speedups) -> Path:
    """α against the cost of a round at the winner's K, one labelled point per candidate, iso-speedup lines.

    One K for every point, so that a point's place against the lines is its predicted speedup at that K; the
    labels give each candidate's own best K. The winner's own speedup is drawn as a line too (solid), so the
    plot has a reference through the best point even when every --iso line is out of reach.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = ranked[0].best_k
    xs = [r.candidate.c[k] * k + r.candidate.c_v[k] for r in ranked]
    lo, hi = min(xs) * 0.8, max(xs) * 1.2
    grid = [lo + (hi - lo) * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines = [(s, "--", "grey") for s in speedups] + [(ranked[0].speedup, "-", "tab:red")]
    for s, style, color in lines:
        curve = iso_curve(s, k, grid)
        if curve:
            ax.plot(*zip(*curve), linestyle=style, linewidth=0.9, color=color)
            ax.annotate(f"{s:.2f}x", curve[len(curve) // 2], fontsize=8, color=color, xytext=(2, -10),
                        textcoords="offset points")
    for r, x in zip(ranked, xs):
        c = r.candidate
        ax.scatter([x], [c.alpha], color="tab:red" if r.rank == 1 else "tab:blue", zorder=3)
        ax.annotate(f"{r.rank}. {c.name} (K={r.best_k}: {r.speedup:.2f}x)", (x, c.alpha), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set(xlabel=f"cost of a round at K={k}: K·c + c_v (target steps)", ylabel="held-out token acceptance α",
           ylim=(0, 1), xlim=(lo, hi), title=f"Draft shapes: predicted speedup at K={k} (dashed: iso-speedup)")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


def main(argv=None) -> dict:
    """Run the search and print shapes.json; a user error is one line on stderr and exit 2."""
    from draftsmith.artifacts.progress import quiet_library_bars

    quiet_library_bars()  # non-interactive logs (CI, SLURM, > log): no library progress bars
    try:
        doc = search(parse_args(argv))
    except UserError as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"search_draft_shape: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(doc, indent=2, default=str))
    return doc


if __name__ == "__main__":
    main()
