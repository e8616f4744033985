"""Fakes for the serving tests: a tiny OpenAI-compatible streaming server and a fake "vLLM python".

:class:`FakeServer` answers ``/health``, ``/v1/models``, ``/metrics`` (vLLM's spec-decode counters
when it plays a speculative server) and streaming ``/v1/completions`` with scripted delays: the
first token after `ttft_s`, then `chunk` tokens per chunk every ``chunk * tpot_s`` seconds. Output
token i of a prompt is a fixed function of the prompt, so two fakes agree unless `mismatch` is set.

:func:`fake_python_main` is the body of an executable written by :func:`write_fake_python`: it
stands in for vLLM's interpreter (``-c`` prints the probe's JSON; ``-m ...api_server --port P``
serves a FakeServer) and misbehaves as ``FAKE_VLLM_MODE`` says: ``ok``, ``exit`` (fails at once),
``hang`` (never healthy, ignores SIGTERM), ``child`` (spawns a child, ignores SIGTERM, serves).
Pids go to ``$FAKE_VLLM_PIDS`` so tests can check that nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent


def output_ids(prompt: list[int], n: int, mismatch: bool = False) -> list[int]:
    """The fake model's greedy output for `prompt`: a fixed function of the prompt (shifted with `mismatch`)."""
    return [(sum(prompt) + 7 * i + (1 if mismatch and i == n // 2 else 0)) % 50 + 4 for i in range(n)]


class FakeServer:
    """An OpenAI-compatible streaming server on a free port, in a thread (``with FakeServer(...) as f: f.url``)."""

    def __init__(self, *, ttft_s=0.05, tpot_s=0.01, chunk=1, k=None, mismatch=False, port=0, token_ids=True):
        self.ttft_s, self.tpot_s, self.chunk, self.k, self.mismatch = ttft_s, tpot_s, chunk, k, mismatch
        self.token_ids = token_ids
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = self.requests = 0
        self.bodies: list[dict] = []
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * (k or 0)}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics_text(self) -> str:
        """vLLM-style /metrics: the spec counters split over two engines (engine 1 holds a third)."""
        if self.k is None:
            return "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
        c, lines = self.counters, []
        for name, value in (("num_drafts", c["drafts"]), ("num_draft_tokens", c["draft_tokens"]),
                            ("num_accepted_tokens", c["accepted"])):
            lines += [f"# HELP vllm:spec_decode_{name}_total x", f"# TYPE vllm:spec_decode_{name}_total counter"]
            lines += [f'vllm:spec_decode_{name}_total{{engine="0",model_name="fake"}} {value - value // 3}.0',
                      f'vllm:spec_decode_{name}_total{{engine="1",model_name="fake"}} {value // 3}.0']
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} x", f"# TYPE {name} counter"]
        lines += [f'{name}{{engine="0",model_name="fake",position="{i}"}} {v}.0' for i, v in enumerate(c["per_pos"])]
        return "\n".join(lines) + "\n"

    def _count(self, n_tokens: int) -> None:
        """Spec counters for one request: a draft per 2 output tokens, position i accepted with P = 0.5^(i+1)."""
        drafts = max(1, n_tokens // 2)
        with self.lock:
            self.counters["drafts"] += drafts
            self.counters["draft_tokens"] += drafts * self.k
            for i in range(self.k):
                acc = drafts >> (i + 1)
                self.counters["per_pos"][i] += acc
                self.counters["accepted"] += acc

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body: str, ctype="application/json"):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, "")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake-model"}]}))
                elif self.path == "/metrics":
                    self._send(200, fake.metrics_text(), "text/plain")
                else:
                    self._send(404, "{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    self._send(404, json.dumps({"detail": "Not Found"}))
                    return
                with fake.lock:
                    fake.bodies.append(body)
                    fake.requests += 1
                    fake.inflight += 1
                    fake.max_inflight = max(fake.max_inflight, fake.inflight)
                try:
                    self._stream(body)
                finally:
                    with fake.lock:
                        fake.inflight -= 1

            def _stream(self, body):
                ids = output_ids(body["prompt"], body["max_tokens"], fake.mismatch)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = [ids[:1]] + [ids[i:i + fake.chunk] for i in range(1, len(ids), fake.chunk)]
                for j, chunk in enumerate(chunks):
                    time.sleep(fake.ttft_s if j == 0 else fake.tpot_s * len(chunk))
                    choice = {"index": 0, "text": "".join(f" w{t}" for t in chunk)}
                    if fake.token_ids:
                        choice["token_ids"] = chunk
                    self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                    self.wfile.flush()
                if fake.k:  # counted before the stream ends, as vLLM does, so a scrape after it sees them
                    fake._count(len(ids))
                usage = {"choices": [], "usage": {"completion_tokens": len(ids)}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

        return Handler


def write_fake_python(dir_: Path) -> Path:
    """An executable standing in for vLLM's python (see the module docstring)."""
    path = Path(dir_) / "fake-python"
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(HERE)!r})\n"
                    "from serving_fakes import fake_python_main\nfake_python_main(sys.argv[1:])\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _record_pid(kind: str, pid: int) -> None:
    pids = os.environ.get("FAKE_VLLM_PIDS")
    if pids:
        Path(pids, f"{kind}-{pid}").write_text(str(pid))


def fake_python_main(argv: list[str]) -> None:
    if argv[:1] == ["-c"]:
        print(json.dumps({"version": "0.0-fake", "device": "cpu"}))
        return
    args, rest = {}, argv[2:]
    while rest:  # --key value, or a --flag alone
        key, rest = rest[0], rest[1:]
        if rest and not rest[0].startswith("--"):
            args[key], rest = rest[0], rest[1:]
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    _record_pid("server", os.getpid())
    print(f"fake vllm {mode}: {' '.join(argv)}", flush=True)
    if mode == "exit":
        print("ValueError: boom, the fake engine failed", flush=True)
        sys.exit(3)
    if mode in ("hang", "child"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "child":  # like vLLM's engine process: a child in the same process group
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        _record_pid("child", child.pid)
    if mode == "hang":
        time.sleep(600)
        return
    spec = json.loads(args["--speculative-config"]) if "--speculative-config" in args else None
    delay = float(os.environ.get("FAKE_VLLM_TPOT", "0.002"))
    server = FakeServer(ttft_s=0.01, tpot_s=delay / 2 if spec else delay, chunk=2 if spec else 1,
                        k=spec["num_speculative_tokens"] if spec else None, port=int(args["--port"]))
    server.httpd.serve_forever()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, waiting for a parent that may never reap it, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def recorded_pids(pid_dir: Path) -> dict[str, list[int]]:
    """{"server": [...], "child": [...]} from $FAKE_VLLM_PIDS."""
    out: dict[str, list[int]] = {}
    for f in Path(pid_dir).iterdir():
        kind, pid = f.name.split("-")
        out.setdefault(kind, []).append(int(pid))
    return out
