"""Benchmark vLLM's plain server with ``--enforce-eager`` (draftsmith's default on the CPU: serve.enforce_eager)
against vLLM's compiled mode (torch.compile; the CPU build's own default): start-up seconds and output tokens/s at
concurrency 1 and 8 on held-out prompts of a datagen output, one server at a time (eager, compiled, compiled again:
the second compiled start finds vLLM's compile cache). Prints JSON, and whether the greedy outputs of the first pass
at concurrency 1 are equal.

    python scripts/bench_vllm_compile.py --target TARGET_DIR --data OUT/datagen   # vLLM from .venv-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target's folder")
    ap.add_argument("--data", required=True, help="a datagen output folder (OUT/datagen): its held-out prompts")
    ap.add_argument("--vllm-python", default=os.environ.get("DRAFTSMITH_VLLM_PYTHON", ".venv-vllm/bin/python"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--logs", default=".", help="where the servers' logs go")
    args = ap.parse_args()

    from draftsmith.artifacts.formats import read_datagen
    from draftsmith.eval.load import run_load
    from draftsmith.serve.client import served_model
    from draftsmith.serve.server import ServerSpec, VllmServer

    held = read_datagen(args.data)[0]["heldout"]
    prompts = [list(p) for p in held["prompt_ids"][:16]]
    out, first_ids = {}, {}
    for tag, eager in (("eager", True), ("compiled", False), ("compiled_again", False)):
        spec = ServerSpec(model=args.target, python=args.vllm_python, enforce_eager=eager)
        start = time.perf_counter()
        with VllmServer(spec, log_path=Path(args.logs) / f"bench-vllm-{tag}.log") as srv:
            row = {"start_s": time.perf_counter() - start}
            model = served_model(srv.url)
            run_load(srv.url, model, prompts[:2], num_requests=2, max_tokens=args.max_tokens, concurrency=1)  # warm-up
            for c, n in ((1, 8), (8, 16)):
                rates = []
                for _ in range(args.repeats):
                    res = run_load(srv.url, model, prompts[:n], num_requests=n, max_tokens=args.max_tokens,
                                   concurrency=c)
                    rates.append(sum(r.output_tokens for r in res.requests) / res.wall_s)
                    first_ids.setdefault((tag, c), [r.token_ids for r in res.requests])
                row[f"tokens_per_s_at_{c}"] = rates
            out[tag] = row
    for c in (1, 8):
        out[f"compiled_again_over_eager_at_{c}"] = (statistics.median(out["compiled_again"][f"tokens_per_s_at_{c}"])
                                                    / statistics.median(out["eager"][f"tokens_per_s_at_{c}"]))
    out["greedy_outputs_equal"] = first_ids[("eager", 1)] == first_ids[("compiled", 1)] == first_ids[
        ("compiled_again", 1)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
