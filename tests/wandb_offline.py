"""Reading what an offline W&B run logged, from its ``run-*.wandb`` file (tests only).

The file is a LevelDB-style log: a 7-byte header (":W&B", 2 magic bytes, version), then 32 KiB
blocks of records, each with a 7-byte header (crc32, little-endian length, type: 1 full, 2 first,
3 middle, 4 last) and a protobuf ``Record`` payload.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024


def _payloads(data: bytes):
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding: the rest of this block is empty
            pos += room
            continue
        if pos + 7 + length > len(data):  # a record still being written
            return
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def _records(run_dir: str | Path, timeout: float = 60.0) -> list:
    """The parsed ``Record`` protos of an offline run, once its ``exit`` record is on disk.

    ``run.finish()`` can return while the wandb service is still writing the file (seen once in
    CI: a promote run read back without its ``run`` record, complete a moment later), so wait
    for the last record, up to `timeout` seconds, instead of reading a half-written file.
    """
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout
    while True:
        records = []
        for payload in _payloads(next(Path(run_dir).glob("run-*.wandb")).read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def history(run_dir: str | Path) -> list[dict]:
    """The history rows (key -> value) an offline run logged, in order."""
    rows = []
    for record in _records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_info(run_dir: str | Path) -> dict:
    """The job_type, group and config keys of an offline run (from its first ``run`` record)."""
    for record in _records(run_dir):
        if record.WhichOneof("record_type") == "run":
            return {"job_type": record.run.job_type, "group": record.run.run_group,
                    "config_keys": sorted(item.key for item in record.run.config.update)}
    raise ValueError(f"{run_dir} has no run record")


def record_types(run_dir: str | Path) -> set[str]:
    """The kinds of records an offline run wrote (history, run, artifact, ...)."""
    kinds = set()
    for record in _records(run_dir):
        kinds.add(record.WhichOneof("record_type"))
    return kinds
