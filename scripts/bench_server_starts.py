"""How long vLLM servers take to start, alone and several at once (what serve.k_at_once trades on).

    python scripts/bench_server_starts.py --target DIR --draft DIR [--trials 2] [--logs DIR]

Per trial, in turn: one spec server (draft_model, K=2) alone; a plain and a spec server started together; a
plain and two spec servers (K=2, K=4) started together — each group from its first start to the last /health,
then stopped. Uses serve.python / $DRAFTSMITH_VLLM_PYTHON / ./.venv-vllm like the serve stage (the demo's
settings: float32, 2 GiB KV cache, eager). Prints JSON: seconds per group and trial, and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from draftsmith.eval.settings import ServingSettings
from draftsmith.serve.server import VllmServer, started_together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--logs", default=None, help="where the servers' logs go (default: a temporary folder)")
    args = parser.parse_args()
    logs = args.logs or tempfile.mkdtemp(prefix="server-starts-")
    settings = ServingSettings(engine="vllm")

    def server(name: str, k: int | None = None) -> VllmServer:
        spec = settings.spec(args.target, device="cpu", dtype="float32", draft=args.draft if k else None, k=k)
        return VllmServer(spec, log_path=f"{logs}/{name}.log", startup_timeout_s=settings.startup_timeout_s)

    groups = {"spec alone": lambda: [server("spec", 2)],
              "plain + spec": lambda: [server("plain2"), server("spec2", 2)],
              "plain + two spec": lambda: [server("plain3"), server("spec3-k2", 2), server("spec3-k4", 4)]}
    seconds: dict[str, list[float]] = {name: [] for name in groups}
    for _ in range(args.trials):
        for name, make in groups.items():
            start = time.monotonic()
            with started_together(*make()):
                seconds[name].append(round(time.monotonic() - start, 1))
    print(json.dumps({"seconds": seconds, "median_s": {n: statistics.median(v) for n, v in seconds.items()},
                      "logs": logs}, indent=1))


if __name__ == "__main__":
    main()
