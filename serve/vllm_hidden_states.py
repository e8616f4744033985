"""A KV connector that lets vLLM's CPU build write a target's hidden states: vLLM's ``ExampleHiddenStatesConnector``
with its device copy made a plain one.

vLLM (0.32) extracts a target's hidden states at the layers an EAGLE-3 head reads with the ``extract_hidden_states``
speculative method and ``ExampleHiddenStatesConnector``, which writes them to one safetensors file per request (the
path speculators' data generation takes). On the CPU build that connector stops at its write: it copies through
pinned host memory on a CUDA stream (``RuntimeError: pin_memory=True requires a CUDA or other accelerator
backend``). :class:`CpuHiddenStatesConnector` overrides that one method: on a CPU the hidden states already are in
host memory, so it gathers them from the cache and writes the file before it returns (the lock file vLLM's
``load_hidden_states`` waits on is released after the write, as the parent's writer thread does).

This file runs inside vLLM's interpreter, not draftsmith's: it imports vLLM, and only it. A caller copies it under
a folder on that interpreter's ``PYTHONPATH`` (:func:`install`) and names it in the engine's ``kv_transfer_config``::

    {"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": MODULE, "kv_role": "kv_producer",
     "kv_connector_extra_config": {"shared_storage_path": FOLDER}}
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MODULE = "draftsmith_vllm_hidden_states"  # its name inside vLLM's interpreter


def install(folder: str | Path) -> str:
    """Copy this file into `folder` as :data:`MODULE` (put `folder` on vLLM's ``PYTHONPATH``) -> the module name for
    ``kv_connector_module_path``."""
    shutil.copyfile(__file__, Path(folder) / f"{MODULE}.py")
    return MODULE


try:  # inside vLLM's interpreter; draftsmith's own imports only install()
    import fcntl

    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        ExampleHiddenStatesConnectorMetadata,
        extract_from_kv_cache,
    )
except ImportError:  # pragma: no cover - draftsmith's interpreter has no vLLM
    ExampleHiddenStatesConnector = None


class _Written:
    """What the parent polls in ``get_finished`` for a request's copy (a CUDA event there): done once written."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


if ExampleHiddenStatesConnector is not None:

    class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
        """``ExampleHiddenStatesConnector`` whose per-request write gathers the cached hidden states on the host and
        writes their file at once (no pinned memory, no CUDA stream or event)."""

        def _submit_async_write(self, pending) -> None:
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (torch.arange(self._block_size, dtype=torch.long)[None, :]
                     + block_ids[:, None] * self._block_size).flatten()
            hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device),
                                           pending.token_ids.shape[0]).to("cpu", copy=True).contiguous()
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases LOCK_EX: load_hidden_states may read the file now
            self._req_copy_events[pending.req_id] = _Written()

        def get_finished(self, finished_req_ids: set[str]):
            """Write the saves this step's metadata carries, then report as sent only the requests written. vLLM's
            own releases the lock of a request that finished before its save reached the worker (a step later), so
            a client waiting on the lock could find no file yet; here a lock is released by its write only."""
            if self.has_connector_metadata():
                metadata = self._get_connector_metadata()
                if isinstance(metadata, ExampleHiddenStatesConnectorMetadata):
                    for pending in metadata.pending_saves:
                        self._submit_async_write(pending)
            self._accumulated_finished_req_ids.update(finished_req_ids)
            done = {req_id for req_id in self._accumulated_finished_req_ids if req_id in self._req_copy_events}
            for req_id in done:
                self._req_copy_events.pop(req_id)
                self._accumulated_finished_req_ids.discard(req_id)
            return done or None, None
