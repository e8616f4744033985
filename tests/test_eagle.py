"""The EAGLE-1 head (decode/eagle.py, trained by train/eagle.py): its arithmetic is a Llama decoder layer's as vLLM
runs it, its second proposal reads its own output where a decode round does, its checkpoint is vLLM's layout,
serving picks ``method: eagle`` for it, and the decode loop driving it (decode/loop.py ``eagle_generate``) keeps
the target's greedy output and its sampling distribution."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from conftest import make_model
from draftsmith.decode import autoregressive_generate, eagle_generate
from draftsmith.decode.eagle import EAGLE_ARCH, EagleHead, EagleRunner, is_eagle_dir, load_eagle, save_eagle
from draftsmith.serve.server import ServerSpec, speculative_config, speculative_method
from draftsmith.train.eagle import eagle_loss, shifted, target_features


@pytest.fixture(scope="module")
def target():
    return make_model("llama", seed=1, layers=2)


def randomised(head: EagleHead, seed: int = 0) -> EagleHead:
    """`head` with every weight random (its start, fc = [0 | I] and shrunk writes, would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return head


def inputs(target, b=2, t=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, target.config.vocab_size, (b, t), generator=gen)
    emb = F.embedding(ids, target.model.embed_tokens.weight)
    h = torch.randn(b, t, target.config.hidden_size, generator=gen)
    pos = torch.arange(t).unsqueeze(0).expand(b, t)
    return emb, h, pos


def test_forward_is_a_llama_decoder_layer_without_its_input_norm_over_fc(target):
    """vLLM's EagleLlamaForCausalLM: fc(cat(embed, h)) -> LlamaDecoderLayer (input_layernorm = identity) ->
    hidden + residual. transformers' own layer, given the head's weights, must compute the same."""
    head = randomised(EagleHead(target))
    emb, h, pos = inputs(target)
    got, _ = head(emb, h, pos)
    layer = LlamaDecoderLayer(target.config, layer_idx=0)
    sd = {f"{name.removeprefix('layers.0.')}": w for name, w in head.weights().items() if name.startswith("layers.0.")}
    missing = layer.load_state_dict(sd, strict=False).missing_keys
    assert missing == ["input_layernorm.weight"]
    layer.input_layernorm = torch.nn.Identity()
    x = F.linear(torch.cat([emb, h], -1), head.fc)
    t = x.shape[1]
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=target.model.rotary_emb(x, pos))
    want = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_start_is_near_the_feature_itself(target):
    """fc = [0 | I] and the residual writes at a tenth: the untrained head's output is h plus a small step."""
    head = EagleHead(target)
    emb, h, pos = inputs(target)
    out, _ = head(emb, h, pos)
    assert torch.equal(head.fc[:, : head.h], torch.zeros(head.h, head.h))
    assert ((out - h).norm() / h.norm()) < 0.5


def test_second_reads_its_own_feature_at_each_position_and_real_keys_before_it(target):
    """`second` at position i equals a plain forward over positions 0..i whose feature at i is the head's own
    (h_own[i]) and whose earlier features are real: what a decode round's second proposal computes."""
    head = randomised(EagleHead(target), seed=2)
    emb, h, pos = inputs(target, b=2, t=6, seed=3)
    h_own = torch.randn(h.shape, generator=torch.Generator().manual_seed(4))
    _, kv = head(emb, h, pos)
    got = head.second(emb, h_own, pos, kv)
    for i in range(6):
        mixed = h[:, : i + 1].clone()
        mixed[:, i] = h_own[:, i]
        want, _ = head(emb[:, : i + 1], mixed, pos[:, : i + 1])
        torch.testing.assert_close(got[:, i], want[:, i], rtol=1e-5, atol=1e-5)
    plain, _ = head(emb, h, pos)
    assert not torch.allclose(got[:, 1:], plain[:, 1:], atol=1e-3)  # the substitution is not a no-op


def test_checkpoint_is_vllms_layout_and_round_trips(target, tmp_path):
    head = randomised(EagleHead(target), seed=5)
    out = save_eagle(tmp_path / "eagle", head, steps=3)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [EAGLE_ARCH] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == target.config.hidden_size and config["vocab_size"] == target.config.vocab_size
    from safetensors.torch import load_file

    names = set(load_file(str(out / "model.safetensors")))
    assert "fc.weight" in names and "layers.0.self_attn.q_proj.weight" in names
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # vLLM shares the target's
    assert json.loads((out / "draftsmith_eagle.json").read_text()) == {"kind": "eagle", "steps": 3}
    again = load_eagle(out, target)
    emb, h, pos = inputs(target)
    torch.testing.assert_close(again(emb, h, pos)[0], head(emb, h, pos)[0])
    assert is_eagle_dir(out) and not is_eagle_dir(tmp_path)
    with pytest.raises(ValueError, match="not an EAGLE head"):
        load_eagle(tmp_path, target)


def test_serving_picks_the_method_from_the_checkpoint(target, tmp_path):
    eagle = save_eagle(tmp_path / "eagle", EagleHead(target))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    e3 = tmp_path / "e3"
    e3.mkdir()
    (e3 / "config.json").write_text(json.dumps({"architectures": ["Eagle3LlamaForCausalLM"]}))
    assert speculative_method(eagle) == "eagle"
    assert speculative_method(plain) == "draft_model" and speculative_method("org/some-hub-id") == "draft_model"
    assert speculative_method(e3) == "eagle3"
    assert speculative_config(str(eagle), 2) == {"model": str(eagle), "method": "eagle", "num_speculative_tokens": 2}
    sched = speculative_config(str(eagle), None, [[1, 2, 2], [3, 8, 1]])
    assert sched["method"] == "eagle" and sched["num_speculative_tokens"] == 2
    cmd = ServerSpec(model="t", draft=str(eagle), k=3).command(8000)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "eagle"


def test_a_registered_eagle_head_is_served_as_one(target, tmp_path):
    """The registry writes a version's speculative_config.json before the version's folder exists: the method must
    come from the head's files, not from the (still absent) final path."""
    from draftsmith.registry import LocalRegistry

    eagle = save_eagle(tmp_path / "eagle", EagleHead(target))
    promotion = {"promote": True, "candidate": {"best_k": 1, "speedup": 1.3, "acceptance_rate": 0.55}}
    record = LocalRegistry(tmp_path / "reg").register("smol", eagle, metrics={}, promotion=promotion, k=1)
    config = json.loads((tmp_path / "reg" / "smol" / f"v{record['version']}" / "speculative_config.json").read_text())
    assert config["method"] == "eagle" and config["num_speculative_tokens"] == 1


def test_the_head_takes_the_targets_dtype_and_owns_none_of_its_modules(target, tmp_path):
    half = copy.deepcopy(target).to(torch.bfloat16)
    head = load_eagle(save_eagle(tmp_path / "e", EagleHead(target)), half)
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}
    before = half.model.rotary_emb.inv_freq.dtype
    head.to(torch.float16)
    assert half.model.rotary_emb.inv_freq.dtype == before  # the target's rotary table is not the head's to convert
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.attention_bias = True
    with pytest.raises(ValueError, match="no biases"):  # the layer's real biases, not only the config's flag
        EagleHead(LlamaForCausalLM(config))
    with pytest.raises(ValueError, match="for Llama targets; this target is 'qwen2'"):  # biases without a flag
        EagleHead(make_model("qwen2", layers=1))


def test_target_features_are_the_post_norm_hidden_states_row_by_row(target):
    """Batched and right-padded, each row's features equal a forward over that row alone."""
    rows = [([5, 6, 7], [8, 9]), ([10, 11, 12, 13, 14], [15, 16, 17]), ([20], [21, 22, 23])]
    feats = target_features(target, rows, batch=3)
    for (p, c), f in zip(rows, feats):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            alone = target.model(input_ids=ids).last_hidden_state[0]
            top = target.lm_head(alone).argmax(-1)
        assert f["ids"].tolist() == p + c and f["prompt_len"] == len(p)
        torch.testing.assert_close(f["h"], alone, rtol=1e-5, atol=1e-5)
        assert torch.equal(f["top"], top)


def test_shifted_lays_rows_out_one_slot_per_position_pair():
    h = torch.arange(6 * 2, dtype=torch.float32).view(6, 2)
    item = {"ids": torch.tensor([10, 11, 12, 13, 14, 15]), "h": h, "top": torch.tensor([1, 2, 3, 4, 5, 6]),
            "prompt_len": 3}
    short = {"ids": torch.tensor([20, 21, 22]), "h": h[:3], "top": torch.tensor([7, 8, 9]), "prompt_len": 2}
    s = shifted([item, short])
    assert s.next_ids[0].tolist() == [11, 12, 13, 14, 15]
    assert torch.equal(s.h[0], h[:5]) and torch.equal(s.h_next[0], h[1:])
    assert s.top_next[0].tolist() == [2, 3, 4, 5, 6]
    # P = 3: x_3 comes from the prefill; the first proposal (of x_4) reads (x_3, h_2): slot 2 onwards
    assert s.completion[0].tolist() == [False, False, True, True, True]
    assert s.valid[1].tolist() == [True, True, False, False, False]
    assert s.completion[1].tolist() == [False, True, False, False, False]
    assert s.next_ids[1].tolist()[:2] == [21, 22]


def test_training_on_features_raises_agreement_with_the_target(target):
    """A few hundred steps of eagle_loss on one target's features: the head's top-1 agreement with the target's
    next argmax rises well above the untrained head's (which predicts the current token, not the next)."""
    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(4, 64, (4,), generator=gen).tolist(), torch.randint(4, 64, (8,), generator=gen).tolist())
            for _ in range(8)]
    feats = target_features(target, rows)
    s = shifted(feats)
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = EagleHead(copy.deepcopy(target))
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3)

    def agreement():
        with torch.no_grad():
            out, _ = head(F.embedding(s.next_ids, emb_w), s.h, s.pos)
        return float(((out @ head_w.T).argmax(-1) == s.top_next)[s.valid].float().mean())

    before = agreement()
    for _ in range(300):
        loss, parts = eagle_loss(head, s, emb_w, head_w, w_reg=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert parts["ce"] > 0 and parts["reg"] >= 0
    assert agreement() > max(0.8, before + 0.3)


def test_the_loss_on_completion_slots_is_the_all_slots_loss_of_those_slots_only(target):
    """on="completion" (method.eagle_loss_on): the same cross-entropy and regression, averaged over the completion
    slots alone, computed here by hand from the head's own outputs; prompt slots still feed the head (its outputs
    at completion slots are those of the all-slots forward)."""
    gen = torch.Generator().manual_seed(5)
    rows = [(torch.randint(4, 64, (n,), generator=gen).tolist(), torch.randint(4, 64, (6,), generator=gen).tolist())
            for n in (3, 7)]
    s = shifted(target_features(target, rows))
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = EagleHead(copy.deepcopy(target))
    mask = s.valid & s.completion
    assert 0 < int(mask.sum()) < int(s.valid.sum())
    with torch.no_grad():
        out, _ = head(F.embedding(s.next_ids, emb_w), s.h, s.pos)
        p = torch.softmax(s.h_next[mask] @ head_w.T, -1)
        ce = float(-(p * torch.log_softmax(out[mask] @ head_w.T, -1)).sum(-1).mean())
        reg = float(F.smooth_l1_loss(out[mask], s.h_next[mask]))
        loss, parts = eagle_loss(head, s, emb_w, head_w, w_reg=0.5, on="completion")
        _, every = eagle_loss(head, s, emb_w, head_w, w_reg=0.5)
    assert parts["ce"] == pytest.approx(ce, rel=1e-5) and parts["reg"] == pytest.approx(reg, rel=1e-5)
    assert float(loss) == pytest.approx(ce + 0.5 * reg, rel=1e-5)
    assert every["ce"] != pytest.approx(ce, rel=1e-3)  # the prompt slots were left out
    # the second proposal at slot t reads the first's output at t-1: scored where both slots are completion slots
    with torch.no_grad():
        out, kv = head(F.embedding(s.next_ids, emb_w), s.h, s.pos)
        own = torch.zeros_like(out)
        own[:, 1:] = out[:, :-1]
        out2 = head.second(F.embedding(s.next_ids, emb_w), own, s.pos, kv)
        later = torch.zeros_like(mask)
        later[:, 1:] = mask[:, 1:] & mask[:, :-1]
        assert int(later.sum()) == int(mask.sum()) - len(rows)  # each row's first completion slot has none before
        p2 = torch.softmax(s.h_next[later] @ head_w.T, -1)
        ce2 = float(-(p2 * torch.log_softmax(out2[later] @ head_w.T, -1)).sum(-1).mean())
        _, with_second = eagle_loss(head, s, emb_w, head_w, w_reg=0.5, second=1.0, on="completion")
    assert with_second["ce2"] == pytest.approx(ce2, rel=1e-5)
    # a batch whose rows have no completion slot (cut off by method.max_len) scores nothing: zero, not NaN
    s.completion[:] = False
    empty, parts0 = eagle_loss(head, s, emb_w, head_w, second=1.0, on="completion")
    assert float(empty) == 0.0 and parts0 == {"ce": 0.0, "reg": 0.0, "ce2": 0.0}
    empty.backward()  # a graph to step through: every process of a data-parallel run takes part
    with pytest.raises(ValueError, match="on='prompt'"):
        eagle_loss(head, s, emb_w, head_w, on="prompt")


def test_noise_jitters_the_features_the_head_reads_within_its_bound_and_not_its_targets(target):
    """method.eagle_noise (EAGLE-1's augmentation): the head reads h + U[-noise, noise] (each entry moved, none by
    more than the bound), while the teacher and the regression target stay the clean h_{t+1}: the loss equals
    the clean-input loss of a head fed those jittered features; noise 0 is the loss without it."""
    gen = torch.Generator().manual_seed(7)
    rows = [(torch.randint(4, 64, (4,), generator=gen).tolist(), torch.randint(4, 64, (5,), generator=gen).tolist())
            for _ in range(2)]
    s = shifted(target_features(target, rows))
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = EagleHead(copy.deepcopy(target))
    seen = []
    real_forward = head.forward

    def spy(emb, h, pos, *args, **kwargs):
        seen.append(h.detach().clone())
        return real_forward(emb, h, pos, *args, **kwargs)

    head.forward = spy
    with torch.no_grad():
        clean, _ = eagle_loss(head, s, emb_w, head_w, w_reg=0.5)
        assert float(eagle_loss(head, s, emb_w, head_w, w_reg=0.5, noise=0.0)[0]) == float(clean)
        torch.manual_seed(0)
        noisy, _ = eagle_loss(head, s, emb_w, head_w, w_reg=0.5, noise=0.25)
    jitter = seen[-1] - s.h
    assert 0 < float(jitter.abs().max()) <= 0.25 and bool((jitter != 0).all())
    assert float(jitter.abs().max()) > 0.2  # spread over the bound, not a tiny constant
    assert float(noisy) != pytest.approx(float(clean), rel=1e-4)
    # the same loss by hand: the jittered features in, the clean next features as teacher and regression target
    with torch.no_grad():
        out, _ = real_forward(F.embedding(s.next_ids, emb_w), seen[-1], s.pos)
        p = torch.softmax(s.h_next[s.valid] @ head_w.T, -1)
        ce = float(-(p * torch.log_softmax(out[s.valid] @ head_w.T, -1)).sum(-1).mean())
        reg = float(F.smooth_l1_loss(out[s.valid], s.h_next[s.valid]))
    assert float(noisy) == pytest.approx(ce + 0.5 * reg, rel=1e-5)


def test_under_bf16_autocast_the_loss_is_the_float32_one_rounded_and_its_targets_stay_float32(target):
    """method.mixed_precision=bf16 runs the head's products in bf16 (faster per step on a CPU with AMX); the
    teacher's distribution is computed in float32 regardless (rounded targets would be learned), and the loss
    moves only by the products' rounding."""
    from draftsmith.train import eagle as eagle_mod

    gen = torch.Generator().manual_seed(3)
    rows = [(torch.randint(4, 64, (4,), generator=gen).tolist(), torch.randint(4, 64, (8,), generator=gen).tolist())
            for _ in range(4)]
    s = shifted(target_features(target, rows))
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = EagleHead(copy.deepcopy(target))
    teachers = []
    real = eagle_mod._teacher
    eagle_mod_teacher = lambda h, w: teachers.append(real(h, w)) or teachers[-1]  # noqa: E731
    try:
        eagle_mod._teacher = eagle_mod_teacher
        full, full_parts = eagle_loss(head, s, emb_w, head_w, second=1.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half, half_parts = eagle_loss(head, s, emb_w, head_w, second=1.0)
            direct = (s.h_next[s.valid] @ head_w.T)
    finally:
        eagle_mod._teacher = real
    assert direct.dtype == torch.bfloat16  # autocast was on: an unguarded teacher would be bf16
    assert [t.dtype for t in teachers] == [torch.float32] * 4
    assert torch.equal(teachers[0], teachers[2]) and torch.equal(teachers[1], teachers[3])  # same targets either way
    assert half.dtype == torch.float32
    assert half_parts["ce"] != full_parts["ce"]  # the products did run in bf16
    assert half_parts["ce"] == pytest.approx(full_parts["ce"], rel=2e-2)
    assert half_parts["ce2"] == pytest.approx(full_parts["ce2"], rel=2e-2)
    assert half_parts["reg"] == pytest.approx(full_parts["reg"], rel=5e-2)
    half.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters() if p.requires_grad)


def test_the_second_proposal_term_is_the_cross_entropy_of_second(target):
    """eagle_loss(second=w) adds w x the soft cross-entropy of EagleHead.second fed the head's own outputs, at
    every real slot but the first, and its gradient reaches the head through both passes."""
    gen = torch.Generator().manual_seed(1)
    rows = [(torch.randint(4, 64, (3,), generator=gen).tolist(), torch.randint(4, 64, (5,), generator=gen).tolist())
            for _ in range(3)]
    s = shifted(target_features(target, rows))
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = randomised(EagleHead(target), seed=6)
    base, parts0 = eagle_loss(head, s, emb_w, head_w, w_reg=0.5)
    both, parts = eagle_loss(head, s, emb_w, head_w, w_reg=0.5, second=2.0)
    emb = F.embedding(s.next_ids, emb_w)
    out, kv = head(emb, s.h, s.pos)
    own = torch.zeros_like(out)
    own[:, 1:] = out[:, :-1]
    out2 = head.second(emb, own, s.pos, kv)
    mask = s.valid.clone()
    mask[:, 0] = False
    teacher = torch.softmax(s.h_next[mask] @ head_w.T, -1)
    ce2 = -(teacher * torch.log_softmax(out2[mask] @ head_w.T, -1)).sum(-1).mean()
    torch.testing.assert_close(both, base + 2.0 * ce2)
    assert parts["ce2"] == pytest.approx(float(ce2.detach())) and "ce2" not in parts0
    both.backward()
    assert head.fc.grad is not None and head.fc.grad.abs().sum() > 0


# -- the head in the decode loop ---------------------------------------------------------------------
def trained_head(target, steps=300, seed=0):
    """A head trained on `target`'s own greedy continuations of random prompts: it agrees often, so the loop's
    acceptance paths (partial and full acceptance, the bonus token) all run."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(12):
        prompt = torch.randint(4, target.config.vocab_size, (1, 4), generator=gen)
        out = autoregressive_generate(target, prompt, max_new_tokens=10)
        rows.append((prompt[0].tolist(), out.sequences[0, 4:].tolist()))
    s = shifted(target_features(target, rows))
    emb_w, head_w = target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    head = EagleHead(target)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss, _ = eagle_loss(head, s, emb_w, head_w, w_reg=0.1, second=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def good_head(target):
    return trained_head(target)


@pytest.mark.parametrize("form", ["F.linear", "weight-first", "padded"])
def test_the_runner_computes_the_heads_forward_incrementally(target, form):
    """Slots fed in blocks and one at a time, with a crop and a re-feed, give EagleHead.forward's outputs, with each
    of the lean forward's product forms (``products``, what a decode hands the runner), through a cache that keeps
    the KV heads grouped and grows past its first capacity (16 slots)."""
    from draftsmith.decode.lean import product

    head = randomised(EagleHead(target), seed=7)
    emb, h, pos = inputs(target, b=1, t=20, seed=8)
    ids = torch.randint(4, target.config.vocab_size, (20,), generator=torch.Generator().manual_seed(9))
    emb = F.embedding(ids, target.model.embed_tokens.weight).unsqueeze(0)
    want, _ = head(emb, h, pos)
    products = lambda t: product(form, t)  # noqa: E731
    runner = EagleRunner(head, target.model.embed_tokens.weight, target.lm_head.weight, capacity=4, products=products)
    assert runner.k.shape[1:3] == (head.nkv, 16) and head.nkv < head.nh
    with torch.no_grad():
        a = runner.forward(ids[:12], h[0, :12])
        runner.forward(ids[12:14], h[0, 12:14] + 1.0)  # a wrong guess, rolled back
        runner.crop(12)
        b = runner.forward(ids[12:13], h[0, 12:13])
        c = runner.forward(ids[13:], h[0, 13:])  # past 16 slots: the cache and the rotary table grow
    assert runner.k.shape[2] > 16
    torch.testing.assert_close(torch.cat([a, b, c]), want[0], rtol=1e-4, atol=1e-4)  # float rounding of the forms
    assert len(runner) == 20 and runner.forwards == 4
    logits = runner.logits(c)
    torch.testing.assert_close(logits, c @ target.lm_head.weight.T, rtol=1e-5, atol=1e-5)
    vocab = torch.tensor([4, 9, 17, 30])
    sub = EagleRunner(head, target.model.embed_tokens.weight, target.lm_head.weight, 16, vocab=vocab,
                      products=products).logits(c)
    assert torch.isinf(sub[:, 5]).all()
    torch.testing.assert_close(sub[:, vocab], logits[:, vocab], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_output_equals_the_targets_own(target, good_head, k):
    gen = torch.Generator().manual_seed(100)  # the same prompts at every K
    full = 0
    for _ in range(8):
        prompt = torch.randint(4, target.config.vocab_size, (1, 5), generator=gen)
        want = autoregressive_generate(target, prompt, max_new_tokens=20).sequences
        out = eagle_generate(target, good_head, prompt, k=k, max_new_tokens=20)
        assert torch.equal(out.sequences, want)
        assert out.stats.new_tokens == 20 and out.stats.draft_backend == "eagle"
        full += out.stats.accepted_per_position[min(k, 2) - 1]
        short = eagle_generate(target, good_head, prompt, k=k, max_new_tokens=2)  # its one round drafts 1 (or 0)
        assert torch.equal(short.sequences, want[:, :7])
    # K=1: whole blocks accepted (the bonus path); K >= 2: second proposals accepted (a speculative slot's path; the
    # test head is trained for two proposals, not three)
    assert full > 0


@torch.no_grad()
def test_k1_rounds_accept_exactly_what_the_head_predicts_teacher_forced(target, good_head):
    """Greedy output equals the target's whatever a loop proposes; which proposals it accepts does not. At K=1 a
    round with n tokens known proposes from slot n-2 = (x_{n-1}, h_{n-2}), real features only, so its proposal is the
    teacher-forced head's prediction over the final sequence: replaying the rounds from those predictions gives the
    decode's rounds, accepted drafts and draft forwards exactly (a loop that fed a feature one slot off, or kept a
    rejected slot, accepts other tokens)."""
    gen = torch.Generator().manual_seed(7)
    emb_w = target.model.embed_tokens.weight
    checked = accepted_any = rejected_any = 0
    for _ in range(6):
        prompt = torch.randint(4, target.config.vocab_size, (1, 5), generator=gen)
        p, new = prompt.shape[1], 16
        out = eagle_generate(target, good_head, prompt, k=1, max_new_tokens=new)
        seq = out.sequences
        h = target.model(input_ids=seq).last_hidden_state  # h_0 .. h_{L-1}
        hidden, _ = good_head(F.embedding(seq[:, 1:], emb_w), h[:, :-1], torch.arange(seq.shape[1] - 1)[None])
        pred = (hidden @ target.lm_head.weight.T).argmax(-1)[0]  # pred[t]: slot t's proposal, for x_{t+2}
        n, rounds, accepted, forwards = p + 1, 0, 0, 0
        while n < p + new:
            rounds += 1
            if n == p + new - 1:  # one token left: the round verifies no draft (k_r 0)
                n += 1
                continue
            forwards += 1
            hit = int(pred[n - 2]) == int(seq[0, n])
            accepted += hit
            n += 2 if hit else 1
        assert (out.stats.rounds, out.stats.accepted, out.stats.draft_forwards) == (rounds, accepted, forwards)
        checked += 1
        accepted_any += accepted > 0
        rejected_any += accepted < forwards
    assert checked == 6 and accepted_any and rejected_any  # both paths replayed


def test_greedy_with_a_random_head_a_draft_vocabulary_and_eos(target):
    """A head that agrees with nothing, a reduced draft vocabulary and an EOS stop: still the target's output."""
    head = randomised(EagleHead(target), seed=11)
    prompt = torch.tensor([[5, 9, 13, 2, 40]])
    want = autoregressive_generate(target, prompt, max_new_tokens=16).sequences
    vocab = torch.arange(4, 40)
    for k in (1, 3):
        assert torch.equal(eagle_generate(target, head, prompt, k=k, max_new_tokens=16, draft_vocab=vocab).sequences,
                           want)
    eos = int(want[0, 5 + 6])  # the 7th new token: decoding stops there
    want_eos = autoregressive_generate(target, prompt, max_new_tokens=16, eos_token_id=eos).sequences
    got = eagle_generate(target, head, prompt, k=2, max_new_tokens=16, eos_token_id=eos).sequences
    assert torch.equal(got, want_eos) and got.shape[1] <= 5 + 7
    assert eagle_generate(target, head, prompt, k=2, max_new_tokens=1).sequences.shape[1] == 6


def test_a_target_the_lean_forward_does_not_cover_is_refused(good_head):
    from draftsmith.artifacts.errors import ConfigError

    with pytest.raises(ConfigError):
        eagle_generate(make_model("gpt2", layers=1), good_head, torch.tensor([[5, 6, 7]]), k=1, max_new_tokens=4)


@pytest.mark.parametrize("k", [1, 2])
def test_sampling_follows_the_targets_distribution(k):
    """Rejection sampling with the head's q: the joint of the first three new tokens on an 8-token Llama target is
    the target's (chi-square, as tests/test_sampling_distribution.py, whose power test covers this statistic)."""
    from test_sampling_distribution import PROMPT, chi_square_p, exact_first, pair, sample_first

    small = make_model("llama", seed=3, layers=1, hidden=16, vocab_size=8)
    with torch.no_grad():
        small.lm_head.weight.mul_(0.5)  # every token has mass, and the head's q is far enough from p to be seen
    head = trained_head(small, steps=60, seed=2)
    exact = exact_first(small, PROMPT, 1.0, 0, 1.0)
    counts, stats = sample_first(lambda g: eagle_generate(small, head, PROMPT, k=k, max_new_tokens=k + 2,
                                                          temperature=1.0, generator=g), n=3000, seed=0)
    assert all(s.drafted_per_position[k - 1] == 1 for s in stats)
    assert sum(s.accepted_per_position[0] for s in stats) > 300  # the head's tokens are often kept
    assert chi_square_p(counts, exact) > 1e-3
    assert chi_square_p(pair(counts, 0), pair(exact, 0)) > 1e-3 and chi_square_p(pair(counts, 1), pair(exact, 1)) > 1e-3
    # power: the same statistic rejects a loop that keeps every drafted token (verification skipped)
    import draftsmith.decode.loop as loop

    def keep_all(drafts, q, p, generator):
        return drafts.shape[0], int(torch.multinomial(p[drafts.shape[0]], 1, generator=generator))

    original, loop.verify_sampling = loop.verify_sampling, keep_all
    try:
        broken, _ = sample_first(lambda g: eagle_generate(small, head, PROMPT, k=k, max_new_tokens=k + 2,
                                                          temperature=1.0, generator=g), n=3000, seed=0)
    finally:
        loop.verify_sampling = original
    assert chi_square_p(broken, exact) < 1e-6
