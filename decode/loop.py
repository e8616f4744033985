"""The decode loops: plain autoregressive decoding, and speculative decoding with a draft model or an EAGLE head.

Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): the draft proposes K tokens one
at a time with its own KV cache, the target scores all K in one forward over K+1 positions, and
verification keeps a prefix of the drafts plus one target token. Greedy verification reproduces
the target's greedy output token for token; rejection sampling reproduces its distribution.

Sequence bookkeeping, for a sequence of n tokens at the start of a round (prompt + new tokens):
- the first new token comes from the target's prefill over the whole prompt (P tokens), as in
  plain decoding, so the rounds start at n = P + 1 and the target cache then holds P = n-1 positions;
- ``buf[0, :n]`` holds the tokens; drafts are written at ``buf[0, n : n+k]``.
- the target cache holds exactly n-1 positions: token n-1 is the first input of the round;
- the draft cache holds a prefix of the accepted tokens, never a rejected token: empty before the
  first round (the draft's prefill is its first step, which reads prompt + first token in one
  forward), then 1 or 2 tokens short of n: after a full acceptance the last draft and the bonus
  token are fed together in the next round's first draft step (one forward instead of gpt-fast's
  extra catch-up forward).

One loop (``_speculate``) runs every round; what proposes the drafts is a proposer: ``_DraftModel`` (a draft
model's cached runner, :func:`speculative_generate`), ``_Eagle`` (an EAGLE-1 head fed the target's features,
:func:`eagle_generate`) ``_Eagle3`` (an EAGLE-3 head fed three of its layers, :func:`eagle3_generate`) ``_NGram`` (prompt lookup, no
model at all: :func:`ngram_generate`) or ``_Suffix`` (vLLM's suffix decoding: :func:`suffix_generate`). A proposer is told when the target's prefill ran (``prefilled``), says how
many tokens it proposes in a round (``plan``: at most K; the n-gram proposer may have fewer, or none), gives the
logits of each proposal (``step``), and is told what verification kept (``verified``).
"""

from __future__ import annotations

import time

import torch

from draftsmith.decode.eos import as_id_list
from draftsmith.decode.runners import logit_width, make_runner, runner_name
from draftsmith.decode.sampling import check_sampling_args, logits_to_probs, sample
from draftsmith.decode.stats import DecodeStats, GenerateOutput, SpeculativeStats
from draftsmith.decode.verify import expected_acceptance, verify_greedy, verify_sampling


def _clock(device: torch.device) -> float:
    """Wall clock after the device has finished the queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _prepare_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Validate a batch-1 prompt and drop padded positions -> LongTensor [1, P]."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a 2-D LongTensor [batch, seq_len]")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"batch size {input_ids.shape[0]} is not supported: decode one prompt at a time "
            "(input_ids of shape [1, seq_len]); batched speculative decoding is planned separately"
        )
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
        input_ids = input_ids[:, attention_mask[0].bool()]
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: speculative and autoregressive decoding need at least one token")
    return input_ids


def _eos_tensor(eos_token_id: int | list[int] | None, device: torch.device) -> torch.Tensor | None:
    ids = as_id_list(eos_token_id)
    return torch.tensor(ids, device=device) if ids else None


def _first_eos(tokens: torch.Tensor, eos: torch.Tensor | None) -> int:
    """Index of the first EOS in `tokens` [T], or -1."""
    if eos is None:
        return -1
    hits = torch.isin(tokens, eos).nonzero()
    return int(hits[0, 0]) if hits.numel() else -1


def _next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator) -> torch.Tensor:
    """Greedy argmax or a filtered sample from logits [V] -> 0-d LongTensor."""
    if temperature == 0:
        return logits.argmax(-1)
    return sample(logits_to_probs(logits, temperature, top_k, top_p), generator)


@torch.inference_mode()
def autoregressive_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    backend: str = "auto",
) -> GenerateOutput:
    """Plain cached decoding with `model`, one forward per new token: the baseline.

    Args:
        model: a causal LM (transformers 5.x; decode/cache.py hands its KV cache over under the name the installed release takes), in eval mode.
        input_ids: [1, P] prompt; batch size 1 only. attention_mask: optional [1, P]; padded
            positions are dropped.
        max_new_tokens: exact cap on new tokens. eos_token_id: stop after the first of these.
        temperature / top_p / top_k: 0 temperature is greedy. generator: source of every draw.
        backend: how the model's cached forward runs (decode/runners.py): "lean"
            (:class:`decode.lean.LeanModel`, Llama-family models), "hf" (the model's own forward)
            or "auto" (lean when it covers the model). Both compute the same logits; lean skips
            HF's per-call overhead.
    Returns:
        GenerateOutput with ``sequences`` = input_ids + new tokens and :class:`DecodeStats`.
    """
    check_sampling_args(temperature, top_p, top_k)
    prompt = _prepare_prompt(input_ids, attention_mask)
    device = prompt.device
    eos = _eos_tensor(eos_token_id, device)
    runner = make_runner(model, backend, capacity=prompt.shape[1] + max(max_new_tokens, 0) + 1)
    stats = DecodeStats(backend=runner_name(runner))
    new: list[torch.Tensor] = []

    start = _clock(device)
    if max_new_tokens > 0:
        token = _next_token(runner.forward(prompt, keep=1)[-1], temperature, top_k, top_p, generator)
        stats.prefill_s = stats.ttft_s = _clock(device) - start
        new.append(token)
        while len(new) < max_new_tokens and not (eos is not None and bool(torch.isin(token, eos))):
            logits = runner.forward(token.view(1, 1), keep=1)[-1]  # [V]
            token = _next_token(logits, temperature, top_k, top_p, generator)
            new.append(token)
    stats.total_s = _clock(device) - start
    stats.new_tokens = len(new)
    stats.target_forwards = runner.forwards
    tail = torch.stack(new).view(1, -1) if new else input_ids.new_empty((1, 0))
    return GenerateOutput(sequences=torch.cat([input_ids, tail.to(input_ids.dtype)], dim=1), stats=stats)


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    k: int = 4,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    backend: str = "auto",
    draft_vocab: torch.Tensor | None = None,
) -> GenerateOutput:
    """Speculative decoding of `target` with `draft` proposing `k` tokens per round.

    Same arguments and output as :func:`autoregressive_generate`, plus the draft and `k`. The
    output equals the target's own greedy output at temperature 0, and is distributed as the
    target's filtered distribution at temperature > 0. Target and draft must share a tokenizer
    (see :func:`decode.load_pair`). `backend` applies to both models (see
    :func:`autoregressive_generate`); ``stats.backend`` / ``stats.draft_backend`` say which ran.
    Their logit widths may differ (padded embedding tables, as in Qwen): both distributions are
    then taken over the shared range ``[0, min(V_target, V_draft))``, which holds every real
    token of the tokenizer, so a padded id that one model cannot embed is never produced. Stats are
    :class:`SpeculativeStats`.

    `draft_vocab` (optional LongTensor of token ids, decode/vocab.py): the draft proposes only these
    tokens; its head computes only their rows under the lean forward. Greedy output is unchanged
    and sampling stays exact (its q is 0 outside the ids); only acceptance and the draft's cost move.

    First token: the target runs once over the whole prompt and its last logits give the first
    new token (argmax, or a draw from the same filtered distribution with `generator`), exactly as
    in :func:`autoregressive_generate`; ``stats.ttft_s`` is taken right there. The draft has not run
    yet: its prefill is folded into its first step of round 1, after the first token is known, so
    speculation adds nothing to the time to first token (not even the draft's prefill), and a
    1-token output or an EOS first token costs no draft forward at all.

    Steps of a round, with n tokens known and r new tokens still allowed (r >= 1):
        1. k_r = min(k, r - 1) so that the round can never overshoot ``max_new_tokens``;
        2. the draft proposes d_1..d_k_r, feeding each one back (its own KV cache; its first step
           of round 1 reads the whole prompt and the first token: the draft's prefill);
        3. the target runs once over [x_n, d_1..d_k_r] -> k_r+1 distributions;
        4. verification keeps d_1..d_a and appends one target token (correction or bonus);
        5. both caches are cropped back to the accepted text; stop at the first EOS.
    From round 2 on, rounds of the full K (not a short last block), the seconds of the draft steps, of the
    verification forward and of the whole round are summed (``stats.draft_s``, ``verify_s``, ``rounds_s``): the costs c and c_v as the loop paid them
    (eval/metrics.py ``in_loop_costs``), beside the ones timed apart (decode/timing.py). Not on CUDA, where timing a
    phase needs a synchronisation that would stall the launch of the next one (``in_loop`` is then None).
    ``stats.rounds`` counts the verification forwards; ``target_forwards`` = 1 (prefill) + rounds;
    tau (``mean_accepted_tokens``) = tokens from the rounds / rounds, the prefill's token excluded.
    """
    check_sampling_args(temperature, top_p, top_k)
    _check_k(k)
    prompt = _prepare_prompt(input_ids, attention_mask)
    capacity = prompt.shape[1] + max(max_new_tokens, 0) + k + 1
    tgt = make_runner(target, backend, capacity)
    dft = _DraftModel(make_runner(draft, backend, capacity, vocab=draft_vocab), min(logit_width(target), logit_width(draft)))
    return _speculate(tgt, dft, input_ids, prompt, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                      top_p=top_p, top_k=top_k, eos_token_id=eos_token_id, generator=generator)


@torch.inference_mode()
def eagle_generate(
    target: torch.nn.Module,
    head,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    k: int = 1,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> GenerateOutput:
    """Speculative decoding of `target` with an EAGLE-1 head (decode/eagle.py ``EagleHead``) proposing `k` tokens.

    The arguments, output and guarantees of :func:`speculative_generate` (greedy output equals the target's own;
    sampling is distributed as the target's), with `head` in place of a draft model, no `backend` (the target runs
    on the lean forward, Llama-family models, which hands back its post-norm features at the positions it ran)
    and K 1 by default (the head's second proposal is its weak one).

    The rounds are :func:`speculative_generate`'s; the head's bookkeeping (which slots its cache holds, which of
    the target's features it reads when) is ``_Eagle``'s docstring.
    ``stats.draft_backend`` is "eagle"; the in-loop costs are recorded as for a draft model.
    """
    def proposer(tgt, capacity: int):
        tgt.keep_features = True  # the post-norm features at the positions each forward runs
        return _Eagle(head, target, capacity, draft_vocab, products=tgt.block_product)

    return _with_head(target, proposer, input_ids, attention_mask, k=k, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
                      generator=generator)


@torch.inference_mode()
def eagle3_generate(
    target: torch.nn.Module,
    head,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerateOutput:
    """Speculative decoding of `target` with an EAGLE-3 head (decode/eagle3.py ``Eagle3Head``) proposing `k` tokens.

    The arguments, output and guarantees of :func:`eagle_generate` (greedy output equals the target's own;
    sampling is distributed as the target's: the head's q is 0 outside its draft vocabulary). The target runs on
    the lean forward (Llama, Mistral, Qwen2, Qwen3), which keeps the residual stream entering the head's three
    layers; the head proposes over its own draft vocabulary, mapped to the target's ids through ``d2t``.
    ``stats.draft_backend`` is "eagle3".
    """
    def proposer(tgt, capacity: int):
        tgt.keep_layers = tuple(head.layers)  # the streams entering the head's layers, at every position it runs
        return _Eagle3(head, target, capacity, products=tgt.block_product)

    return _with_head(target, proposer, input_ids, attention_mask, k=k, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
                      generator=generator)


@torch.inference_mode()
def suffix_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    backend: str = "auto",
) -> GenerateOutput:
    """Speculative decoding of `target` with vLLM's suffix decoding (decode/suffix.py: Arctic Inference's suffix tree
    over the prompt and what the decode has written) proposing up to `k` tokens a round: vLLM's ``method: suffix``.

    The arguments, output and guarantees of :func:`ngram_generate` (a round the tree cannot continue costs one plain
    target step). ``stats.draft_backend`` is "suffix"; ``stats.draft_forwards`` is 0. Needs Arctic Inference
    (ImportError with its install line otherwise).
    """
    from draftsmith.decode.suffix import SuffixTree

    return _without_model(target, lambda prompt: _Suffix(SuffixTree(prompt[0].tolist()), logit_width(target)),
                          input_ids, attention_mask, k=k, max_new_tokens=max_new_tokens, backend=backend,
                          temperature=temperature, top_p=top_p, top_k=top_k, eos_token_id=eos_token_id,
                          generator=generator)


@torch.inference_mode()
def ngram_generate(
    target: torch.nn.Module,
    ngram,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    k: int = 3,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    backend: str = "auto",
) -> GenerateOutput:
    """Speculative decoding of `target` with n-gram prompt lookup (decode/ngram.py ``NGram``) proposing up to `k`
    tokens a round: speculation with no draft to train, vLLM's ``method: ngram``.

    The arguments, output and guarantees of :func:`speculative_generate` (greedy output equals the target's own;
    sampling is distributed as the target's), with the lookup window `ngram` in place of a draft model. A round
    whose text has no earlier match proposes nothing and costs one plain target step. ``stats.draft_backend`` is
    "ngram"; ``stats.draft_forwards`` is 0.
    """
    return _without_model(target, lambda prompt: _NGram(ngram, logit_width(target)), input_ids, attention_mask,
                          k=k, max_new_tokens=max_new_tokens, backend=backend, temperature=temperature, top_p=top_p,
                          top_k=top_k, eos_token_id=eos_token_id, generator=generator)


def _without_model(target, proposer, input_ids, attention_mask, *, k: int, max_new_tokens: int, backend: str,
                   **sampling) -> GenerateOutput:
    """:func:`_speculate` with the target's cached runner and a proposer that runs no model, `proposer(prompt)`
    (prompt [1, P]): what :func:`ngram_generate` and :func:`suffix_generate` share."""
    check_sampling_args(sampling["temperature"], sampling["top_p"], sampling["top_k"])
    _check_k(k)
    prompt = _prepare_prompt(input_ids, attention_mask)
    tgt = make_runner(target, backend, prompt.shape[1] + max(max_new_tokens, 0) + k + 1)
    return _speculate(tgt, proposer(prompt), input_ids, prompt, k=k, max_new_tokens=max_new_tokens, **sampling)


def _with_head(target, proposer, input_ids, attention_mask, *, k: int, max_new_tokens: int, **sampling):
    """:func:`_speculate` with the target on the lean forward and the head `proposer(tgt, capacity)` sets up (it
    says which of the target's states the lean forward keeps for it): what :func:`eagle_generate` and
    :func:`eagle3_generate` share."""
    from draftsmith.decode.lean import LeanModel, lean_unsupported

    check_sampling_args(sampling["temperature"], sampling["top_p"], sampling["top_k"])
    _check_k(k)
    reason = lean_unsupported(target)
    if reason is not None:
        raise head_unsupported_error(reason)
    prompt = _prepare_prompt(input_ids, attention_mask)
    capacity = prompt.shape[1] + max(max_new_tokens, 0) + k + 1
    tgt = LeanModel(target, capacity=capacity)
    dft = proposer(tgt, capacity)
    return _speculate(tgt, dft, input_ids, prompt, k=k, max_new_tokens=max_new_tokens, **sampling)


def head_unsupported_error(reason: str):
    """The error for a target an EAGLE head cannot run with: the head reads the lean forward's features, so there
    is no other backend to fall back to (unlike a draft model's ``decode.backend=hf``)."""
    from draftsmith.artifacts.errors import ConfigError

    return ConfigError(f"an EAGLE head runs on the target's lean forward (it reads its features there), which does "
                       f"not cover this target: {reason}; measure a draft model for it instead")


def _check_k(k) -> None:
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k (draft tokens per round) must be an integer >= 1, got {k!r}")


# -- the proposers: what drafts a round's tokens -----------------------------------------------------
class _DraftModel:
    """A draft model with its own KV cache (decode/runners.py): the draft side of :func:`speculative_generate`.

    Its cache holds a prefix of the accepted tokens, never a rejected one: empty before round 1 (its prefill is
    its first step, which reads prompt + first token in one forward), then 1 or 2 tokens short of n: after a full
    acceptance the last draft and the bonus token are fed together in the next round's first step."""

    def __init__(self, runner, width: int):
        self.runner, self.width = runner, width
        self.backend = runner_name(runner)

    @property
    def forwards(self) -> int:
        return self.runner.forwards

    def prefilled(self, tgt) -> None:
        """The target's prefill ran (the draft's own prefill is folded into its first step)."""

    def plan(self, buf: torch.Tensor, n: int, k_r: int) -> int:
        """How many tokens this round proposes, with n tokens known and room for `k_r`: all of them."""
        return k_r

    def step(self, buf: torch.Tensor, n: int, i: int) -> torch.Tensor:
        """Logits [V] of proposal i+1 of a round that starts with n tokens known (buf[0, n : n+i] drafted so far):
        the tokens not yet in the cache in, one draft out."""
        return self.runner.forward(buf[:, len(self.runner) : n + i], keep=1)[-1, : self.width]

    def verified(self, tgt, n: int, n_acc: int) -> None:
        """The round's verification kept `n_acc` drafts: the cache goes back to the accepted text."""
        self.runner.crop(n + n_acc)


class _Eagle:
    """An EAGLE head (decode/eagle.py) fed the target's features: the draft side of :func:`eagle_generate`.

    Slot t of its cache holds (x_{t+1}, h_t). With n tokens known at a round's start, the target's features
    h_0 .. h_{n-2} are known: the round first feeds the real slots not yet in the cache (len(cache) .. n-2), whose
    last output proposes d_1 = x_n; proposal i+1 reads (d_i, the head's own output at the slot before), the
    speculative slots. After verification the cache goes back to its real slots (n-1), and the target's features
    of the accepted positions (h_{n-1} .. h_{n-1+a}, from the verification forward) wait for the next round."""

    backend = "eagle"

    def __init__(self, head, target: torch.nn.Module, capacity: int, vocab: torch.Tensor | None, products=None):
        from draftsmith.decode.eagle import EagleRunner

        self.runner = EagleRunner(head, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                                  capacity, vocab=vocab, products=products)
        self.width = logit_width(target)
        self.pending: torch.Tensor | None = None  # features h_{len(cache)} .. h_{n-2}: real slots not read yet
        self.hidden: torch.Tensor | None = None  # the head's output at the last slot fed

    @property
    def forwards(self) -> int:
        return self.runner.forwards

    def _features(self, tgt) -> torch.Tensor:
        """What the head reads of the target's last forward, per position [T, H]: its post-norm features."""
        return tgt.features

    def prefilled(self, tgt) -> None:
        self.pending = self._features(tgt)  # [P, H]: h_0 .. h_{P-1}

    def plan(self, buf: torch.Tensor, n: int, k_r: int) -> int:
        return k_r

    def step(self, buf: torch.Tensor, n: int, i: int) -> torch.Tensor:
        if i == 0:  # the real slots; the last proposes x_n
            self.hidden = self.runner.forward(buf[0, len(self.runner) + 1 : n], self.pending)[-1:]
        else:  # a speculative slot: (d_i, the head's own output at the slot before)
            self.hidden = self.runner.forward(buf[0, n + i - 1 : n + i], self.hidden)
        return self.runner.logits(self.hidden)[-1, : self.width]

    def verified(self, tgt, n: int, n_acc: int) -> None:
        # its real slots 0 .. n-2 stay; a round without proposals (k_r 0) is the decode's last: one token was left,
        # and its bonus token ends the decode
        self.runner.crop(n - 1)
        self.pending = self._features(tgt)[: n_acc + 1]  # h_{n-1} .. h_{n-1+a}


class _Eagle3(_Eagle):
    """An EAGLE-3 head (decode/eagle3.py) fed the target's features at its three layers, fused: the draft side of
    :func:`eagle3_generate`. The slots and rounds are :class:`_Eagle`'s; a speculative slot reads the head's own
    pre-norm output (vLLM's), and a proposal's logits are the draft vocabulary's, placed at their target ids."""

    backend = "eagle3"

    def __init__(self, head, target: torch.nn.Module, capacity: int, products=None):
        from draftsmith.decode.eagle3 import Eagle3Runner

        self.width = logit_width(target)
        self.runner = Eagle3Runner(head, target.get_input_embeddings().weight, self.width, capacity, products=products)
        self.pending: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None

    def _features(self, tgt) -> torch.Tensor:
        return self.runner.fuse(tgt.aux)  # [T, 3H] -> [T, H]


class _NGram:
    """Prompt lookup (decode/ngram.py): the draft side of :func:`ngram_generate`. A round proposes what followed the
    earliest earlier occurrence of the longest n-gram ending the text, up to K tokens, or nothing (the round is then
    a plain decode step: one target forward over one token). Each proposal's logits are 0 at the proposed id and
    -inf elsewhere: a one-hot q, with which rejection sampling keeps the target's distribution."""

    backend = "ngram"
    forwards = 0  # no model runs

    def __init__(self, ngram, width: int):
        self.ngram, self.width = ngram, width
        self.proposal: torch.Tensor | None = None

    def prefilled(self, tgt) -> None:
        """Nothing to prepare: the lookup reads the text itself."""

    def plan(self, buf: torch.Tensor, n: int, k_r: int) -> int:
        found = self.ngram.propose(buf[0, :n], k_r)
        ok = (found < self.width).to(torch.int8).cumprod(0)  # an id the target cannot score ends the proposal
        self.proposal = found[: int(ok.sum())]
        return int(self.proposal.shape[0])

    def step(self, buf: torch.Tensor, n: int, i: int) -> torch.Tensor:
        logits = torch.full((self.width,), float("-inf"), device=buf.device)
        logits[self.proposal[i]] = 0.0
        return logits

    def verified(self, tgt, n: int, n_acc: int) -> None:
        """Nothing to roll back: the next lookup reads the text as verification left it."""


class _Suffix(_NGram):
    """vLLM's suffix decoding (decode/suffix.py ``SuffixTree``, one per decode): the draft side of
    :func:`suffix_generate`; :class:`_NGram`'s rounds and one-hot proposals."""

    backend = "suffix"


def _speculate(tgt, dft, input_ids: torch.Tensor, prompt: torch.Tensor, *, k: int, max_new_tokens: int,
               temperature: float, top_p: float, top_k: int, eos_token_id, generator) -> GenerateOutput:
    """The speculative loop of :func:`speculative_generate` (steps numbered there) with the target's cached runner
    `tgt` and a proposer `dft` (:class:`_DraftModel`, :class:`_Eagle`, :class:`_Eagle3`, :class:`_NGram`, :class:`_Suffix`:
    ``prefilled``, ``plan``, ``step``, ``verified``, ``width``, ``backend``, ``forwards``)."""
    device = prompt.device
    eos = _eos_tensor(eos_token_id, device)
    greedy = temperature == 0
    n_prompt = prompt.shape[1]
    stats = SpeculativeStats(k=k, drafted_per_position=[0] * k, accepted_per_position=[0] * k,
                             overlap_sum=None if greedy else 0.0, backend=runner_name(tgt), draft_backend=dft.backend)
    buf = torch.empty((1, n_prompt + max_new_tokens + k + 1), dtype=torch.long, device=device)
    buf[:, :n_prompt] = prompt
    n = n_prompt  # tokens known: prompt + new tokens
    width = dft.width  # the shared token range V

    timed = device.type != "cuda"  # on a GPU the phases would need a sync each, which costs the decode overlap
    start = _clock(device)
    finished = max_new_tokens <= 0
    if not finished:  # the first token, from the target's prefill over the whole prompt
        logits = tgt.forward(buf[:, :n], keep=1)[-1, :width]  # [V]
        dft.prefilled(tgt)
        buf[0, n] = _next_token(logits, temperature, top_k, top_p, generator)
        n += 1
        stats.prefill_s = stats.ttft_s = _clock(device) - start
        finished = max_new_tokens == 1 or _first_eos(buf[0, n - 1 : n], eos) >= 0

    while not finished:  # round start: the target cache holds n-1 positions
        round_start = time.perf_counter() if timed else 0.0  # the proposer's plan (a lookup) is the round's too
        k_r = dft.plan(buf, n, min(k, n_prompt + max_new_tokens - n - 1))  # step 1
        q_rows = []
        for i in range(k_r):  # step 2: one draft out per step
            logits = dft.step(buf, n, i)  # [V]
            if greedy:
                buf[0, n + i] = logits.argmax(-1)
            else:
                q_rows.append(logits_to_probs(logits, temperature, top_k, top_p))
                buf[0, n + i] = sample(q_rows[-1], generator)
        drafted_at = time.perf_counter() if timed else 0.0
        p_logits = tgt.forward(buf[:, n - 1 : n + k_r], keep=k_r + 1)[:, :width]  # step 3: [k_r+1, V]
        verified_at = time.perf_counter() if timed else 0.0
        drafts = buf[0, n : n + k_r]  # [k_r]
        if greedy:  # step 4
            n_acc, nxt = verify_greedy(drafts, p_logits.argmax(-1))
        else:
            p = logits_to_probs(p_logits, temperature, top_k, top_p)  # [k_r+1, V]
            q = torch.stack(q_rows) if q_rows else p.new_zeros((0, p.shape[-1]))  # [k_r, V]
            n_acc, nxt = verify_sampling(drafts, q, p, generator)
            stats.overlap_sum += float(expected_acceptance(p[:k_r], q).sum()) if k_r else 0.0
        buf[0, n + n_acc] = nxt

        n_new = n_acc + 1
        eos_at = _first_eos(buf[0, n : n + n_new], eos)
        if eos_at >= 0:
            n_new, finished = eos_at + 1, True
        stats.record_round(k_r, n_acc, n_new)
        tgt.crop(n + n_acc)  # step 5: the target saw n + k_r positions; keep n + n_acc
        dft.verified(tgt, n, n_acc)
        n += n_new
        finished = finished or n - n_prompt >= max_new_tokens
        # the in-loop costs leave out round 1 (its first draft step: the prefill) and a short last block (fewer
        # tokens to verify than K + 1: a cheaper verification than K's)
        if timed and stats.rounds > 1 and k_r == k:
            stats.record_costs(k_r, drafted_at - round_start, verified_at - drafted_at, time.perf_counter() - round_start)

    stats.total_s = _clock(device) - start
    stats.new_tokens = n - n_prompt
    stats.target_forwards, stats.draft_forwards = tgt.forwards, dft.forwards
    tail = buf[:, n_prompt:n].to(input_ids.dtype)
    return GenerateOutput(sequences=torch.cat([input_ids, tail], dim=1), stats=stats)
