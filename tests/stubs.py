"""Stub causal LMs with fixed logits, speaking the same forward/cache protocol as transformers 5 models.

logits at input position i = table[token_i] + pos_bias[i]: a bigram model with a position term.
Because the position comes from the cache length, a cache that is rolled back wrongly changes
the logits, so these stubs catch bookkeeping errors as well as verification errors.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch


class TableLM(torch.nn.Module):
    """logits[i] = table[input_ids[i]] + pos_bias[position i]; keys/values are dummies in the cache."""

    def __init__(self, table: torch.Tensor, pos_bias: torch.Tensor):
        super().__init__()
        self.config = None  # DynamicCache() then grows layers lazily
        self.table = table  # [V, V]
        self.pos_bias = pos_bias  # [max_positions, V]
        self.head = SimpleNamespace(weight=torch.empty(table.shape[1], 0))  # only its width is read
        self.calls: list[list[int]] = []  # the token ids of every forward, for hand checks
        self.journal: list | None = None  # a list shared by several stubs: (name, tokens) in call order
        self.name = ""

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0, **_):
        t = input_ids.shape[1]
        start = cache.get_seq_length() if cache is not None else 0
        if cache is not None:
            dummy = torch.zeros(1, 1, t, 1)
            cache.update(dummy, dummy, 0)
        self.calls.append(input_ids[0].tolist())
        if self.journal is not None:
            self.journal.append((self.name, self.calls[-1]))
        positions = torch.arange(start, start + t)
        logits = self.table[input_ids[0]] + self.pos_bias[positions]  # [T, V]
        if logits_to_keep:
            logits = logits[-logits_to_keep:]
        return SimpleNamespace(logits=logits.unsqueeze(0))


def share_journal(**models: TableLM) -> list:
    """One call journal for `models` (keyword = the name it records): [(name, token ids), ...] in call order."""
    journal: list = []
    for name, model in models.items():
        model.journal, model.name = journal, name
    return journal


def scripted(script: list[int], vocab: int, max_positions: int = 64, strength: float = 20.0) -> TableLM:
    """A stub whose greedy choice after position i is script[i + 1], whatever the tokens are."""
    bias = torch.zeros(max_positions, vocab)
    for i in range(len(script) - 1):
        bias[i, script[i + 1]] = strength
    return TableLM(torch.zeros(vocab, vocab), bias)


def random_table(vocab: int, seed: int, scale: float = 1.5, max_positions: int = 64) -> TableLM:
    """A stub with random bigram and position logits (a proper contextual distribution)."""
    gen = torch.Generator().manual_seed(seed)
    return TableLM(torch.randn(vocab, vocab, generator=gen) * scale,
                   torch.randn(max_positions, vocab, generator=gen) * scale)
