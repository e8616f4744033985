"""Reading domain prompts from a JSONL file, a Parquet file, a folder of text files or a HF dataset.

Every source gives a list of prompt strings; :func:`prepare_prompts` then tokenizes, filters by
length, de-duplicates and splits off a held-out set that training never sees. The split is by a
hash of the prompt text, so a prompt lands in the same split whatever the order or the source.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.artifacts.errors import ConfigError, UserError


class PromptError(UserError, ValueError):
    """The prompt source cannot be read as configured; the message names the file and field."""


@dataclass(kw_only=True)
class PromptFormat:
    """How prompt records are read (the ``data.*`` keys of the same names).

    Attributes:
        field: the text field of JSONL / Parquet / dataset records.
        messages_field: a chat field (list of {role, content}) rendered with the tokenizer's chat
            template; used when a record has no `field`.
        split: the dataset split (HF datasets only).
        chunk_tokens: folders of text files are cut into prompts of this many tokens.
    """

    field: str = "prompt"
    messages_field: str = "messages"
    split: str = "train"
    chunk_tokens: int = 64

    def __post_init__(self):
        if self.chunk_tokens < 1:
            raise ConfigError(f"data.chunk_tokens must be >= 1, got {self.chunk_tokens}")


@dataclass
class PromptSource(PromptFormat):
    """Where prompts come from: `path` (a ``.jsonl`` / ``.parquet`` file, a folder of text files,
    or a HF dataset id) read with the :class:`PromptFormat` settings; `suffixes` are the file
    suffixes read from a folder."""

    path: str
    suffixes: tuple[str, ...] = field(default=(".txt", ".md", ".py", ".rst", ".json"), kw_only=True)


def _record_text(record: dict, src: PromptSource, tokenizer, where: str) -> str:
    if src.field in record:
        value = record[src.field]
        if not isinstance(value, str):
            raise PromptError(f"{where}: field {src.field!r} is {type(value).__name__}, expected a string")
        return value
    if src.messages_field in record:
        if not getattr(tokenizer, "chat_template", None):
            raise PromptError(f"{where}: chat field {src.messages_field!r} found but the target tokenizer has no chat "
                              f"template; give plain prompts in a {src.field!r} field instead")
        return tokenizer.apply_chat_template(record[src.messages_field], tokenize=False, add_generation_prompt=True)
    raise PromptError(f"{where}: no field {src.field!r} (or chat field {src.messages_field!r}); the record has "
                      f"fields {sorted(record)} - set the prompt field to one of them")


def _read_jsonl(path: Path, src: PromptSource, tokenizer) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise PromptError(f"{path}:{line_no}: expected a JSON object per line")
            texts.append(_record_text(record, src, tokenizer, f"{path}:{line_no}"))
    return texts


def _read_records(records: list[dict], src: PromptSource, tokenizer, where: str) -> list[str]:
    return [_record_text(r, src, tokenizer, f"{where} record {i}") for i, r in enumerate(records)]


def _read_folder(path: Path, src: PromptSource, tokenizer) -> list[str]:
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in src.suffixes)
    if not files:
        raise PromptError(f"{path}: no files with suffix {', '.join(src.suffixes)}")
    texts = []
    for file in files:
        ids = tokenizer(file.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
        for start in range(0, len(ids) - src.chunk_tokens + 1, src.chunk_tokens):
            texts.append(tokenizer.decode(ids[start : start + src.chunk_tokens]))
    return texts


def read_prompts(src: PromptSource, tokenizer) -> list[str]:
    """All prompt strings of `src`, in source order (see :class:`PromptSource`)."""
    path = Path(src.path)
    if path.is_dir():
        return _read_folder(path, src, tokenizer)
    if path.suffix == ".jsonl":
        if not path.exists():
            raise PromptError(f"prompt file {path} does not exist")
        return _read_jsonl(path, src, tokenizer)
    if path.suffix == ".parquet":
        if not path.exists():
            raise PromptError(f"prompt file {path} does not exist")
        import pyarrow.parquet as pq

        return _read_records(pq.read_table(path).to_pylist(), src, tokenizer, str(path))
    if path.exists():
        raise PromptError(f"{path}: unsupported prompt file; use .jsonl, .parquet or a folder of text files")
    import datasets

    try:
        ds = datasets.load_dataset(src.path, split=src.split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "cannot load"
        raise PromptError(f"prompts {src.path!r} is neither a local file/folder nor a loadable HF dataset "
                          f"(split {src.split!r}): {exc}") from exc
    if src.field not in ds.column_names and src.messages_field not in ds.column_names:
        raise PromptError(f"dataset {src.path!r} has no field {src.field!r}; its fields are {ds.column_names}")
    return _read_records(list(ds), src, tokenizer, src.path)


def in_heldout(text: str, fraction: float) -> bool:
    """Deterministic split: a prompt is held out when the hash of its text falls below `fraction`."""
    digest = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return digest / 2**64 < fraction


@dataclass
class PreparedPrompts:
    """Tokenized prompts per split, and what was dropped on the way."""

    train: list[list[int]] = field(default_factory=list)
    heldout: list[list[int]] = field(default_factory=list)
    counts: dict = field(default_factory=dict)


def prepare_prompts(texts: list[str], tokenizer, *, max_prompt_tokens: int, heldout_fraction: float,
                    max_prompts: int | None = None) -> PreparedPrompts:
    """Tokenize, drop empty / too long prompts and duplicates, split off the held-out set."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise PromptError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    out = PreparedPrompts()
    seen: set[str] = set()
    too_long = empty = dupes = 0
    for text in texts:
        if text in seen:
            dupes += 1
            continue
        seen.add(text)
        ids = tokenizer(text).input_ids
        if not text.strip() or not ids:
            empty += 1
            continue
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        (out.heldout if in_heldout(text, heldout_fraction) else out.train).append(ids)
        if max_prompts is not None and len(out.train) + len(out.heldout) >= max_prompts:
            break
    out.counts = {"read": len(texts), "duplicates": dupes, "empty": empty, "too_long": too_long,
                  "train": len(out.train), "heldout": len(out.heldout)}
    return out
