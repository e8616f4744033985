"""Measured forward costs of a model pair: the c and c_v of the speedup formula.

c   = draft forward of 1 token / target forward of 1 token,
c_v = target forward of k+1 tokens / target forward of 1 token,
all with the KV cache at the context length of a real prompt, medians over repeats.

The draft steps and the verification forward are timed in the call pattern of a speculative
round (verify k+1, then k draft steps), because that is how they run: on a CPU the first draft
step after the target's forward is markedly slower than a draft step timed back to back (the
target's weights have evicted the draft's from the caches). Each repeat starts with a plain
target step, and every ratio is the median of the repeats' own ratios, so that the drift of a
shared machine over seconds cancels within a repeat. Back-to-back draft costs are reported
beside them. These are costs timed apart, before or without decoding; the costs the decodes
themselves paid are eval/metrics.py's ``in_loop_costs``.

An EAGLE head (decode/eagle.py) is timed as its decode runs it: one slot per draft step through its own cache,
scored by the target's head (on the draft vocabulary when given), with the target on the lean forward keeping
its features (what :func:`~draftsmith.decode.loop.eagle_generate` asks of it); an EAGLE-3 head (decode/eagle3.py)
likewise, over its own draft vocabulary, the target keeping its three layers' streams. N-gram prompt lookup
(decode/ngram.py) has no forward: its c is the lookup's time over a text of the context's length; suffix
decoding's (decode/suffix.py) is its tree's, grown from the context.
"""

from __future__ import annotations

import statistics
import time

import torch

from draftsmith.decode.runners import Runner, make_runner


class _EagleSteps:
    """An EAGLE head's decode-time runner (decode/eagle.py ``EagleRunner``) called as a :class:`Runner`: a forward
    of `tokens` [1, T] feeds them with zero features (values do not change the cost) and scores the last `keep`
    outputs with the target's head. A round's first step is timed as one slot; in a decode it feeds the a+1 slots
    the last round accepted (a one-layer forward over 1-3 slots: nearly the cost of one)."""

    def __init__(self, head, target: torch.nn.Module, capacity: int, vocab: torch.Tensor | None, products=None):
        from draftsmith.decode.eagle import EagleRunner

        self.runner = EagleRunner(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                                  capacity, vocab=vocab, products=products)

    def __len__(self) -> int:
        return len(self.runner)

    def crop(self, length: int) -> None:
        self.runner.crop(length)

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        tokens = input_ids[0]
        feats = self.runner.embed.new_zeros((tokens.shape[0], self.runner.head.h))
        return self.runner.logits(self.runner.forward(tokens, feats)[-keep:])


class _Eagle3Steps(_EagleSteps):
    """An EAGLE-3 head's decode-time runner (decode/eagle3.py ``Eagle3Runner``) called as a :class:`Runner`, as
    :class:`_EagleSteps`: zero features of its three layers in (through ``fc``, as a round's real slots), its own
    draft vocabulary's logits out."""

    def __init__(self, head, target: torch.nn.Module, capacity: int, products=None):
        from draftsmith.decode.eagle3 import Eagle3Runner
        from draftsmith.decode.runners import logit_width

        self.runner = Eagle3Runner(head, target.get_input_embeddings().weight, logit_width(target), capacity,
                                   products=products)

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        tokens, head = input_ids[0], self.runner.head
        aux = self.runner.embed.new_zeros((tokens.shape[0], len(head.layers) * head.target_hidden))
        fused = self.runner.fuse(aux)  # fc timed, as a round runs it
        return self.runner.logits(self.runner.forward(tokens, fused)[-keep:])


class _LookupSteps:
    """N-gram prompt lookup (decode/ngram.py) called as a :class:`Runner`: a forward appends `tokens` to the text
    and looks up a proposal in it, as a round of :func:`~draftsmith.decode.loop.ngram_generate` does once; its
    "logits" are a dummy. What it costs is the lookup over a text of the context's length."""

    def __init__(self, ngram):
        self.ngram, self.text = ngram, None

    def __len__(self) -> int:
        return 0 if self.text is None else self.text.shape[0]

    def crop(self, length: int) -> None:
        self.text = self.text[:length]

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        self.text = input_ids[0] if self.text is None else torch.cat([self.text, input_ids[0]])
        self.ngram.propose(self.text, 4)
        return self.text.new_zeros((keep, 1), dtype=torch.float32)


class _SuffixSteps(_LookupSteps):
    """vLLM's suffix decoding (decode/suffix.py) called as a :class:`Runner`, as :class:`_LookupSteps` is: the first
    forward's tokens start the request's tree, each later one adds its tokens and asks the tree for a proposal, as a
    round of :func:`~draftsmith.decode.loop.suffix_generate` does once."""

    def __init__(self):
        super().__init__(None)

    def forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        from draftsmith.decode.suffix import SuffixTree

        if self.ngram is None:  # the context so far is the request's prompt
            self.ngram = SuffixTree(input_ids[0].tolist())
        return super().forward(input_ids, keep)


def _runners(target, draft, backend: str, capacity: int, vocab: torch.Tensor | None) -> tuple[Runner, Runner]:
    """The target's and the draft's runners as the decode runs them (an EAGLE head: eagle_generate's; an EAGLE-3
    head: eagle3_generate's, the target keeping its three layers' streams; n-gram lookup: ngram_generate's)."""
    from draftsmith.decode.eagle import EagleHead
    from draftsmith.decode.eagle3 import Eagle3Head
    from draftsmith.decode.ngram import NGram
    from draftsmith.decode.suffix import Suffix

    if isinstance(draft, NGram):
        return make_runner(target, backend, capacity), _LookupSteps(draft)
    if isinstance(draft, Suffix):
        return make_runner(target, backend, capacity), _SuffixSteps()
    if isinstance(draft, Eagle3Head):
        from draftsmith.decode.lean import LeanModel

        tgt = LeanModel(target, capacity=capacity)
        tgt.keep_layers = tuple(draft.layers)
        return tgt, _Eagle3Steps(draft, target, capacity, products=tgt.block_product)
    if isinstance(draft, EagleHead):
        from draftsmith.decode.lean import LeanModel

        tgt = LeanModel(target, capacity=capacity)
        tgt.keep_features = True
        return tgt, _EagleSteps(draft, target, capacity, vocab, products=tgt.block_product)
    return make_runner(target, backend, capacity), make_runner(draft, backend, capacity, vocab=vocab)


def _timed(runner: Runner, tokens: torch.Tensor, restore: int) -> float:
    """Seconds of one cached forward of `tokens` [1, T]; the cache is cropped back to `restore` after."""
    device = tokens.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    runner.forward(tokens, keep=tokens.shape[1])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    runner.crop(restore)
    return seconds


def mid_decode_context(prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """`prompt` [1, P] extended to the mean context length of a decode of `max_new_tokens`: P + max_new // 2.

    Attention makes a forward's cost grow with the context, so costs timed at the bare prompt
    understate the decode's. Token values do not change the cost: the last prompt token is repeated.
    """
    return torch.cat([prompt, prompt[:, -1:].repeat(1, max_new_tokens // 2)], dim=1)


@torch.inference_mode()
def cost_ratios(target, draft, context: torch.Tensor, ks: list[int], repeats: int = 20, backend: str = "auto",
                draft_vocab: torch.Tensor | None = None) -> dict:
    """Forward costs at `context` [1, P] and the ratios c (per k, in the round pattern) and c_v (per k).

    `backend` picks the cached forward as in the decode loops (see decode/runners.py): time the one
    the decode ran with, and `draft_vocab` the draft's reduced vocabulary as the decode used it. `draft` may be
    an EAGLE head (decode/eagle.py ``EagleHead``): timed as :func:`~draftsmith.decode.loop.eagle_generate` runs
    it, the target on the lean forward whatever `backend` says.

    Returns {"target_step_s", "draft_step_s" (back to back), "c_isolated", "c": {k: ...},
    "c_v": {k: ...}, "draft_step_in_round_s": {k: ...}, "verify_s": {k: ...}}: seconds are medians over
    the repeats, c and c_v medians of each repeat's ratio to its own target step. The decodes' own costs,
    paid in the loop, are eval/metrics.py's ``in_loop_costs``.
    """
    capacity = context.shape[1] + max(ks) + 2
    tgt, dft = _runners(target, draft, backend, capacity, draft_vocab)
    tgt.forward(context, keep=1)
    dft.forward(context, keep=1)
    p = context.shape[1]
    one = context[:, -1:]  # token values do not change the cost

    def median_of(fn) -> float:
        samples = [fn() for _ in range(repeats + 2)]  # two warm-up calls
        return statistics.median(samples[2:])

    draft_step = median_of(lambda: _timed(dft, one, p))
    # Each repeat times a plain target step, then each k's round pattern right after it, and the ratios are
    # taken within the repeat: a machine whose speed drifts over seconds (a shared host) moves numerator and
    # denominator together, where ratios of medians timed in separate bursts would move with the drift.
    steps, verify, drafts = [], {k: [] for k in ks}, {k: [] for k in ks}
    for _ in range(repeats + 2):  # two warm-up repeats
        steps.append(_timed(tgt, one, p))
        for k in ks:
            verify[k].append(_timed(tgt, one.repeat(1, k + 1), p))
            drafts[k].append(sum(_timed(dft, one, p) for _ in range(k)) / k)
    steps = steps[2:]
    target_step = statistics.median(steps)
    out = {"target_step_s": target_step, "draft_step_s": draft_step, "c_isolated": draft_step / target_step,
           "c": {}, "c_v": {}, "draft_step_in_round_s": {}, "verify_s": {}}
    for k in ks:
        v, d = verify[k][2:], drafts[k][2:]
        out["verify_s"][k], out["draft_step_in_round_s"][k] = statistics.median(v), statistics.median(d)
        out["c_v"][k] = statistics.median(x / s for x, s in zip(v, steps))
        out["c"][k] = statistics.median(x / s for x, s in zip(d, steps))
    return out
