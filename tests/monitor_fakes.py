"""Helpers for the monitor tests: vLLM-style /metrics texts, a scripted /metrics endpoint, a registry entry."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from draftsmith.registry import LocalRegistry

# A /metrics text as vLLM 0.32 writes it (prometheus_client exposition: HELP/TYPE, *_created samples,
# labels engine and model_name, per-position counters), with other vLLM metrics around the spec ones.
RECORDED = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/target"} 3.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/models/target"} 200.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="/models/target"} 1.7565e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/models/target"} 600.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/models/target"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/target",position="0"} 130.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/target",position="1"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/target",position="2"} 70.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="/models/target"} 1234.0
"""

PLAIN = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/target"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="/models/target"} 99.0
"""

NOT_VLLM = """\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def metrics_text(engines: dict[str, tuple[float, float, float, list[float]]], model: str = "/models/target") -> str:
    """vLLM-style /metrics with spec counters per engine: {engine: (drafts, draft_tokens, accepted, per_pos)}."""
    lines = ["# HELP vllm:num_requests_running x", "# TYPE vllm:num_requests_running gauge",
             f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 1.0']
    for index, name in enumerate(("num_drafts", "num_draft_tokens", "num_accepted_tokens")):
        full = f"vllm:spec_decode_{name}_total"
        lines += [f"# HELP {full} x", f"# TYPE {full} counter"]
        lines += [f'{full}{{engine="{e}",model_name="{model}"}} {float(v[index])}' for e, v in engines.items()]
    full = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"# HELP {full} x", f"# TYPE {full} counter"]
    lines += [f'{full}{{engine="{e}",model_name="{model}",position="{i}"}} {float(a)}'
              for e, v in engines.items() for i, a in enumerate(v[3])]
    return "\n".join(lines) + "\n"


class ScriptedMetrics:
    """A /metrics endpoint in a thread serving `texts` in order, one per GET (then the last one again);
    a None entry answers 503 (a server restarting). ``with ScriptedMetrics([...]) as m: m.url``."""

    def __init__(self, texts: list[Optional[str]]):
        self.texts, self.gets = list(texts), 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next(self) -> Optional[str]:
        with self.lock:
            text = self.texts[min(self.gets, len(self.texts) - 1)]
            self.gets += 1
            return text

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                text = fake._next() if self.path == "/metrics" else None
                code = 404 if self.path != "/metrics" else (503 if text is None else 200)
                data = (text or "").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def make_registry(root: Path, name: str = "demo", *, serving: bool = True, summary_rate: float | None = 0.75,
                  cells: list[dict] | None = None, bands: list[dict] | None = None) -> LocalRegistry:
    """A registry with one production version of `name`: promoted on a serving A/B at concurrency 4 with K=2
    (its serving.json holds `cells`; `bands` its k_by_concurrency, default K=2 everywhere: a one-range schedule,
    [[1, 1, 2]]), or on the batch-1 eval (`serving` False: a static K)."""
    draft = root.parent / f"{name}-draft"
    draft.mkdir(parents=True, exist_ok=True)
    (draft / "config.json").write_text('{"model_type": "llama"}')
    summary = {"best_k": 2, "speedup": 1.4, "acceptance_rate": summary_rate, "greedy_match": 1.0}
    stored = None
    if serving:
        summary.update(acceptance_source="vLLM at K=2, concurrency 4", serving={"draft": "trained", "concurrency": 4})
        stored = {"table": {"cells": cells or []}, "concurrency": 4, "k_by_concurrency": bands or [{"from": 1, "k": 2}]}
    registry = LocalRegistry(root)
    registry.register(name, draft, metrics={}, promotion={"candidate": summary}, k=2, serving=stored,
                      source={"config": {"pair": {"target": "/models/target", "dtype": "bfloat16", "device": "cuda"},
                                         "demo": {"preset": "default"}}})
    return registry
