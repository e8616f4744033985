"""The EAGLE-3 head (decode/eagle3.py, trained by train/eagle3.py): its shapes and first step by hand, the
training-time test equal to what a decode round computes, its loss by hand, the vocabulary maps, the
speculators-format folder, and the decode loop driving it (decode/loop.py ``eagle3_generate``) keeping the
target's greedy output and its sampling distribution, for Llama, Qwen2 (biases), Qwen3 (q/k norms) and Mistral
targets."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import make_model
from draftsmith.decode import autoregressive_generate, eagle3_generate
from draftsmith.decode.eagle3 import (NORM_FLAGS, Eagle3Head, Eagle3Runner, default_layers, head_for_target,
                                      is_eagle3_dir, load_eagle3, save_eagle3, target_aux_features)
from draftsmith.train.eagle3 import (chain_mask, completion_window, eagle3_loss, heldout_metrics, shifted3,
                                    target_aux_rows, ttt_loss)

LAYERS = [0, 1, 3]


@pytest.fixture(scope="module")
def target():
    return make_model("llama", seed=1, layers=4)


def randomised(head: Eagle3Head, seed: int = 0) -> Eagle3Head:
    """`head` with every weight random (its start from the target would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return head


def rows_of(target, n=2, t=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, target.config.vocab_size, (n, t), generator=gen)
    aux, hs = target_aux_features(target, ids, torch.ones_like(ids), LAYERS)
    return ids, aux, hs


def by_hand(head: Eagle3Head, emb: torch.Tensor, f: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Step 0 of one row written out with loops: [T, H] embeddings and features -> the pre-norm outputs [T, H]."""
    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + head.eps)

    t = emb.shape[0]
    x = torch.cat([rms(emb, head.in_norm), rms(f, head.hidden_norm)], -1)  # [T, 2H]
    q, k, v = x @ head.q.T, x @ head.k.T, x @ head.v.T
    inv = 1.0 / (head.cfg["rope_theta"] ** (torch.arange(0, head.hd, 2).float() / head.hd))

    def rope(vec, p):  # one head's vector at position p
        half = head.hd // 2
        out = vec.clone()
        for i in range(half):
            c, s = math.cos(p * inv[i]), math.sin(p * inv[i])
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    rep = head.nh // head.nkv
    attn = torch.zeros(t, head.nh * head.hd)
    for s in range(t):
        for hh in range(head.nh):
            kv = hh // rep
            qs = rope(q[s, hh * head.hd:(hh + 1) * head.hd], int(pos[s]))
            scores = torch.stack([qs @ rope(k[u, kv * head.hd:(kv + 1) * head.hd], int(pos[u])) / math.sqrt(head.hd)
                                  for u in range(s + 1)])
            w = torch.softmax(scores, 0)
            attn[s, hh * head.hd:(hh + 1) * head.hd] = sum(w[u] * v[u, kv * head.hd:(kv + 1) * head.hd]
                                                           for u in range(s + 1))
    r = f + attn @ head.o.T
    y = rms(r, head.post_norm)
    return r + (F.silu(y @ head.gate.T) * (y @ head.up.T)) @ head.down.T


def test_the_fused_heads_shapes_and_its_first_step_by_hand(target):
    vocab = torch.tensor([4, 7, 9, 20, 33])
    head = randomised(head_for_target(target, LAYERS, vocab), seed=3)
    h = target.config.hidden_size
    assert head.fc.shape == (h, 3 * h) and head.q.shape == (4 * (h // 4), 2 * h)
    assert head.k.shape == (2 * (h // 4), 2 * h) and head.lm_head.shape == (5, h) and head.draft_vocab_size == 5
    ids, aux, _ = rows_of(target, n=1, t=6)
    emb = F.embedding(ids, target.model.embed_tokens.weight)
    pos = torch.arange(6)[None]
    got = head.ttt(emb, head.fuse(aux), pos, 1)[0][0]
    want = by_hand(head, emb[0], aux[0] @ head.fc.T, pos[0])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    logits = head.logits(got)
    torch.testing.assert_close(logits, (want / torch.sqrt((want * want).mean(-1, keepdim=True) + head.eps)
                                        * head.norm) @ head.lm_head.T, rtol=1e-4, atol=1e-4)


def test_aux_features_are_the_stream_entering_each_layer():
    """Layer id k is the residual stream entering layer k: HF's hidden_states[k] (vLLM's aux hidden states); the
    forward leaves no hook behind (the lean forward refuses a hooked model)."""
    target = make_model("llama", seed=1, layers=4)  # output_hidden_states below leaves transformers' hooks on it
    ids, aux, hs = rows_of(target, n=1, t=5)
    from draftsmith.decode.lean import lean_unsupported

    assert lean_unsupported(target) is None
    out = target.model(input_ids=ids, output_hidden_states=True)
    h = target.config.hidden_size
    for n, k in enumerate(LAYERS):
        torch.testing.assert_close(aux[..., n * h:(n + 1) * h], out.hidden_states[k])
    torch.testing.assert_close(hs, out.last_hidden_state)
    assert default_layers(30) == [2, 15, 27]


def test_the_training_time_test_is_what_a_decode_round_computes(target):
    """Step j of ``ttt`` at slot s equals the runner fed real slots 0 .. s-j and then j speculative slots, each
    reading the head's own output at the slot before: the attention pattern and inputs of a round's (j+1)-th
    proposal (a training loop that let step j see real keys past s-j, or read its own output at the same slot,
    would differ)."""
    head = randomised(head_for_target(target, LAYERS), seed=5)
    ids, aux, _ = rows_of(target, n=1, t=9, seed=6)
    emb_w = target.model.embed_tokens.weight
    nxt = ids[0, 1:]
    fused = head.fuse(aux[0, :-1])  # slot t: (x_{t+1}, f_t)
    outs = head.ttt(F.embedding(nxt, emb_w)[None], fused[None], torch.arange(8)[None], 3)
    with torch.no_grad():
        for s in range(3, 8):
            for j in range(3):
                runner = Eagle3Runner(head, emb_w, target.config.vocab_size, capacity=4)
                out = runner.forward(nxt[: s - j + 1], fused[: s - j + 1])[-1:]
                for i in range(1, j + 1):
                    out = runner.forward(nxt[s - j + i: s - j + i + 1], out)
                torch.testing.assert_close(outs[j][0, s], out[0], rtol=1e-4, atol=1e-4)
    # and the steps differ (the check above would pass a ttt that ran step 0 three times only if they did not)
    assert not torch.allclose(outs[0], outs[1], atol=1e-3)


@pytest.mark.parametrize("form", ["F.linear", "weight-first", "padded"])
def test_the_runner_takes_the_lean_forwards_products(target, form):
    """A decode hands the runner the target's measured product form (``products``); each form gives ``ttt``'s
    outputs and the head's logits up to float rounding, through a cache that keeps its KV heads grouped (the tiny
    target has 2 KV heads for 4) and grows past its first capacity (16 slots), with a rolled-back guess between."""
    from draftsmith.decode.lean import product

    head = randomised(head_for_target(target, LAYERS, torch.arange(4, 60)), seed=15)
    ids, aux, _ = rows_of(target, n=1, t=25, seed=16)
    emb_w, nxt = target.model.embed_tokens.weight, ids[0, 1:]  # slot s: (x_{s+1}, f_s), s = 0 .. 23
    want = head.ttt(F.embedding(nxt, emb_w)[None], head.fuse(aux[0, :-1])[None], torch.arange(24)[None], 2)
    runner = Eagle3Runner(head, emb_w, target.config.vocab_size, capacity=4, products=lambda t: product(form, t))
    assert head.nkv < head.nh and runner.k.shape[1] == head.nkv and runner.k.shape[2] == 16
    with torch.no_grad():
        fused = runner.fuse(aux[0, :-1])
        torch.testing.assert_close(fused, head.fuse(aux[0, :-1]), rtol=1e-5, atol=1e-5)
        a = runner.forward(nxt[:12], fused[:12])
        runner.forward(nxt[12:15], fused[12:15] + 1.0)  # a wrong guess, rolled back
        runner.crop(12)
        b = runner.forward(nxt[12:13], fused[12:13])
        c = runner.forward(nxt[13:20], fused[13:20])  # past 16 slots: the cache and the rotary table grow
        assert runner.k.shape[2] > 16 and len(runner) == 20
        runner.crop(19)
        second = runner.forward(nxt[19:20], c[-2:-1])  # slot 19 reading the head's own output at slot 18: step 1
    torch.testing.assert_close(torch.cat([a, b, c]), want[0][0, :20], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(second[0], want[1][0, 19], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(second[0], want[0][0, 19], atol=1e-3)  # the speculative slot is not the real one
    logits = runner.logits(c)
    torch.testing.assert_close(logits[:, head.vocab], head.logits(c), rtol=1e-5, atol=1e-5)
    assert torch.isinf(logits[:, 0]).all() and logits.shape == (7, target.config.vocab_size)


def test_a_decode_hands_the_head_the_lean_forwards_products(target, monkeypatch):
    """eagle3_generate and the cost ratios run the head's matrices through ``LeanModel.block_product`` (a spy on
    the products it returns sees the head's own matrices: its fc, its q and its draft-vocabulary head)."""
    from draftsmith.decode import lean as lean_module
    from draftsmith.decode.timing import cost_ratios

    head = randomised(head_for_target(target, LAYERS, torch.arange(4, 60)), seed=17)
    seen = set()
    plain = lean_module.LeanModel.block_product

    def spy(self, t, where="layer"):
        f = plain(self, t, where)

        def recorded(x, w, *rest):
            seen.add(id(w))
            return f(x, w, *rest)
        return recorded

    monkeypatch.setattr(lean_module.LeanModel, "block_product", spy)
    prompt = torch.randint(4, target.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    eagle3_generate(target, head, prompt, k=2, max_new_tokens=6)
    assert {id(head.fc), id(head.q), id(head.lm_head), id(head.down)} <= seen
    seen.clear()
    cost_ratios(target, head, prompt, ks=[2], repeats=1)
    assert {id(head.fc), id(head.q), id(head.lm_head)} <= seen


def test_the_ttt_loss_by_hand_for_two_steps(target):
    head = randomised(head_for_target(target, LAYERS, torch.arange(4, 40)), seed=8)
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12, 13], [14, 15, 16])]
    items = target_aux_rows(target, rows, LAYERS)
    s = shifted3(items)
    emb_w, full_w = target.model.embed_tokens.weight, target.lm_head.weight
    loss, parts = eagle3_loss(head, s, emb_w, full_w, steps=2, decay=0.5, on="completion")
    outs = head.ttt(F.embedding(s.next_ids, emb_w), head.fuse(s.aux), s.pos, 2)
    total = 0.0
    for j in range(2):
        terms = []
        for b, (prompt, completion) in enumerate(rows):
            for t in range(len(prompt) + len(completion) - 1):
                start = t - j  # the slot whose real features start the chain
                if start < len(prompt) - 1 or t < len(prompt) - 1:
                    continue
                p = torch.softmax(items[b]["h"][t + 1] @ full_w[4:40].T, -1)
                logq = torch.log_softmax(head.logits(outs[j][b, t]), -1)
                terms.append(-(p * logq).sum())
        ce = torch.stack(terms).mean()
        assert parts[f"ce{j + 1}"] == pytest.approx(float(ce), rel=1e-5)
        total = total + 0.5 ** j * ce
    assert float(loss) == pytest.approx(float(total), rel=1e-5)
    assert torch.equal(chain_mask(torch.tensor([[True, True, False, True]]), 1), torch.tensor([[False, True, False,
                                                                                                 False]]))


def test_the_training_rows_features_without_the_argmax_give_the_same_loss(target):
    """The training rows' features are computed without the target's argmax over its full head (top=False: the
    loss reads the final features, only the held-out figures read the argmax): the features are those of the full
    pass, the argmax slots are -1, the loss and its gradients are the same."""
    head = randomised(head_for_target(target, LAYERS, torch.arange(4, 40)), seed=8)
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12, 13], [14, 15, 16])]
    full, bare = target_aux_rows(target, rows, LAYERS), target_aux_rows(target, rows, LAYERS, top=False)
    assert all("top" in it for it in full) and all("top" not in it for it in bare)
    for a, b in zip(full, bare):
        assert torch.equal(a["aux"], b["aux"]) and torch.equal(a["h"], b["h"]) and torch.equal(a["ids"], b["ids"])
    s_full, s_bare = shifted3(full), shifted3(bare)
    assert (s_bare.top_next == -1).all() and (s_full.top_next[s_full.valid] >= 0).all()
    emb_w, full_w = target.model.embed_tokens.weight, target.lm_head.weight
    grads = []
    for s in (s_full, s_bare):
        head.zero_grad()
        loss, _ = eagle3_loss(head, s, emb_w, full_w, steps=2, decay=0.5, on="completion")
        loss.backward()
        grads.append((float(loss), [p.grad.clone() for p in head.parameters() if p.grad is not None]))
    assert grads[0][0] == grads[1][0] and len(grads[0][1]) == len(grads[1][1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_the_completion_window_computes_what_the_whole_rows_do_where_the_loss_reads(target):
    """Training on the completion's slots runs the unrolled steps there only (``ttt_window``): at those slots each
    step's output equals the whole-row ``ttt``'s, and the loss and every gradient equal the whole-row path's — for
    rows whose prompts and completions differ in length (a short completion's extra window slots masked)."""
    head = randomised(head_for_target(target, LAYERS, torch.arange(4, 60)), seed=11)
    rows = [([5, 6, 7, 8, 9], [10, 11, 12, 13]), ([12, 13], [14, 15, 16, 17, 18, 19]), ([20, 21, 22], [23, 24])]
    s = shifted3(target_aux_rows(target, rows, LAYERS))
    emb_w, full_w = target.model.embed_tokens.weight, target.lm_head.weight
    window, s_w = completion_window(s)
    assert window.shape == (3, 6) and window[0, 0] == 4 and window[1, 0] == 1 and window[2, 0] == 2
    assert s_w.completion.sum(1).tolist() == [4, 6, 2]  # each row's own completion slots, the rest masked
    emb = F.embedding(s.next_ids, emb_w)
    whole = head.ttt(emb, head.fuse(s.aux), s.pos, 3)
    windowed = head(s.aux, emb, s.pos, 3, window)
    for j in range(3):
        m = chain_mask(s_w.valid & s_w.completion, j)
        at = window[m]  # the absolute slots of the scored window slots
        rows_m = torch.arange(3)[:, None].expand_as(window)[m]
        torch.testing.assert_close(windowed[j][m], whole[j][rows_m, at], rtol=1e-5, atol=1e-5)

    def grads(loss):
        head.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in head.parameters()]

    loss_w, parts_w = eagle3_loss(head, s, emb_w, full_w, steps=3, decay=0.8, on="completion")
    loss, parts = ttt_loss(head, head.ttt(emb, head.fuse(s.aux), s.pos, 3), s, full_w, 0.8, "completion")
    assert float(loss_w) == pytest.approx(float(loss), rel=1e-5) and parts_w == pytest.approx(parts, rel=1e-5)
    for gw, g in zip(grads(loss_w), grads(loss)):
        torch.testing.assert_close(gw, g, rtol=1e-4, atol=1e-6)


def test_d2t_and_t2d_round_trip(target):
    vocab = torch.tensor([0, 3, 4, 10, 63])
    head = head_for_target(target, LAYERS, vocab)
    d2t, t2d = head.d2t(), head.t2d()
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (target.config.vocab_size,)
    assert torch.equal(torch.arange(5) + d2t, vocab)
    assert torch.equal(t2d.nonzero()[:, 0], vocab)
    with pytest.raises(ValueError, match="sorted distinct"):
        head_for_target(target, LAYERS, torch.tensor([3, 2]))
    with pytest.raises(ValueError, match="3 of the target's layers"):
        head_for_target(target, [0, 1, 9])


def test_the_folder_is_speculators_format_and_reads_back_equal(target, tmp_path):
    vocab = torch.arange(4, 50)
    head = randomised(head_for_target(target, LAYERS, vocab), seed=9)
    save_eagle3(tmp_path / "head", head, verifier="/models/target", verifier_architectures=["LlamaForCausalLM"], k=3,
                step=7)
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    # the rules vLLM's SpeculatorsConfig.validate_speculators_config and speculators' Eagle3SpeculatorConfig read
    assert cfg["speculators_model_type"] == "eagle3" and isinstance(cfg["transformer_layer_config"], dict)
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": "/models/target",
                                                     "architectures": ["LlamaForCausalLM"]}
    assert cfg["draft_vocab_size"] == 46 and cfg["target_hidden_size"] == target.config.hidden_size
    assert cfg["eagle_aux_hidden_state_layer_ids"] == LAYERS
    assert {k: cfg[k] for k in NORM_FLAGS} == NORM_FLAGS  # every flag written: vLLM's and speculators' defaults differ
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "head" / "model.safetensors")))
    assert {"fc.weight", "layers.0.hidden_norm.weight", "layers.0.self_attn.q_proj.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names and "embed_tokens.weight" not in names
    assert is_eagle3_dir(tmp_path / "head") and not is_eagle3_dir(tmp_path)
    back = load_eagle3(tmp_path / "head", target)
    assert torch.equal(back.vocab, head.vocab)
    for name, value in head.weights().items():
        assert torch.equal(value, back.weights()[name]), name
    with pytest.raises(ValueError, match="this target has"):
        load_eagle3(tmp_path / "head", make_model("llama", seed=1, layers=4, hidden=64))


def test_serving_picks_eagle3_for_the_folder(target, tmp_path):
    from draftsmith.serve.server import speculative_method

    save_eagle3(tmp_path / "h", head_for_target(target, LAYERS), verifier="t", verifier_architectures=["X"], k=2)
    assert speculative_method(tmp_path / "h") == "eagle3"


def trained_head(target, steps=120, seed=0, layers=LAYERS, vocab=None, ttt=3):
    """A head trained with the training-time test on the target's own greedy continuations (so it agrees often)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(24):
        prompt = torch.randint(4, target.config.vocab_size, (1, 4), generator=gen)
        out = autoregressive_generate(target, prompt, max_new_tokens=16).sequences[0].tolist()
        rows.append((out[:4], out[4:]))
    head = head_for_target(target, layers, vocab)  # layers None: vLLM's default
    items = target_aux_rows(target, rows, head.layers)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    emb_w, full_w = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    torch.manual_seed(seed)
    for step in range(steps):
        batch = [items[i] for i in torch.randperm(len(items))[:8].tolist()]
        loss, _ = eagle3_loss(head, shifted3(batch), emb_w, full_w, ttt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval(), items


@pytest.fixture(scope="module")
def good(target):
    return trained_head(target)


def test_training_raises_agreement_at_every_position(target, good):
    head, items = good
    fresh = head_for_target(target, LAYERS)
    emb_w, full_w = target.model.embed_tokens.weight, target.lm_head.weight
    before = heldout_metrics(fresh, items, emb_w, full_w, 3, 8)
    after = heldout_metrics(head, items, emb_w, full_w, 3, 8)
    assert after["heldout/loss"] < before["heldout/loss"]
    assert after["heldout/acceptance_length"] > before["heldout/acceptance_length"] + 0.3
    assert after["heldout/agreement_at_2"] > 0.3 and after["heldout/agreement_at_3"] > 0.3
    reach = [after["heldout/top1_agreement"]]
    for j in (2, 3):
        reach.append(reach[-1] * after[f"heldout/agreement_at_{j}"])
    assert after["heldout/acceptance_length"] == pytest.approx(sum(reach), rel=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_output_equals_the_targets_own(target, good, k):
    head, _ = good
    gen = torch.Generator().manual_seed(100)
    deep = 0
    for _ in range(6):
        prompt = torch.randint(4, target.config.vocab_size, (1, 5), generator=gen)
        want = autoregressive_generate(target, prompt, max_new_tokens=20).sequences
        out = eagle3_generate(target, head, prompt, k=k, max_new_tokens=20)
        assert torch.equal(out.sequences, want)
        assert out.stats.new_tokens == 20 and out.stats.draft_backend == "eagle3"
        deep += out.stats.accepted_per_position[k - 1]
        assert torch.equal(eagle3_generate(target, head, prompt, k=k, max_new_tokens=2).sequences, want[:, :7])
    assert deep > 0  # the last proposal of a round is accepted sometimes: the speculative slots' path runs


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_decoder_targets_train_and_decode_equal(arch):
    """The head's layer is its own: a Qwen2 (biases), Qwen3 (q/k norms) or Mistral target trains a head whose
    proposals are accepted, and greedy output stays the target's; a reduced draft vocabulary maps through d2t."""
    tgt = make_model(arch, seed=2, layers=4)
    head, items = trained_head(tgt, steps=80, vocab=torch.arange(3, tgt.config.vocab_size))
    gen = torch.Generator().manual_seed(5)
    accepted = 0
    for _ in range(4):
        prompt = torch.randint(4, tgt.config.vocab_size, (1, 5), generator=gen)
        want = autoregressive_generate(tgt, prompt, max_new_tokens=16).sequences
        out = eagle3_generate(tgt, head, prompt, k=3, max_new_tokens=16)
        assert torch.equal(out.sequences, want)
        accepted += out.stats.accepted
    assert accepted > 0


def test_greedy_with_a_random_head_a_small_vocabulary_and_eos(target):
    head = randomised(head_for_target(target, LAYERS, torch.tensor([4, 8, 15, 16, 23, 42])), seed=11)
    prompt = torch.tensor([[5, 9, 13, 2, 40]])
    want = autoregressive_generate(target, prompt, max_new_tokens=16).sequences
    for k in (1, 3):
        assert torch.equal(eagle3_generate(target, head, prompt, k=k, max_new_tokens=16).sequences, want)
    eos = int(want[0, 5 + 6])
    want_eos = autoregressive_generate(target, prompt, max_new_tokens=16, eos_token_id=eos).sequences
    assert torch.equal(eagle3_generate(target, head, prompt, k=2, max_new_tokens=16, eos_token_id=eos).sequences,
                       want_eos)


@pytest.mark.parametrize("k", [1, 3])
def test_sampling_follows_the_targets_distribution(k):
    """Rejection sampling with the head's q (zero outside its draft vocabulary): the joint of the first new tokens
    on an 8-token target is the target's (chi-square; the same statistic rejects a loop that skips verification)."""
    from test_sampling_distribution import PROMPT, chi_square_p, exact_first, pair, sample_first

    small = make_model("llama", seed=3, layers=4, hidden=16, vocab_size=8)
    with torch.no_grad():
        small.lm_head.weight.mul_(0.5)
    head, _ = trained_head(small, steps=60, seed=2, vocab=torch.arange(1, 8))
    exact = exact_first(small, PROMPT, 1.0, 0, 1.0)

    def run(g):
        return eagle3_generate(small, head, PROMPT, k=k, max_new_tokens=k + 2, temperature=1.0, generator=g)

    counts, stats = sample_first(run, n=3000, seed=0)
    assert sum(s.accepted_per_position[0] for s in stats) > 300
    assert chi_square_p(counts, exact) > 1e-3
    assert chi_square_p(pair(counts, 0), pair(exact, 0)) > 1e-3 and chi_square_p(pair(counts, 1), pair(exact, 1)) > 1e-3
    import draftsmith.decode.loop as loop

    def keep_all(drafts, q, p, generator):
        return drafts.shape[0], int(torch.multinomial(p[drafts.shape[0]], 1, generator=generator))

    original, loop.verify_sampling = loop.verify_sampling, keep_all
    try:
        broken, _ = sample_first(run, n=3000, seed=0)
    finally:
        loop.verify_sampling = original
    assert chi_square_p(broken, exact) < 1e-6


class ScriptedHead(torch.nn.Module):
    """A stand-in whose step-j proposal at each slot is given by hand (its logits: one-hot rows over a 4-id draft
    vocabulary = target ids 0..3), for heldout_metrics' chain arithmetic."""

    def __init__(self, proposals):
        super().__init__()
        self.proposals = proposals  # [steps][T] target ids
        self.vocab = torch.arange(4)
        self.norm = torch.nn.Parameter(torch.ones(1))
        self.lm_head = torch.nn.Parameter(torch.ones(1))

    def forward(self, aux, emb, pos, steps):
        return [F.one_hot(torch.tensor([p]), 4).float() for p in self.proposals[:steps]]

    def logits(self, out):
        return out * 10.0


def test_heldout_chains_count_what_greedy_decoding_accepts():
    """Slots 0..5 of one row (prompt of 1 token: every slot a round start). The target's argmax at slot s is top[s];
    step j at slot s is right where it proposes top[s]. Round r accepts proposal j+1 when steps 0..j are right at
    r..r+j, and (from step 1 on) the row's token at r+j is what greedy decoding would have put there."""
    top = [1, 2, 3, 1, 2, 3]  # the target's argmax at each slot (for x_{s+2})
    ids = [0, 0, 1, 2, 3, 1, 0]  # x_0 .. x_6; slot s reads x_{s+1}: greedy rows have x_{s+2} == top[s]
    #  ... except x_6 = 0 != top[4] = 2: slot 5's token is not greedy
    steps = [[1, 2, 3, 1, 2, 3],   # step 0 right everywhere
             [0, 2, 0, 1, 0, 3],   # step 1 right at slots 1, 3, 5
             [0, 0, 3, 1, 0, 0]]   # step 2 right at slots 2, 3
    item = {"ids": torch.tensor(ids), "aux": torch.zeros(7, 3), "h": torch.zeros(7, 2), "prompt_len": 1,
            "top": torch.tensor([0] + top)}
    emb_w, full_w = torch.zeros(4, 2), torch.zeros(4, 2)
    m = heldout_metrics(ScriptedHead(steps), [item], emb_w, full_w, steps=3, batch_size=1)
    # rounds from slots 0..5 (6), 0..4 (5), 0..3 (4) for proposals 1, 2, 3
    # proposal 2 (step 1 at r+1): r=0 (slot 1 right, x_2 greedy), r=2 (slot 3), r=4 (slot 5 right but x_6 not greedy)
    # proposal 3 (step 2 at r+2): r=0 needs step 2 at slot 2: right -> chain 0,1,2 all right; r=2 needs slot 4: wrong
    assert m["heldout/top1_agreement"] == pytest.approx(6 / 6)
    assert m["heldout/agreement_at_2"] == pytest.approx((2 / 5) / 1.0)
    assert m["heldout/agreement_at_3"] == pytest.approx((1 / 4) / (2 / 5))
    assert m["heldout/acceptance_length"] == pytest.approx(1 + 2 / 5 + 1 / 4)
