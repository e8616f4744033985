"""Benchmark datagen: batched target generation vs one prompt at a time, or the HF engine vs vLLM; same prompts, greedy.

Prints JSON: tokens/s of each mode (median over repeats, modes interleaved), the ratio, and how
many prompts gave identical completions in both modes.

    python scripts/bench_datagen.py                       # the demo target, 64 prompts, batch 32
    python scripts/bench_datagen.py --target DIR --batch-size 16

With ``--engine hf vllm`` it compares the datagen engines instead (data.engine): HF generate in
batches of --batch-size against vLLM's server with --batch-size requests in flight (started once,
warmed up, outside the timing), both with the top-k log-probs datagen keeps (--top-k-logprobs);
the JSON adds the vLLM / HF ratio, the identical completions and the largest top-k log-prob
difference over the positions where both engines chose the same tokens.

    python scripts/bench_datagen.py --engine hf vllm     # vLLM from $DRAFTSMITH_VLLM_PYTHON or ./.venv-vllm

``vllm-states`` is vLLM keeping the target's hidden states as it writes (data.hidden_states=eagle3: a second
server, with the extract_hidden_states method and draftsmith's connector; each repeat's files are counted, then
deleted): ``--engine vllm vllm-states`` measures what keeping them costs; the JSON adds the vllm-states / vllm
ratio and their identical completions.

    python scripts/bench_datagen.py --engine vllm vllm-states --target DIR --prompts 128 --repeats 4 --top-k-logprobs 0

With ``--score`` it measures what ``data.responses=given`` costs against generating: the HF engine generates
greedy responses for the prompts (generated tokens/s), then scores those same responses with one teacher-forced
forward per row (scored tokens/s), the two interleaved over the repeats; the JSON adds the scored / generated
ratio, the largest difference between the top-k log-probs recorded while generating and those scored, and
whether the top-k ids agree.

    python scripts/bench_datagen.py --score --batch-size 16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from draftsmith.decode.pair import load_model, load_tokenizer  # noqa: E402
from draftsmith.demo import build_demo_target, demo_prompts  # noqa: E402
from draftsmith.decode.eos import pretrained_eos_ids  # noqa: E402
from draftsmith.train.datagen import DatagenConfig, generate_all, score_all  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target dir or hub id (default: the demo target)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engine", nargs="+", choices=["hf", "vllm", "vllm-states"],
                    help="compare datagen engines (e.g. --engine hf vllm) instead of batched vs one at a time")
    ap.add_argument("--score", action="store_true",
                    help="generate greedy responses, then score the same responses (data.responses=given), timed")
    ap.add_argument("--top-k-logprobs", type=int, default=32,
                    help="with --engine or --score: datagen's data.top_k_logprobs")
    ap.add_argument("--vllm-dtype", default="float32", help="with --engine vllm: the dtype vLLM serves the target in "
                    "(datagen's: pair.dtype); the HF engine stays float32")
    ap.add_argument("--vllm-python", help="with --engine vllm: the interpreter that imports vllm (data.vllm.python)")
    args = ap.parse_args(argv)

    target = args.target or str(build_demo_target(log=lambda m: print(m, file=sys.stderr)))
    tokenizer = load_tokenizer(target, "target")
    model = load_model(target, "target", "float32", "cpu")
    prompts = [p[0].tolist() for p in demo_prompts(tokenizer, args.prompts, args.prompt_tokens, seed=7)]
    if args.engine:
        return compare_engines(args, target, tokenizer, model, prompts)
    if args.score:
        return compare_scoring(args, target, tokenizer, model, prompts)

    def config(batch_size: int) -> DatagenConfig:
        return DatagenConfig(target=target, prompts="-", out_dir="-", max_new_tokens=args.max_new_tokens,
                             batch_size=batch_size)

    rates = {"batched": [], "one_at_a_time": []}
    outputs = {}
    for rep in range(args.repeats):
        modes = [("batched", args.batch_size), ("one_at_a_time", 1)]
        for name, bs in modes if rep % 2 == 0 else modes[::-1]:
            start = time.perf_counter()
            rows = generate_all(model, tokenizer, prompts, config(bs), f"{name} (repeat {rep + 1})")
            seconds = time.perf_counter() - start
            rates[name].append(sum(len(r["completion_ids"]) for r in rows) / seconds)
            outputs[name] = [r["completion_ids"] for r in rows]
    equal = sum(a == b for a, b in zip(outputs["batched"], outputs["one_at_a_time"]))
    tps = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "target": target, "params": model.num_parameters(), "settings": vars(args), "threads": torch.get_num_threads(),
        "tokens_per_s": tps, "tokens_per_s_all_repeats": rates,
        "batched_vs_one_at_a_time": tps["batched"] / tps["one_at_a_time"],
        "identical_completions": f"{equal}/{len(prompts)}",
    }
    print(json.dumps(report, indent=2))
    return report


def compare_engines(args, target, tokenizer, model, prompts) -> dict:
    """The datagen engines on the same prompts, greedy: tokens/s (median over interleaved repeats), the vLLM / HF
    ratio, identical completions and the top-k log-prob difference; prints and returns the JSON."""
    from draftsmith.train import datagen_vllm

    cfg = DatagenConfig(target=target, prompts="-", out_dir="-", max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, top_k_logprobs=args.top_k_logprobs,
                        vllm={"python": args.vllm_python, "kvcache_gib": 2}, dtype=args.vllm_dtype)
    eos = pretrained_eos_ids(target, tokenizer)
    rates = {name: [] for name in args.engine}
    configs = {name: dataclasses.replace(cfg, hidden_states="eagle3" if name == "vllm-states" else "none")
               for name in args.engine}
    outputs, servers, start_s, kept = {}, {}, {}, []
    with contextlib.ExitStack() as stack:
        for name in args.engine:
            if name == "hf":
                continue
            started = time.perf_counter()
            log = Path(tempfile.mkdtemp(prefix="bench-datagen-")) / "vllm_server.log"
            servers[name] = stack.enter_context(datagen_vllm.engine(configs[name], log,
                                                                    log=lambda m: print(m, file=sys.stderr)))
            workdir = (servers[name].info.get("hidden_states") or {}).get("workdir")
            if workdir:  # the folder vLLM writes the states into (datagen's run removes its own; this is the bench's)
                stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            warm = datagen_vllm.generate_all(servers[name].url, servers[name].model, prompts[:2], configs[name], eos,
                                             f"{name} warm-up")
            kept_files(warm)
            start_s[name] = time.perf_counter() - started
        for rep in range(args.repeats):
            for name in args.engine if rep % 2 == 0 else args.engine[::-1]:
                start = time.perf_counter()
                if name == "hf":
                    rows = generate_all(model, tokenizer, prompts, cfg, f"hf (repeat {rep + 1})")
                else:
                    rows = datagen_vllm.generate_all(servers[name].url, servers[name].model, prompts, configs[name],
                                                     eos, f"{name} (repeat {rep + 1})")
                seconds = time.perf_counter() - start
                rates[name].append(sum(len(r["completion_ids"]) for r in rows) / seconds)
                if name == "vllm-states":
                    kept.append(kept_files(rows))
                outputs[name] = rows
    tps = {k: statistics.median(v) for k, v in rates.items()}
    report = {"target": target, "params": model.num_parameters(), "settings": vars(args),
              "threads": torch.get_num_threads(), "tokens_per_s": tps, "tokens_per_s_all_repeats": rates}
    for name, server in servers.items():
        report[name] = {**server.info, "start_and_warmup_s": start_s[name]}
    if "vllm-states" in servers:
        report["states_files_per_repeat"] = kept
    if {"vllm", "vllm-states"} <= set(args.engine):
        same = [a["completion_ids"] == b["completion_ids"] for a, b in zip(outputs["vllm"], outputs["vllm-states"])]
        report["vllm-states_vs_vllm"] = tps["vllm-states"] / tps["vllm"]
        report["identical_completions_with_states"] = f"{sum(same)}/{len(prompts)}"
    if set(args.engine) == {"hf", "vllm"}:
        hf, vl = outputs["hf"], outputs["vllm"]
        same = [a["completion_ids"] == b["completion_ids"] for a, b in zip(hf, vl)]
        report["vllm_vs_hf"] = tps["vllm"] / tps["hf"]
        report["identical_completions"] = f"{sum(same)}/{len(prompts)}"
        report["greedy_completions_equal"] = all(same)
        if args.top_k_logprobs:
            report["topk_logprobs_max_abs_diff"] = max(
                (abs(x - y) for a, b, eq in zip(hf, vl, same) if eq
                 for xs, ys in zip(a["topk_logprobs"], b["topk_logprobs"]) for x, y in zip(xs, ys)), default=None)
            report["topk_ids_equal_positions"] = topk_ids_agreement(hf, vl, same)
    print(json.dumps(report, indent=2))
    return report


def kept_files(rows: list[dict]) -> int:
    """How many of `rows` came with a states file (vllm-states), each deleted once written."""
    from draftsmith.train.target_states import wait_written

    n = 0
    for row in rows:
        path = row.get("hidden_states_path")
        if path is not None:
            wait_written(path)
            n += os.path.exists(path)
            for leftover in (path, path + ".lock"):
                Path(leftover).unlink(missing_ok=True)
    return n


def compare_scoring(args, target, tokenizer, model, prompts) -> dict:
    """Generating greedy responses vs scoring the same responses (HF engine): tokens/s of each (median over repeats,
    the order alternating), the scored / generated ratio, and how the scored top-k agree with those recorded while
    generating; prints and returns the JSON."""
    cfg = DatagenConfig(target=target, prompts="-", out_dir="-", max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, top_k_logprobs=max(1, args.top_k_logprobs))
    rates = {"generate": [], "score": []}
    generated = scored = None
    for rep in range(args.repeats):
        for name in ["generate", "score"] if rep % 2 == 0 else ["score", "generate"]:  # repeat 0 generates first
            start = time.perf_counter()
            if name == "generate":
                generated = generate_all(model, tokenizer, prompts, cfg, f"generate (repeat {rep + 1})")
                rows = generated
            else:
                rows, _ = score_all(model, tokenizer, prompts, [r["completion_ids"] for r in generated], cfg,
                                    f"score (repeat {rep + 1})")
                scored = rows
            rates[name].append(sum(len(r["completion_ids"]) for r in rows) / (time.perf_counter() - start))
    tps = {k: statistics.median(v) for k, v in rates.items()}
    pairs = [(x, y) for a, b in zip(generated, scored) for x, y in zip(a["topk_logprobs"], b["topk_logprobs"])]
    report = {"target": target, "params": model.num_parameters(), "settings": vars(args),
              "threads": torch.get_num_threads(), "tokens_per_s": tps, "tokens_per_s_all_repeats": rates,
              "score_vs_generate": tps["score"] / tps["generate"],
              "completion_tokens": sum(len(r["completion_ids"]) for r in generated),
              "topk_logprobs_max_abs_diff": max((abs(u - v) for x, y in pairs for u, v in zip(x, y)), default=None),
              "topk_ids_equal_positions": topk_ids_agreement(generated, scored, [True] * len(generated)),
              "topk_ids_equal": all(a["topk_ids"] == b["topk_ids"] for a, b in zip(generated, scored))}
    print(json.dumps(report, indent=2))
    return report


def topk_ids_agreement(hf: list[dict], vl: list[dict], same: list[bool]) -> str:
    """'equal/compared' completion positions whose top-k ids agree in order (ties within float noise may swap)."""
    pairs = [(x, y) for a, b, eq in zip(hf, vl, same) if eq for x, y in zip(a["topk_ids"], b["topk_ids"])]
    return f"{sum(x == y for x, y in pairs)}/{len(pairs)}"


if __name__ == "__main__":
    main()
