"""What a stage output is known by: the one rule for which settings change what a stage makes or measures.

Every setting counts, but those marked as saying only *where* or *how* the work runs — an interpreter,
a timeout, a cache directory — with ``field(..., metadata=WHERE)`` in their settings dataclass. The
pipeline hashes :func:`figures_of` each stage's section (so changing ``serve.startup_timeout_s``
re-runs nothing, and changing ``serve.concurrency`` re-runs serve and promote, never the batch-1
eval), and promote compares two serving A/Bs on the same rule.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

WHERE = {"role": "where"}  # field metadata: where or how the work runs; never changes a stage's figures


def is_where(f: dataclasses.Field) -> bool:
    """Whether a settings field only says where or how the work runs (marked ``metadata=WHERE``)."""
    return f.metadata.get("role") == WHERE["role"]


def figures_of(section) -> dict:
    """The settings of a config section (a dataclass) that can change what a stage makes or measures: every
    field, nested sections included, but those marked :data:`WHERE`."""
    out = {}
    for f in dataclasses.fields(section):
        if is_where(f):
            continue
        value = getattr(section, f.name)
        out[f.name] = figures_of(value) if dataclasses.is_dataclass(value) else value
    return out


def where_settings(settings_cls) -> tuple[str, ...]:
    """The names of a settings dataclass's fields marked :data:`WHERE`."""
    return tuple(f.name for f in dataclasses.fields(settings_cls) if is_where(f))


def config_hash(*parts) -> str:
    """A short stable hash of JSON-able `parts`."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stage_digest(stage: str, section: dict, inputs: dict) -> str:
    """The hash a stage's output is known by: its own config section and its inputs' hashes."""
    return config_hash(stage, section, inputs)
