"""Loading a target and a draft that can decode together, and checking they share a tokenizer.

Speculative decoding compares token ids across two models, so both must map text to ids the same
way: identical vocab mapping and identical special tokens. The embedding tables may be wider than
the tokenizer (padded vocab, as in Qwen: ``config.vocab_size`` 151936 or 152064 for ~151665
tokens); only the tokenizer's range has to agree, and the decode loop handles the width difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from draftsmith.artifacts.errors import UserError
from draftsmith.decode.eos import eos_token_id
from draftsmith.decode.gguf import is_gguf, load_gguf_model, load_gguf_tokenizer
from draftsmith.decode.runners import logit_width


class PairError(UserError, ValueError):
    """Target and draft cannot be used together; the message names both and what differs."""


@dataclass
class ModelPair:
    """A target and a draft in eval mode on one device, with their shared tokenizer."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    target_name: str
    draft_name: str

    @property
    def eos_token_id(self) -> int | list[int] | None:
        """EOS id(s) from the target's generation config, else the tokenizer's (decode/eos.py)."""
        return eos_token_id(getattr(self.target, "generation_config", None), self.tokenizer)


def _special_tokens(tok: PreTrainedTokenizerBase) -> dict[str, object]:
    """Named special tokens with their ids, plus the extra special tokens, comparable across tokenizers."""
    named = {}
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
        token = getattr(tok, attr, None)
        named[attr] = None if token is None else (str(token), tok.convert_tokens_to_ids(str(token)))
    extra = sorted((str(t), tok.convert_tokens_to_ids(str(t))) for t in tok.all_special_tokens)
    named["all_special_tokens"] = extra
    return named


def check_tokenizers(
    target_tok: PreTrainedTokenizerBase,
    draft_tok: PreTrainedTokenizerBase,
    target_name: str = "target",
    draft_name: str = "draft",
) -> None:
    """Raise :class:`PairError` naming both models and the first difference, unless the tokenizers match."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if t_vocab != d_vocab:
        only_t = sorted(set(t_vocab) - set(d_vocab))
        only_d = sorted(set(d_vocab) - set(t_vocab))
        if only_t or only_d:
            first = f"token {only_t[0]!r} only in {target_name}" if only_t else f"token {only_d[0]!r} only in {draft_name}"
        else:
            tok = min((t for t in t_vocab if t_vocab[t] != d_vocab[t]), key=lambda t: t_vocab[t])
            first = f"token {tok!r} has id {t_vocab[tok]} in {target_name} but {d_vocab[tok]} in {draft_name}"
        raise PairError(
            f"tokenizers of target {target_name!r} ({len(t_vocab)} tokens) and draft {draft_name!r} "
            f"({len(d_vocab)} tokens) differ: {first}. Speculative decoding needs a draft from the same "
            "model family (same tokenizer); pick a draft trained with the target's tokenizer."
        )
    t_special, d_special = _special_tokens(target_tok), _special_tokens(draft_tok)
    for key in t_special:
        if t_special[key] != d_special[key]:
            raise PairError(
                f"special tokens of target {target_name!r} and draft {draft_name!r} differ at {key}: "
                f"{t_special[key]!r} vs {d_special[key]!r}. Save the draft with the target's tokenizer."
            )


def check_embedding_width(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """The model must have a logit for every token of the tokenizer (a wider, padded table is fine)."""
    width = logit_width(model)
    if width < len(tokenizer):
        raise PairError(
            f"{name!r} has {width} output logits but its tokenizer has {len(tokenizer)} tokens; "
            "the model was saved with a different tokenizer (resize its embeddings or fix the tokenizer)."
        )


def check_local_path(name_or_path: str, role: str) -> None:
    """A name written as a filesystem path (``/...``, ``./...``, ``../...``, ``~...``) must exist: say so plainly
    instead of the hub's "Repo id must be in the form ..." that transformers gives for a missing directory."""
    if name_or_path.startswith(("/", "./", "../", "~")) and not Path(name_or_path).expanduser().exists():
        raise PairError(f"the {role} model {name_or_path} does not exist (no such file or directory); "
                        f"check the path, or give a hub id")


def load_tokenizer(name_or_path: str | Path, role: str = "model") -> PreTrainedTokenizerBase:
    """AutoTokenizer.from_pretrained with an error that names the role and the path (a ``.gguf`` file too)."""
    name_or_path = str(name_or_path)
    if is_gguf(name_or_path):
        return load_gguf_tokenizer(name_or_path, role)
    check_local_path(name_or_path, role)
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        hint = "the directory has no tokenizer files" if Path(name_or_path).is_dir() else (
            "not a local directory, and the hub id could not be loaded (offline? typo?)"
        )
        raise PairError(f"cannot load the {role} tokenizer from {name_or_path!r}: {hint} ({exc})") from exc


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    """A torch dtype from its name ("float32", "bfloat16", ...); "auto" passes through."""
    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise PairError(f"unknown dtype {dtype!r}: use float32, float16, bfloat16 or auto")
        return getattr(torch, dtype)
    return dtype


def check_weight_files(name_or_path: str | Path, role: str = "model") -> None:
    """Raise :class:`PairError` naming the file when a local model's ``*.safetensors`` file is damaged.

    Reads each file's header only (8-byte length + JSON): the tensors' byte ranges must end exactly
    at the end of the file, which a truncated download or copy breaks. Hub ids are not checked here.
    """
    import json
    import struct

    root = Path(name_or_path)
    if not root.is_dir():
        return
    for path in sorted(root.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with path.open("rb") as fh:
                (header_len,) = struct.unpack("<Q", fh.read(8))
                if header_len > size - 8:
                    raise ValueError("header longer than the file")
                header = json.loads(fh.read(header_len))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
            raise PairError(f"the {role} weights file {path} is damaged (unreadable safetensors header: {exc}); "
                            "download or copy the model again") from exc
        if 8 + header_len + end != size:
            raise PairError(f"the {role} weights file {path} is damaged: {size} bytes where its header describes "
                            f"{8 + header_len + end} (truncated download or copy?); download or copy the model again")


def load_model(name_or_path: str | Path, role: str = "model", dtype: torch.dtype | str = "auto",
               device: str | torch.device = "cpu") -> torch.nn.Module:
    """AutoModelForCausalLM.from_pretrained in eval mode on `device`; errors name the role and path.

    A ``.gguf`` file is dequantised to `dtype` (float32 for "auto") through transformers' GGUF support.
    """
    name_or_path, dtype = str(name_or_path), resolve_dtype(dtype)
    if is_gguf(name_or_path):
        return load_gguf_model(name_or_path, role, None if dtype == "auto" else dtype).to(device).eval()
    check_local_path(name_or_path, role)
    check_weight_files(name_or_path, role)
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise PairError(f"cannot load the {role} model from {name_or_path!r}: {exc}") from exc
    return model.to(device).eval()


def load_pair(
    target: str | Path,
    draft: str | Path,
    *,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "cpu",
) -> ModelPair:
    """Load target and draft (local directories or hub ids) after checking their tokenizers.

    Args:
        target / draft: anything ``from_pretrained`` takes.
        dtype: torch dtype or its name ("float32", "bfloat16", "auto" = as saved).
        device: where both models go.
    Raises:
        PairError: a model or tokenizer does not load, the tokenizers differ, or a model has
            fewer logits than tokens. Checked before any weights are loaded where possible.
    """
    target_name, draft_name = str(target), str(draft)
    dtype = resolve_dtype(dtype)
    target_tok = load_tokenizer(target_name, "target")
    draft_tok = load_tokenizer(draft_name, "draft")
    check_tokenizers(target_tok, draft_tok, target_name, draft_name)
    target_model = load_model(target_name, "target", dtype, device)
    draft_model = load_model(draft_name, "draft", dtype, device)
    check_embedding_width(target_model, target_tok, target_name)
    check_embedding_width(draft_model, target_tok, draft_name)
    return ModelPair(target_model, draft_model, target_tok, target_name, draft_name)
