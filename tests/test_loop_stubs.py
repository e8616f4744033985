"""The speculative loop on stub models with fixed logits: accept / reject / bonus cases pinned by hand.

The first new token comes from the target's prefill (as in plain decoding), so the rounds start at
the second new token: the draft below is wrong at position 5 (the third new token), which gives a
first round of two accepted drafts and a correction.
"""

import pytest
import torch

from draftsmith.decode import autoregressive_generate, loop, speculative_generate
from stubs import random_table, scripted, share_journal

V = 32
TARGET_SCRIPT = [0, 1] + list(range(10, 26))  # position i -> token; new tokens start at position 2
PROMPT = torch.tensor([[0, 1]])


def draft_script(wrong_positions: dict[int, int]) -> list[int]:
    script = list(TARGET_SCRIPT)
    for pos, tok in wrong_positions.items():
        script[pos] = tok
    return script


def test_reject_then_bonus_by_hand():
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    out = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=8)
    assert out.sequences[0, 2:].tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    s = out.stats
    # prefill: target over [0 1] -> 10 (the first token)
    # round 1: drafts 11 12 30, target 11 12 13 -> accept 2 + correction 13
    # round 2: drafts 14 15 16, all accepted -> bonus 17
    assert (s.rounds, s.drafted, s.accepted, s.round_tokens) == (2, 6, 5, 7)
    assert s.drafted_per_position == [2, 2, 2] and s.accepted_per_position == [2, 2, 1]
    assert s.per_position_acceptance == [1.0, 1.0, 0.5]
    assert (s.target_forwards, s.draft_forwards) == (3, 6)  # prefill + one per round; 3 + 3 (no separate prefill)
    # tau: 7 tokens from 2 verification forwards; the prefill's token and forward are left out
    assert s.mean_accepted_tokens == 3.5 and s.acceptance_rate == 5 / 6 and s.new_tokens == 8
    assert s.rejected == 1 and s.token_acceptance == 5 / 6  # 5 accepted of the 6 tokens tested
    # the target sees the prompt, then exactly [last, d1..dK] each round; rejected tokens never reach a later forward
    assert target.calls == [[0, 1], [10, 11, 12, 30], [13, 14, 15, 16]]
    # the draft's prefill is its first step: prompt + first token in one forward
    assert draft.calls == [[0, 1, 10], [11], [12], [13], [14], [15]]


def test_first_token_comes_from_the_target_prefill_before_any_draft_step(monkeypatch):
    """TTFT is that of plain decoding: one target forward over the prompt, no draft work before it."""
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    journal = share_journal(target=target, draft=draft)
    monkeypatch.setattr(loop, "_clock", lambda device: float(len(journal)))  # "time" = forwards so far
    s = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=8).stats
    assert journal[:2] == [("target", [0, 1]), ("draft", [0, 1, 10])]  # the draft starts after the first token
    assert s.ttft_s == s.prefill_s == 1.0  # taken right after the target's prefill: one forward
    assert s.total_s == len(journal) == 1 + 3 + 3 + 2


def test_sampled_first_token_is_plain_decodings_first_draw():
    """At temperature > 0 the first token is the prefill's draw with the caller's generator, as in plain decoding."""
    target, draft = random_table(V, 4), random_table(V, 5)
    for seed in range(6):
        settings = dict(max_new_tokens=4, temperature=0.9, top_k=20, top_p=0.95)
        spec = speculative_generate(target, draft, PROMPT, k=2, generator=torch.Generator().manual_seed(seed), **settings)
        plain = autoregressive_generate(target, PROMPT, generator=torch.Generator().manual_seed(seed), **settings)
        assert spec.sequences[0, 2] == plain.sequences[0, 2]


def test_full_acceptance_catch_up_and_short_last_block():
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    out = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=11)
    assert out.sequences[0, 2:].tolist() == list(range(10, 21))
    # round 3 has 3 tokens left -> drafts only 2; the draft first catches up on [16, 17] in one forward
    assert draft.calls[-2:] == [[16, 17], [18]]
    assert target.calls[-1] == [17, 18, 19]
    assert out.stats.drafted_per_position == [3, 3, 2] and out.stats.accepted_per_position == [3, 3, 1]


@pytest.mark.parametrize("eos, expected, rounds", [(12, [10, 11, 12], 1), (11, [10, 11], 1), (10, [10], 0)])
def test_eos_inside_a_block_ends_the_output(eos, expected, rounds):
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    out = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=12, eos_token_id=eos)
    assert out.sequences[0, 2:].tolist() == expected
    assert out.stats.rounds == rounds and out.stats.new_tokens == len(expected)
    assert out.stats.round_tokens == len(expected) - 1  # EOS 12 ends round 1 after 2 of its 3 tokens
    if eos == 10:  # EOS as the first token: the prefill alone, the draft never runs
        assert (out.stats.target_forwards, out.stats.draft_forwards, out.stats.mean_accepted_tokens) == (1, 0, 0.0)
    ar = autoregressive_generate(target, PROMPT, max_new_tokens=12, eos_token_id=[99 % V, eos])
    assert ar.sequences[0, 2:].tolist() == expected


def test_a_draft_that_is_always_wrong_yields_one_token_per_round():
    target, draft = scripted(TARGET_SCRIPT, V), scripted([0, 1] + [31] * 16, V)
    out = speculative_generate(target, draft, PROMPT, k=4, max_new_tokens=7)
    assert out.sequences[0, 2:].tolist() == list(range(10, 17))
    assert out.stats.accepted == 0 and out.stats.rounds == 6 and out.stats.mean_accepted_tokens == 1.0
    # drafted 4 per round (then 3, 2, 1, 0 near the end) but only the first of each block was tested
    assert out.stats.rejected == 5 and out.stats.token_acceptance == 0.0 and out.stats.drafted == 4 + 4 + 3 + 2 + 1


def test_one_token_prompt_and_k_larger_than_budget():
    target, draft = scripted(TARGET_SCRIPT, V), scripted(TARGET_SCRIPT, V)
    out = speculative_generate(target, draft, torch.tensor([[0]]), k=8, max_new_tokens=4)
    assert out.sequences[0].tolist() == [0, 1, 10, 11, 12]
    # after the prefill's token, 3 tokens left -> k shortened to 2 = budget - 1
    assert out.stats.drafted_per_position == [1, 1, 0, 0, 0, 0, 0, 0]
    assert target.calls == [[0], [1, 10, 11]] and out.stats.target_forwards == 2  # prefill of the 1 token + 1 round
    assert draft.calls == [[0, 1], [10]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_new_token_is_the_prefill_alone(temperature):
    target, draft = scripted(TARGET_SCRIPT, V), scripted(TARGET_SCRIPT, V)
    out = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=1, temperature=temperature,
                               generator=torch.Generator().manual_seed(0))
    assert out.sequences[0].tolist() == [0, 1, 10]
    s = out.stats
    assert (s.rounds, s.round_tokens, s.target_forwards, s.draft_forwards, s.new_tokens) == (0, 0, 1, 0, 1)
    assert draft.calls == [] and s.tpot_s == 0.0


def test_zero_new_tokens_returns_the_prompt():
    target = scripted(TARGET_SCRIPT, V)
    assert torch.equal(speculative_generate(target, target, PROMPT, max_new_tokens=0).sequences, PROMPT)
    assert torch.equal(autoregressive_generate(target, PROMPT, max_new_tokens=0).sequences, PROMPT)


def test_left_padding_is_dropped_for_batch_one():
    target, draft = random_table(V, 1), random_table(V, 2)
    plain = speculative_generate(target, draft, torch.tensor([[5, 6, 7]]), k=2, max_new_tokens=8)
    padded = speculative_generate(target, draft, torch.tensor([[0, 0, 5, 6, 7]]), torch.tensor([[0, 0, 1, 1, 1]]),
                                  k=2, max_new_tokens=8)
    assert torch.equal(padded.sequences[:, 5:], plain.sequences[:, 3:])
    assert padded.sequences[0, :5].tolist() == [0, 0, 5, 6, 7]


def test_sampling_with_identical_models_accepts_everything():
    model = random_table(V, 3)
    out = speculative_generate(model, model, PROMPT, k=4, max_new_tokens=20, temperature=1.0,
                               generator=torch.Generator().manual_seed(0))
    assert out.stats.acceptance_rate == 1.0 and out.stats.new_tokens == 20
    assert abs(out.stats.expected_acceptance - 1.0) < 1e-5  # sum min(p, p) = 1


def test_expected_acceptance_predicts_the_acceptance_rate():
    """Over many sampled rounds, the share of first draft tokens accepted ~ mean sum min(p, q) there."""
    target, draft = random_table(V, 4), random_table(V, 5)
    gen = torch.Generator().manual_seed(0)
    accepted = overlap = 0.0
    for _ in range(400):
        s = speculative_generate(target, draft, PROMPT, k=1, max_new_tokens=3, temperature=1.0, generator=gen).stats
        accepted, overlap = accepted + s.accepted, overlap + s.overlap_sum
    assert 0.05 < overlap / 400 < 0.95
    assert abs(accepted / 400 - overlap / 400) < 0.07
    greedy = speculative_generate(target, draft, PROMPT, k=2, max_new_tokens=6).stats
    assert greedy.expected_acceptance is None


def test_same_seed_same_sample_different_seed_differs():
    target, draft = random_table(V, 4), random_table(V, 5)
    run = lambda seed: speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=16, temperature=1.0,  # noqa: E731
                                            generator=torch.Generator().manual_seed(seed)).sequences
    assert torch.equal(run(7), run(7))
    assert any(not torch.equal(run(7), run(s)) for s in range(8, 12))


@pytest.mark.parametrize("bad, match", [
    (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), "batch size 2"),
    (dict(input_ids=torch.tensor([1, 2])), "2-D"),
    (dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), "empty"),
    (dict(k=0), "k \\(draft tokens per round\\)"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
])
def test_bad_arguments_are_clear_errors(bad, match):
    model = scripted(TARGET_SCRIPT, V)
    kwargs = dict(input_ids=PROMPT, k=2, max_new_tokens=4) | bad
    with pytest.raises(ValueError, match=match):
        speculative_generate(model, model, **kwargs)


def test_autoregressive_rejects_batches_too():
    model = scripted(TARGET_SCRIPT, V)
    with pytest.raises(ValueError, match="batch size 3"):
        autoregressive_generate(model, torch.zeros((3, 2), dtype=torch.long))


def test_stats_serialise():
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    d = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=8).stats.to_dict()
    assert d["accepted_per_position"] == [2, 2, 1] and d["mean_accepted_tokens"] == 3.5 and d["round_tokens"] == 7
    assert {"prefill_s", "ttft_s", "total_s", "decode_s", "tpot_s", "tokens_per_s", "draft_forwards"} <= d.keys()
    assert d["total_s"] >= d["ttft_s"] == d["prefill_s"] >= 0


def test_the_rounds_after_the_first_are_timed_with_their_draft_steps(monkeypatch):
    """A fake clock advanced by each forward (draft: 1 per call, target: 10 per call): the in-loop costs sum
    the draft steps and verification forwards of the full rounds after the first exactly (a short last block,
    which verifies fewer tokens than K + 1, would make c_v look cheaper than K's), and the rest of a round is
    bookkeeping."""
    clock = {"now": 0.0}
    target, draft = scripted(TARGET_SCRIPT, V), scripted(draft_script({5: 30}), V)
    for model, cost in ((target, 10.0), (draft, 1.0)):
        inner = model.forward

        def timed(*args, _inner=inner, _cost=cost, **kwargs):
            clock["now"] += _cost
            return _inner(*args, **kwargs)

        monkeypatch.setattr(model, "forward", timed)
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock["now"])
    out = speculative_generate(target, draft, PROMPT, k=3, max_new_tokens=11, backend="hf")
    s = out.stats
    assert s.rounds == 3 and s.timed_rounds == 1  # round 1 (the draft's prefill) and round 3 are left out:
    assert s.drafted_per_position == [3, 3, 2]  # round 3 drafts 2 tokens (the last block is short)
    assert s.timed_draft_forwards == 3 and s.draft_s == 3.0 and s.verify_s == 10.0
    assert s.rounds_s == s.draft_s + s.verify_s  # the fake clock moves only in forwards
