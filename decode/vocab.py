"""A reduced draft vocabulary: the draft's head scores only the tokens the target actually says.

Why: a draft cut from a large-vocabulary target (``pair.draft_layers``) spends most of its step in
its output head. SmolLM2-135M's 2-layer draft: the 49152 x 576 head is 28.3M multiply-adds per token
against ~4M per decoder layer, three quarters of the draft's cost.
Restricting the head to the N most frequent tokens of the target's own outputs (FR-Spec, Zhao et
al. 2025; EAGLE-3's draft vocabulary) cuts that part by 49152 / N, while on in-domain text almost
every token the target emits is in the set (the rest the draft cannot propose; the target's
verification still emits them).

Correctness is unchanged: the draft is only a proposer. Greedy verification keeps the target's
greedy output whatever the draft proposes; rejection sampling is exact for any proposal
distribution q, here q = softmax over the kept tokens and 0 elsewhere (decode/verify.py
accepts d with probability min(1, p(d)/q(d)) and resamples from max(0, p - q), which covers the
tokens q gives no mass).

The runners return logits over the full width, -inf outside the kept ids, so the loops, the
sampling filters and verification are the same code with or without a reduced vocabulary; whether
the head computes only the kept rows (lean) or its full logits are masked (hf) is decided in
decode/runners.py.

:func:`frequency_vocab` ranks tokens from datagen rows (lists of ids), a pure function;
:func:`datagen_vocab` reads them from a datagen output, so that the eval's runners and training's
reduced head (``method.reduced_head``) restrict the draft to the same ids.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from draftsmith.artifacts.errors import UserError

VOCAB_FILE = "draft_vocab.json"


def check_vocab(ids: torch.Tensor, width: int) -> torch.Tensor:
    """`ids` as a sorted, distinct 1-D LongTensor within [0, width); ValueError otherwise."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("the draft vocabulary is empty")
    ids = torch.unique(ids)  # sorted, distinct
    if int(ids[0]) < 0 or int(ids[-1]) >= width:
        raise ValueError(f"draft vocabulary ids must be in [0, {width}); got {int(ids[0])} .. {int(ids[-1])}")
    return ids


def scatter_logits(sub: torch.Tensor, ids: torch.Tensor, width: int) -> torch.Tensor:
    """Logits [T, len(ids)] over the kept ids -> [T, width], -inf at every other id."""
    out = sub.new_full((sub.shape[0], width), float("-inf"))
    out[:, ids] = sub
    return out


def frequency_vocab(completions: Iterable[Sequence[int]], size: int, width: int, *,
                    alternatives: Iterable[Sequence[Sequence[int]]] = (), prompts: Iterable[Sequence[int]] = (),
                    always: Iterable[int] = ()) -> torch.Tensor:
    """The `size` ids the target says most often -> sorted LongTensor (at most `size`, within [0, width)).

    Ranked by how often the target emitted the token in `completions`; ties (and tokens it never
    emitted) by how often it was among the target's top alternatives at a position (`alternatives`:
    per row, per position, the top-k ids datagen kept), then by how often it appears in the
    `prompts`. `always` (EOS ids) are kept whatever their rank. The alternatives and prompts rank the
    tokens the completions never emitted, so held-out completions find more of theirs among the kept ids.
    """
    if size < 1:
        raise ValueError(f"the draft vocabulary size must be >= 1, got {size}")
    said, alt, seen = Counter(), Counter(), Counter()
    for row in completions:
        said.update(row)
    for row in alternatives:
        for position in row:
            alt.update(position)
    for row in prompts:
        seen.update(row)
    always = [int(t) for t in always if 0 <= int(t) < width]
    ranked = sorted((t for t in set(said) | set(alt) | set(seen) if 0 <= t < width),
                    key=lambda t: (-said[t], -alt[t], -seen[t], t))
    keep = list(dict.fromkeys(always + ranked))[: max(size, len(always))]
    if not keep:
        raise ValueError("no token ids to build a draft vocabulary from (empty completions)")
    return torch.tensor(sorted(keep), dtype=torch.long)


def coverage(ids: torch.Tensor, rows: Iterable[Sequence[int]]) -> float | None:
    """Fraction of the tokens of `rows` that are in `ids` (None when `rows` hold no token)."""
    kept = set(ids.tolist())
    total = hit = 0
    for row in rows:
        total += len(row)
        hit += sum(1 for t in row if t in kept)
    return hit / total if total else None


def save_vocab(path: str | Path, ids: torch.Tensor, **info) -> Path:
    """Write ``{"size", "ids", **info}`` as JSON at `path` (a file, or a directory -> draft_vocab.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"size": int(ids.numel()), **info, "ids": ids.tolist()}), encoding="utf-8")
    tmp.replace(path)
    return path


def load_vocab(path: str | Path) -> torch.Tensor:
    """The ids of a file written by :func:`save_vocab` (a file or a directory holding draft_vocab.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_FILE
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))["ids"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a draft vocabulary file ({err}); write it with decode.vocab.save_vocab") from err
    return torch.tensor(ids, dtype=torch.long)


class DraftVocabError(UserError, ValueError):
    """A draft vocabulary cannot be built from what was given; the message names the key and says what to do."""


def datagen_vocab(data_dir: str | None, size: int, width: int, eos, *,
                  key: str = "eval.draft_vocab") -> tuple[torch.Tensor, dict]:
    """The `size` ids the target says most often in the datagen train split at `data_dir` -> (ids, info).

    Ranked by :func:`frequency_vocab` from the target's completions, its top-8 alternatives at each
    position (when datagen kept top-k log-probs) and the prompts; `eos` (an id, a list, or None) is
    always kept. info: {"size", "source", "ranked_from_tokens" (train completion tokens),
    "heldout_coverage" (share of the held-out completions' tokens in the vocabulary: the most a draft
    restricted to it can match)}. `key` is the setting that asked, named in the error.
    """
    from draftsmith.artifacts.formats import read_datagen
    from draftsmith.decode.eos import as_id_list

    if data_dir is None or not (Path(data_dir) / "manifest.json").exists():
        raise DraftVocabError(
            f"{key}={size} ranks tokens by what the target says in a datagen output's train split, and "
            f"{'this run has none (its prompts come from data.prompts)' if data_dir is None else str(data_dir) + ' is not one'}"
            f"; run the datagen stage (stages=[datagen,...]) or set eval.draft_vocab=0 (the full vocabulary)")
    data, _ = read_datagen(data_dir, splits=("train",))
    train = data["train"]
    alternatives = train["topk_ids"] if "topk_ids" in train.column_names else ()
    alternatives = [[position[:8] for position in row] for row in alternatives]  # the target's top-8 at each position
    ids = frequency_vocab(train["completion_ids"], size, width, alternatives=alternatives,
                          prompts=train["prompt_ids"], always=as_id_list(eos))
    heldout = data["heldout"]["completion_ids"] if "heldout" in data else []
    info = {"size": int(ids.numel()), "source": str(data_dir),
            "ranked_from_tokens": sum(len(r) for r in train["completion_ids"]),
            "heldout_coverage": coverage(ids, heldout)}
    return ids, info
