"""The draft vocabulary of an eval (``eval.draft_vocab=N``): ranked from a datagen output's train split.

decode/vocab.py holds the mechanism (a head restricted to N token ids) and the ranking; this module
reads the datagen artifact: the target's completions (and its top-k alternatives, when datagen kept
them) of the train split rank the tokens, the held-out completions measure the coverage.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.artifacts.errors import UserError
from draftsmith.artifacts.formats import read_datagen
from draftsmith.decode.eos import as_id_list
from draftsmith.decode.vocab import coverage, frequency_vocab


class DraftVocabError(UserError, ValueError):
    """eval.draft_vocab cannot be built from what was given; the message says what to do."""


def datagen_vocab(data_dir: str | None, size: int, width: int, eos) -> tuple[torch.Tensor, dict]:
    """The `size` ids the target says most often in the datagen train split at `data_dir` -> (ids, info).

    info: {"size", "source", "ranked_from_tokens" (train completion tokens), "heldout_coverage" (share
    of the held-out completions' tokens in the vocabulary: the most a draft restricted to it can match)}.
    """
    if data_dir is None or not (Path(data_dir) / "manifest.json").exists():
        raise DraftVocabError(
            f"eval.draft_vocab={size} ranks tokens by what the target says in a datagen output's train split, and "
            f"{'this eval has none (its prompts come from data.prompts)' if data_dir is None else data_dir + ' is not one'}"
            f"; run the datagen stage (stages=[datagen,...,eval]) or set eval.draft_vocab=0 (the full vocabulary)")
    data, _ = read_datagen(data_dir, splits=("train",))
    train = data["train"]
    alternatives = train["topk_ids"] if "topk_ids" in train.column_names else ()
    alternatives = [[position[:8] for position in row] for row in alternatives]  # the target's top-8 at each position
    eos_ids = as_id_list(eos)
    ids = frequency_vocab(train["completion_ids"], size, width, alternatives=alternatives,
                          prompts=train["prompt_ids"], always=eos_ids)
    heldout = data["heldout"]["completion_ids"] if "heldout" in data else []
    info = {"size": int(ids.numel()), "source": str(data_dir),
            "ranked_from_tokens": sum(len(r) for r in train["completion_ids"]),
            "heldout_coverage": coverage(ids, heldout)}
    return ids, info
