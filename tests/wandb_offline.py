"""Reading what an offline W&B run logged, from its ``run-*.wandb`` file (tests only).

The file is a LevelDB-style log: a 7-byte header (":W&B", 2 magic bytes, version), then 32 KiB
blocks of records, each with a 7-byte header (crc32, little-endian length, type: 1 full, 2 first,
3 middle, 4 last) and a protobuf ``Record`` payload.
"""

from __future__ import annotations

import json
import struct
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


def history(run_dir: str | Path) -> list[dict]:
    """The history rows (key -> value) an offline run logged, in order."""
    from wandb.proto import wandb_internal_pb2

    data = next(Path(run_dir).glob("run-*.wandb")).read_bytes()
    rows = []
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_info(run_dir: str | Path) -> dict:
    """The job_type, group and config keys of an offline run (from its first ``run`` record)."""
    from wandb.proto import wandb_internal_pb2

    data = next(Path(run_dir).glob("run-*.wandb")).read_bytes()
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "run":
            return {"job_type": record.run.job_type, "group": record.run.run_group,
                    "config_keys": sorted(item.key for item in record.run.config.update)}
    raise ValueError(f"{run_dir} has no run record")


def record_types(run_dir: str | Path) -> set[str]:
    """The kinds of records an offline run wrote (history, run, artifact, ...)."""
    from wandb.proto import wandb_internal_pb2

    data = next(Path(run_dir).glob("run-*.wandb")).read_bytes()
    kinds = set()
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kinds.add(record.WhichOneof("record_type"))
    return kinds
