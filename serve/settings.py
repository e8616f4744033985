"""The one schema of a vLLM server's settings, nested by ``data.vllm.*`` (datagen) and ``serve.*`` (the serving A/B).

Each setting is declared once, here, with its one default, and checked once in ``__post_init__``;
the messages name the key the user types, ``<KEY>.<field>``, where ``KEY`` is the prefix of the
section that nests these settings (``data.vllm`` or ``serve``). :meth:`ServerSettings.spec` is the
one place a :class:`~draftsmith.serve.server.ServerSpec` is built from settings. Light to import (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.artifacts.errors import check
from draftsmith.artifacts.hashing import WHERE  # where or how the work runs: outside every stage hash


@dataclass(kw_only=True)
class ServerSettings:
    """How a vLLM OpenAI-compatible server is reached or started: the fields ``data.vllm.*`` and ``serve.*`` share."""

    KEY: ClassVar[str] = "serve"  # the config prefix the user types for these settings (subclasses set theirs)

    python: Optional[str] = field(default=None, metadata=WHERE)  # the interpreter that imports vllm (its own venv);
    # None = $DRAFTSMITH_VLLM_PYTHON, else ./.venv-vllm/bin/python when it exists, else this one
    url: Optional[str] = None  # a running vLLM server (e.g. on a GPU node): nothing is launched
    tensor_parallel_size: int = 1  # GPUs one copy of the target is split over (vLLM --tensor-parallel-size)
    data_parallel_size: int = 1  # copies of the target behind the one server (vLLM --data-parallel-size)
    gpu_memory_utilization: Optional[float] = None  # None: 0.3 on CPU (share of host RAM), vLLM's default on GPU
    kvcache_gib: float = 2.0  # VLLM_CPU_KVCACHE_SPACE, whole GiB (CPU backend only; vLLM reads an integer)
    enforce_eager: bool = True  # skip graph capture / compilation (fast start-up; false on a GPU for throughput)
    preload_iomp: bool = False  # CPU: LD_PRELOAD vllm-cpu's libiomp5.so, as vLLM advises for spec decode (off: no
    # clear gain on a shared 2-core CPU)
    startup_timeout_s: float = field(default=600.0, metadata=WHERE)  # wait for the server's /health
    request_timeout_s: float = field(default=600.0, metadata=WHERE)
    extra_args: list[str] = field(default_factory=list)  # more api_server arguments, e.g. ["--max-num-seqs", "512"]

    def __post_init__(self):
        key = self.KEY
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                  f"{key}.{name} must be an integer >= 1, got {value!r}")
        check(self.url is None or self.url.startswith(("http://", "https://")),
              f"{key}.url={self.url!r} is not an http(s) URL (e.g. http://gpu-node:8000)")
        check(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
              f"{key}.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        check(self.kvcache_gib >= 1 and float(self.kvcache_gib).is_integer(),
              f"{key}.kvcache_gib must be a whole number of GiB >= 1 (vLLM reads VLLM_CPU_KVCACHE_SPACE as an "
              f"integer), got {self.kvcache_gib}")
        check(self.startup_timeout_s > 0, f"{key}.startup_timeout_s must be > 0, got {self.startup_timeout_s}")
        check(self.request_timeout_s > 0, f"{key}.request_timeout_s must be > 0, got {self.request_timeout_s}")

    def spec(self, model: str, *, device: str, dtype: str = "float32", draft: Optional[str] = None,
             k: Optional[int] = None, schedule: Optional[list[list[int]]] = None, extra_args: tuple = ()):
        """The :class:`~draftsmith.serve.server.ServerSpec` of a server for `model` (with `draft` at `k`, or at the
        batch-size K `schedule` of serve/schedule.py) under these settings, on vLLM's `device`; `extra_args` come
        before ``extra_args`` of the settings."""
        from draftsmith.serve.server import ServerSpec

        parallel = []
        if self.tensor_parallel_size > 1:
            parallel += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.data_parallel_size > 1:
            parallel += ["--data-parallel-size", str(self.data_parallel_size)]
        return ServerSpec(model=str(model), draft=draft, k=k, schedule=schedule, python=self.python, dtype=dtype, device=device,
                          gpu_memory_utilization=self.gpu_memory_utilization, kvcache_gib=self.kvcache_gib,
                          enforce_eager=self.enforce_eager, preload_iomp=self.preload_iomp, settings_key=self.KEY,
                          extra_args=[*parallel, *map(str, extra_args), *map(str, self.extra_args)])
