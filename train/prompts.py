"""Reading domain prompts from a JSONL file, a Parquet file, a folder of text files or a HF dataset.

Every source gives a list of prompt records (:class:`PromptRecord`: the prompt string, and the response the
record carries, if any); :func:`prepare_prompts` then tokenizes, filters by length, de-duplicates and splits
off a held-out set that training never sees. The split is by a hash of the prompt text, so a prompt lands in
the same split whatever the order, the source, or whether its completion is generated or given.

A record carries a response (which ``data.responses=given|auto`` has the target score instead of writing
one) when
- it is a chat record whose last turn is the assistant's: the prompt is the conversation before that turn,
  rendered with the chat template and its generation prompt; the response is what the whole conversation's
  rendering has after it, as token ids (:func:`chat_response`: the template must split there);
- or it has a ``completion`` string beside its prompt field: the response is its tokens, no special tokens
  added (an EOS token in it ends the completion as a generated one would).
Under ``data.responses=generate`` no response is read, but a chat record's final assistant turn is still left
out of its prompt: the target writes its own answer to the same conversation instead of continuing after the
given one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from draftsmith.artifacts.errors import ConfigError, UserError

COMPLETION_FIELD = "completion"  # a record's given response beside its prompt field


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


@dataclass
class PromptRecord:
    """One record as read: the prompt string the target reads, and the token ids of the response the record
    carries (None: it carries none, or responses were not asked for; then the target generates)."""

    text: str
    response: Optional[list[int]] = None


def _string(record: dict, key: str, where: str) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise PromptError(f"{where}: field {key!r} is {type(value).__name__}, expected a string")
    return value


def chat_response(prompt: str, messages: list[dict], tokenizer, where: str) -> list[int]:
    """The response token ids of a conversation `messages` that ends with the assistant's turn: what its whole
    rendering has after `prompt` (the turns before, rendered with the generation prompt), both tokenized as the
    prompt is. The prompt's ids must be a prefix of the whole's, else the template renders the last turn in a
    way the target never sees when it answers, and the split would be a guess."""
    whole = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False)).input_ids
    head = tokenizer(prompt).input_ids
    if whole[: len(head)] != head:
        raise PromptError(f"{where}: the chat template does not split at the assistant turn: the conversation "
                          "before it, with the generation prompt, does not tokenize to a prefix of the whole "
                          "conversation (the template renders the last turn differently); give the record as "
                          f"{{'prompt': ..., {COMPLETION_FIELD!r}: ...}} instead")
    return whole[len(head):]


def _chat(messages, src: PromptSource, tokenizer, where: str, want_response: bool) -> PromptRecord:
    """A chat record: the prompt without a final assistant turn, and that turn's tokens when `want_response`."""
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(f"{where}: chat field {src.messages_field!r} found but the target tokenizer has no chat "
                          f"template; give plain prompts in a {src.field!r} field instead")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise PromptError(f"{where}: chat field {src.messages_field!r} must be a non-empty list of "
                          "{role, content} objects")
    answered = messages[-1].get("role") == "assistant"
    turns = messages[:-1] if answered else messages
    if not turns:
        raise PromptError(f"{where}: the conversation is only an assistant turn; there is no prompt to answer")
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    response = chat_response(text, messages, tokenizer, where) if answered and want_response else None
    return PromptRecord(text, response)


def _record(record: dict, src: PromptSource, tokenizer, where: str, responses: str) -> PromptRecord:
    """One record under ``data.responses=responses`` (generate: no response is read)."""
    if src.field in record:
        read = PromptRecord(_string(record, src.field, where))
        if responses != "generate" and record.get(COMPLETION_FIELD) is not None:  # null: a Parquet row without one
            completion = _string(record, COMPLETION_FIELD, where)
            read.response = tokenizer(completion, add_special_tokens=False).input_ids
    elif src.messages_field in record:
        read = _chat(record[src.messages_field], src, tokenizer, where, responses != "generate")
    else:
        raise PromptError(f"{where}: no field {src.field!r} (or chat field {src.messages_field!r}); the record has "
                          f"fields {sorted(record)} - set the prompt field to one of them")
    if read.response is None and responses == "given":
        raise PromptError(f"{where}: the record carries no response (data.responses=given reads a chat record whose "
                          f"last turn is the assistant's, or a {COMPLETION_FIELD!r} field beside {src.field!r}); use "
                          "data.responses=auto to generate for such records")
    if read.response is not None and not read.response:
        raise PromptError(f"{where}: the record's response is empty (no tokens); give one, or drop it and use "
                          "data.responses=auto to generate for the record")
    return read


def _read_jsonl(path: Path, src: PromptSource, tokenizer, responses: str) -> list[PromptRecord]:
    records = []
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
            records.append(_record(record, src, tokenizer, f"{path}:{line_no}", responses))
    if not records:
        raise PromptError(f"prompt file {path} has no records: write one JSON object per line "
                          f"({{{src.field!r}: ...}} or {{{src.messages_field!r}: [...]}})")
    return records


def _read_records(records: list[dict], src: PromptSource, tokenizer, where: str, responses: str) -> list[PromptRecord]:
    return [_record(r, src, tokenizer, f"{where} record {i}", responses) for i, r in enumerate(records)]


def _read_folder(path: Path, src: PromptSource, tokenizer, responses: str) -> list[PromptRecord]:
    if responses == "given":
        raise PromptError(f"{path}: a folder of text files carries no responses, and data.responses=given scores "
                          "given ones; use a .jsonl / .parquet file of records with responses, or "
                          "data.responses=generate")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in src.suffixes)
    if not files:
        raise PromptError(f"{path}: no files with suffix {', '.join(src.suffixes)}")
    texts = []
    for file in files:
        ids = tokenizer(file.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False).input_ids
        for start in range(0, len(ids) - src.chunk_tokens + 1, src.chunk_tokens):
            texts.append(PromptRecord(tokenizer.decode(ids[start : start + src.chunk_tokens])))
    return texts


def read_records(src: PromptSource, tokenizer, responses: str = "generate") -> list[PromptRecord]:
    """All records of `src`, in source order, read for ``data.responses=responses``: ``generate`` reads no
    response; ``given`` reads every record's (a record without one is a :class:`PromptError` naming it);
    ``auto`` reads those there are."""
    path = Path(src.path)
    if path.is_dir():
        return _read_folder(path, src, tokenizer, responses)
    if path.suffix == ".jsonl":
        if not path.exists():
            raise PromptError(f"prompt file {path} does not exist")
        return _read_jsonl(path, src, tokenizer, responses)
    if path.suffix == ".parquet":
        if not path.exists():
            raise PromptError(f"prompt file {path} does not exist")
        import pyarrow.parquet as pq

        return _read_records(pq.read_table(path).to_pylist(), src, tokenizer, str(path), responses)
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
    return _read_records(list(ds), src, tokenizer, src.path, responses)


def read_prompts(src: PromptSource, tokenizer) -> list[str]:
    """All prompt strings of `src`, in source order (see :class:`PromptSource`; a chat record's final assistant
    turn is left out, as under ``data.responses=generate``)."""
    return [record.text for record in read_records(src, tokenizer)]


def in_heldout(text: str, fraction: float) -> bool:
    """Deterministic split: a prompt is held out when the hash of its text falls below `fraction`."""
    digest = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return digest / 2**64 < fraction


@dataclass
class PreparedPrompts:
    """Tokenized prompts per split, each prompt's given response (None: to generate), and what was dropped."""

    train: list[list[int]] = field(default_factory=list)
    heldout: list[list[int]] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    responses: dict[str, list[Optional[list[int]]]] = field(default_factory=lambda: {"train": [], "heldout": []})


def prepare_prompts(texts: list[str | PromptRecord], tokenizer, *, max_prompt_tokens: int, heldout_fraction: float,
                    max_prompts: int | None = None) -> PreparedPrompts:
    """Tokenize, drop empty / too long prompts and duplicates (the same prompt text with the same response, or
    without one: several given answers to one question are several rows), split off the held-out set by the
    prompt's text (a question's answers stay in one split); ``responses[split][i]`` is the response of
    ``split``'s prompt i."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise PromptError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    out = PreparedPrompts()
    seen: set[tuple] = set()
    too_long = empty = dupes = 0
    for item in texts:
        record = item if isinstance(item, PromptRecord) else PromptRecord(item)
        text = record.text
        key = (text, None if record.response is None else tuple(record.response))
        if key in seen:
            dupes += 1
            continue
        seen.add(key)
        ids = tokenizer(text).input_ids
        if not text.strip() or not ids:
            empty += 1
            continue
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        split = "heldout" if in_heldout(text, heldout_fraction) else "train"
        getattr(out, split).append(ids)
        out.responses[split].append(record.response)
        if max_prompts is not None and len(out.train) + len(out.heldout) >= max_prompts:
            break
    out.counts = {"read": len(texts), "duplicates": dupes, "empty": empty, "too_long": too_long,
                  "train": len(out.train), "heldout": len(out.heldout)}
    return out
