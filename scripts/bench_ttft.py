"""Benchmark time to first token (TTFT): plain decoding vs speculative decoding (issue 11, section 4).

Prints one JSON document. On a pair of tiny random Llama models built from a config (no download,
no cache; seeded), each prompt is decoded greedily by every engine, interleaved prompt by prompt
with the engine order rotated each time, and the median TTFT per engine over all runs is reported,
with its ratio to plain's median and the median of the per-run ratios (paired, same prompt and pass):

- ``plain``: :func:`decode.autoregressive_generate` of the target (first token from its prefill);
- ``speculative``: :func:`decode.speculative_generate` as it is in this checkout;
- ``speculative_old`` (only with --compare-old): the loop of decode/loop.py at git revision
  --old-rev (default 7cffc23, before the first token came from the target's prefill), read with
  ``git show`` into a temporary file and imported by path. It runs on this checkout's decode
  package (runners, sampling, stats), so only the loop differs;
- ``draft_prefill``: the draft's own prefill (plain decoding of the draft, one new token), the
  bound that speculation's extra TTFT must stay within.

All speculative outputs are checked equal to plain greedy decoding (``outputs_equal``).

    python scripts/bench_ttft.py --compare-old
    python scripts/bench_ttft.py --compare-old --prompts 8 --repeats 5 --prompt-tokens 64 --k 4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from draftsmith.decode import autoregressive_generate, speculative_generate  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="number of random prompts")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="new tokens per call (>= k + 1: a whole first round)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round")
    ap.add_argument("--repeats", type=int, default=5, help="passes over the prompts")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--target-layers", type=int, default=6)
    ap.add_argument("--target-hidden", type=int, default=256)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--draft-hidden", type=int, default=128)
    ap.add_argument("--backend", default="auto", choices=["auto", "lean", "hf"], help="cached forward (decode/lean.py)")
    ap.add_argument("--compare-old", action="store_true", help="also time the loop of decode/loop.py at --old-rev")
    ap.add_argument("--old-rev", default="7cffc23", help="git revision of the old loop (with --compare-old)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.max_new_tokens < args.k + 1:
        ap.error(f"--max-new-tokens {args.max_new_tokens} < --k + 1 = {args.k + 1}: the old loop's first round would be cut short")
    return args


def tiny_llama(layers: int, hidden: int, vocab: int, seed: int) -> LlamaForCausalLM:
    """A seeded random Llama (like tests/conftest.py's make_model), float32, eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # clear-cut greedy choices, as in the tests
    return model.eval()


def import_old_loop(rev: str):
    """decode/loop.py at git revision `rev`, imported by path as module ``old_loop``."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:decode/loop.py"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        raise SystemExit(f"--compare-old: cannot read decode/loop.py at --old-rev {rev!r} with git ({err}); "
                         "run from a git checkout or give another --old-rev") from err
    with tempfile.TemporaryDirectory(prefix="bench-ttft-") as tmp:
        path = Path(tmp) / "old_loop.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("old_loop", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def engines(target, draft, args) -> dict:
    """name -> fn(prompt) -> GenerateOutput."""
    common = dict(max_new_tokens=args.max_new_tokens, backend=args.backend)
    out = {
        "plain": lambda p: autoregressive_generate(target, p, **common),
        "speculative": lambda p: speculative_generate(target, draft, p, k=args.k, **common),
        "draft_prefill": lambda p: autoregressive_generate(draft, p, max_new_tokens=1, backend=args.backend),
    }
    if args.compare_old:
        old = import_old_loop(args.old_rev)
        out["speculative_old"] = lambda p: old.speculative_generate(target, draft, p, k=args.k, **common)
    return out


def summary(ms: list[float]) -> dict:
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "p25_ms": q[0], "p75_ms": q[2], "runs": len(ms)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = tiny_llama(args.target_layers, args.target_hidden, args.vocab, args.seed)
    draft = tiny_llama(args.draft_layers, args.draft_hidden, args.vocab, args.seed + 1)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, args.vocab, (1, args.prompt_tokens), generator=gen) for _ in range(args.prompts)]
    runs = engines(target, draft, args)
    names = list(runs)
    for name in names:  # warm-up
        runs[name](prompts[0])
    ttft = {name: [] for name in names}
    equal = {name: True for name in names if name.startswith("speculative")}
    stats = {}
    turn = 0
    for _ in range(args.repeats):
        for prompt in prompts:
            order = names[turn % len(names):] + names[: turn % len(names)]
            turn += 1
            outs = {name: runs[name](prompt) for name in order}
            for name, out in outs.items():
                ttft[name].append(out.stats.ttft_s * 1e3)
                stats[name] = out.stats
            for name in equal:
                equal[name] &= torch.equal(outs[name].sequences, outs["plain"].sequences)
    result = {name: summary(ms) for name, ms in ttft.items()}
    plain = result["plain"]["median_ms"]
    for name in names:
        result[name]["vs_plain"] = result[name]["median_ms"] / plain
        # paired: the median over runs of this engine's TTFT / plain's TTFT on the same prompt, same pass
        result[name]["paired_vs_plain"] = statistics.median(a / b for a, b in zip(ttft[name], ttft["plain"]))
    report = {
        "settings": vars(args),
        "models": {"target_params": target.num_parameters(), "draft_params": draft.num_parameters(),
                   "backend": {"target": stats["speculative"].backend, "draft": stats["speculative"].draft_backend}},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "ttft": result,
        "outputs_equal_to_plain": equal,
        # whole-call forward counts of the last prompt (the old loop does no target prefill forward for
        # the last prompt token: that token enters its first verify; its first token needs 2 prefills + k + 1)
        "last_run_forwards": {name: {"target": s.target_forwards, "draft": s.draft_forwards, "rounds": s.rounds}
                              for name, s in stats.items() if name.startswith("speculative")},
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
