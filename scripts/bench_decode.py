"""Benchmark the decode engine: plain decoding vs draftsmith's speculative loop vs HF assisted generation.

Prints one JSON document. For each K: tokens/s of the engines on the same prompts (runs
interleaved prompt by prompt, engine order rotated each repeat, medians over repeats): plain
decoding and draftsmith's speculative loop with the chosen forward backend (--backend, default
auto: the lean forward of decode/lean.py where it covers the models), HF assisted generation, and
-- unless the backend already is hf -- plain and speculative decoding on the models' own HF
forward too, so that the gain splits into the loop's and the forward's; whether all outputs are
identical (greedy), acceptance (the acceptance rate, accepted / drafted, and the token acceptance
alpha, accepted / tested: the alpha of the formula below), tau, per-position acceptance, the measured
cost ratios c and c_v (see decode/timing.py; timed at the mean context length of the decode),
the predicted speedup (1 - alpha^(K+1)) / ((1 - alpha)(K c + c_v)), and loop efficiency =
measured / predicted speedup of the decode phase (the prefill, the same for both engines, is
outside the cost model; the wall-time ratio is reported too), also against the prediction that
uses the measured tokens per target step instead of alpha.

    python scripts/bench_decode.py                      # the demo pair (built and cached on first use)
    python scripts/bench_decode.py --target DIR --draft DIR --k 2 4 6 --prompts 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from draftsmith.decode import autoregressive_generate, load_pair, speculative_generate  # noqa: E402
from draftsmith.decode.cache import CachedModel  # noqa: E402
from draftsmith.decode.lean import LeanModel  # noqa: E402
from draftsmith.decode.timing import cost_ratios, mid_decode_context  # noqa: E402
from draftsmith.eval.metrics import acceptance_summary  # noqa: E402
from draftsmith.eval.runner import hf_assisted_generate  # noqa: E402
from draftsmith.eval.theory import predicted_speedup  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target model dir or hub id (default: the demo pair)")
    ap.add_argument("--draft", help="draft model dir or hub id (default: the demo pair)")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 6], help="draft lengths to measure")
    ap.add_argument("--prompts", type=int, default=8, help="number of prompts")
    ap.add_argument("--prompts-file", help="JSONL file with a 'prompt' field (default: standard-library code)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="tokens per prompt (standard-library prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts per K")
    ap.add_argument("--no-hf", action="store_true", help="skip HF assisted generation")
    ap.add_argument("--backend", default="auto", choices=["auto", "lean", "hf"],
                    help="cached forward of draftsmith's loops (decode/runners.py)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        ap.error("give both --target and --draft, or neither for the demo pair")
    if any(k < 1 for k in args.k):
        ap.error(f"--k values must be >= 1, got {args.k}")
    return args


def get_prompts(args, tokenizer) -> list[torch.Tensor]:
    """Prompts from --prompts-file (JSONL, field "prompt"), else cut from the standard library source."""
    if args.prompts_file is None:
        from draftsmith.demo import demo_prompts

        return demo_prompts(tokenizer, args.prompts, args.prompt_tokens, seed=args.seed)
    prompts = []
    with open(args.prompts_file, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "prompt" not in record:
                sys.exit(f"{args.prompts_file}:{line_no}: no 'prompt' field (fields: {sorted(record)})")
            prompts.append(tokenizer(record["prompt"], return_tensors="pt").input_ids)
            if len(prompts) == args.prompts:
                break
    if not prompts:
        sys.exit(f"{args.prompts_file}: no prompts found")
    return prompts


def run_engine(engine: str, pair, prompt: torch.Tensor, k: int, max_new: int, eos, backend: str):
    """One greedy generation; returns (sequence [1, L], seconds, stats or None).

    Engines: "autoregressive" / "speculative" (draftsmith's loops on `backend`), the same two with
    an "_hf" suffix (on the models' own forward), "hf_assisted" (transformers' assisted generation).
    """
    start = time.perf_counter()
    if engine.endswith("_hf"):
        engine, backend = engine[: -len("_hf")], "hf"
    if engine == "autoregressive":
        out = autoregressive_generate(pair.target, prompt, max_new_tokens=max_new, eos_token_id=eos, backend=backend)
        seq, stats = out.sequences, out.stats
    elif engine == "speculative":
        out = speculative_generate(pair.target, pair.draft, prompt, k=k, max_new_tokens=max_new, eos_token_id=eos,
                                   backend=backend)
        seq, stats = out.sequences, out.stats
    else:  # HF assisted generation, constant K, no early stop on draft confidence
        seq, _ = hf_assisted_generate(pair.target, pair.draft, prompt, k, max_new, eos, pair.tokenizer.pad_token_id)
        stats = None
    if prompt.device.type == "cuda":
        torch.cuda.synchronize()
    return seq, time.perf_counter() - start, stats


class ForwardClock:
    """Sums the wall time spent inside model forwards of the decode loops (CPU: no sync needed)."""

    RUNNERS = (CachedModel, LeanModel)

    def __init__(self):
        self.seconds = 0.0
        self._orig = {cls: cls.forward for cls in self.RUNNERS}

    def __enter__(self):
        clock = self

        def timing(orig):
            def timed(runner, input_ids, keep):
                start = time.perf_counter()
                out = orig(runner, input_ids, keep)
                clock.seconds += time.perf_counter() - start
                return out
            return timed

        for cls, orig in self._orig.items():
            cls.forward = timing(orig)
        return self

    def __exit__(self, *exc):
        for cls, orig in self._orig.items():
            cls.forward = orig


def bench_k(pair, prompts, k: int, args, eos, engines: list[str]) -> dict:
    """All engines on all prompts for one K, interleaved; medians over repeats.

    The cost ratios are measured inside the same block (once per repeat, medians), so that the
    prediction and the measured speedup see the same machine state.
    """
    for engine in engines:  # warm-up
        run_engine(engine, pair, prompts[0], k, 8, eos, args.backend)
    rates = {e: [] for e in engines}
    decode_ratios = []  # per repeat: plain decode-phase seconds / speculative decode-phase seconds
    costs = []
    spec_seconds, spec_forward_seconds = 0.0, 0.0
    equal = {e: True for e in engines if e != "autoregressive"}
    spec_stats = []
    for rep in range(args.repeats):
        order = engines[rep % len(engines):] + engines[: rep % len(engines)]
        seconds = {e: 0.0 for e in engines}
        tokens = {e: 0 for e in engines}
        decode_s = {"autoregressive": 0.0, "speculative": 0.0}
        context = mid_decode_context(prompts[rep % len(prompts)], args.max_new_tokens)
        costs.append(cost_ratios(pair.target, pair.draft, context, [k], repeats=10, backend=args.backend))
        for prompt in prompts:
            seqs = {}
            for engine in order:
                with ForwardClock() as clock:
                    seq, sec, stats = run_engine(engine, pair, prompt, k, args.max_new_tokens, eos, args.backend)
                if engine == "speculative" and pair.target.device.type == "cpu":
                    spec_seconds, spec_forward_seconds = spec_seconds + sec, spec_forward_seconds + clock.seconds
                seqs[engine], seconds[engine] = seq, seconds[engine] + sec
                if engine in decode_s:
                    decode_s[engine] += stats.decode_s
                tokens[engine] += seq.shape[1] - prompt.shape[1]
                if engine == "speculative" and rep == 0:
                    spec_stats.append(stats)
                    backends = {"target": stats.backend, "draft": stats.draft_backend}
            for engine in equal:
                equal[engine] &= torch.equal(seqs[engine].cpu(), seqs["autoregressive"].cpu())
        for e in engines:
            rates[e].append(tokens[e] / seconds[e])
        decode_ratios.append(decode_s["autoregressive"] / decode_s["speculative"])
    tps = {e: statistics.median(v) for e, v in rates.items()}

    def ratio(a: str, b: str) -> float | None:
        return tps[a] / tps[b] if a in tps and b in tps else None

    return {
        "k": k,
        "backend": backends,
        "c": statistics.median(c["c"][k] for c in costs),
        "c_v": statistics.median(c["c_v"][k] for c in costs),
        "c_isolated": statistics.median(c["c_isolated"] for c in costs),
        "target_step_ms": statistics.median(c["target_step_s"] for c in costs) * 1e3,
        "draft_step_ms_in_round": statistics.median(c["draft_step_in_round_s"][k] for c in costs) * 1e3,
        "verify_ms": statistics.median(c["verify_s"][k] for c in costs) * 1e3,
        # share of the speculative wall time spent inside model forwards (CPU only): 1 - loop overhead
        "forward_share": spec_forward_seconds / spec_seconds if spec_seconds else None,
        "tokens_per_s": tps,
        "tokens_per_s_all_repeats": rates,
        "outputs_equal_to_autoregressive": equal,
        "speedup_vs_autoregressive": ratio("speculative", "autoregressive"),
        # the same, after the prefill (which both engines pay alike and the cost model leaves out)
        "decode_speedup_vs_autoregressive": statistics.median(decode_ratios),
        "speculative_vs_hf_assisted": ratio("speculative", "hf_assisted"),
        "hf_assisted_vs_autoregressive": ratio("hf_assisted", "autoregressive"),
        # the split: the same loop on the HF forward vs HF assisted (the loop's share of the gain),
        # and plain decoding on the chosen backend vs on the HF forward (the forward's share)
        "speculative_hf_forward_vs_hf_assisted": ratio("speculative_hf", "hf_assisted"),
        "speedup_vs_autoregressive_hf_forward": ratio("speculative_hf", "autoregressive_hf"),
        "autoregressive_vs_autoregressive_hf_forward": ratio("autoregressive", "autoregressive_hf"),
        **acceptance_summary(k, spec_stats),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.target is None:
        from draftsmith.demo import build_demo_draft, build_demo_target

        target_path = build_demo_target(log=lambda m: print(m, file=sys.stderr))
        draft_path = build_demo_draft(target_path, log=lambda m: print(m, file=sys.stderr))
    else:
        target_path, draft_path = args.target, args.draft
    pair = load_pair(target_path, draft_path, dtype=args.dtype, device=args.device)
    prompts = [p.to(args.device) for p in get_prompts(args, pair.tokenizer)]
    eos = pair.eos_token_id
    engines = ["autoregressive", "speculative"] + ([] if args.no_hf else ["hf_assisted"])
    if args.backend != "hf":
        engines += ["autoregressive_hf", "speculative_hf"]

    results = []
    for k in args.k:
        row = bench_k(pair, prompts, k, args, eos, engines)
        c, c_v = row["c"], row["c_v"]
        # loop efficiency compares the decode phase (after the prefill) with the cost model, which
        # models the decode phase only; the wall-time version includes the shared prefill
        row["predicted_speedup"] = predicted_speedup(row["token_acceptance"], k, c, c_v)
        row["loop_efficiency"] = row["decode_speedup_vs_autoregressive"] / row["predicted_speedup"]
        row["loop_efficiency_wall"] = row["speedup_vs_autoregressive"] / row["predicted_speedup"]
        # the same cost model with the measured tau instead of the i.i.d.-alpha estimate of it:
        # isolates the loop's own overhead from how acceptance is spread over positions
        row["predicted_speedup_from_tau"] = row["mean_accepted_tokens"] / (k * c + c_v)
        row["loop_efficiency_tau"] = row["decode_speedup_vs_autoregressive"] / row["predicted_speedup_from_tau"]
        results.append(row)
        print(f"k={k}: spec {row['tokens_per_s']['speculative']:.1f} tok/s, "
              f"ar {row['tokens_per_s']['autoregressive']:.1f}, acceptance rate {row['acceptance_rate']:.3f}, "
              f"token acceptance {row['token_acceptance']:.3f}", file=sys.stderr)
    report = {
        "target": str(target_path), "draft": str(draft_path),
        "params": {"target": pair.target.num_parameters(), "draft": pair.draft.num_parameters()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("target", "draft")},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "device": args.device},
        "results": results,
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
