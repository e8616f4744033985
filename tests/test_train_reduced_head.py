"""Training the head on the draft vocabulary (method.reduced_head) and keeping the best held-out draft
(method.keep_best, method.patience)."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model
from draftsmith.artifacts.errors import ConfigError
from draftsmith.train import trainer
from draftsmith.train import distill, loop
from draftsmith.train.checkpoints import latest_checkpoint
from draftsmith.train.data import collate
from draftsmith.train.heads import head_at_loss_positions, positions_in, reduced_head, restrict
from draftsmith.train.losses import divergence_per_position, topk_uniform_tail
from draftsmith.train.distill import batch_loss, loss_logits
from draftsmith.train.settings import TrainConfig

from test_train import cfg, pair_dirs  # noqa: F401 - the module fixture: a tiny pair and its datagen output

WIDTH = 64  # conftest's tiny vocabulary


def rows(seed=0, n=3, k=4):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p, c = int(torch.randint(2, 6, (1,), generator=gen)), int(torch.randint(2, 7, (1,), generator=gen))
        topk = [torch.randperm(WIDTH, generator=gen)[:k].tolist() for _ in range(c)]
        logp = [torch.log_softmax(torch.randn(k + 1, generator=gen), -1)[:k].sort(descending=True).values.tolist()
                for _ in range(c)]
        out.append({"prompt_ids": torch.randint(4, WIDTH, (p,), generator=gen).tolist(),
                    "completion_ids": [t[0] for t in topk], "topk_ids": topk, "topk_logprobs": logp})
    return out


def masked_reference(model, batch, vocab, loss, teacher_logits=None):
    """The full head's loss with the student's logits masked outside `vocab` (a large negative, not -inf, so that
    0 * log 0 stays 0) and the teacher renormalised over `vocab`: what the reduced head must equal."""
    with head_at_loss_positions(model, batch.loss_mask):
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(0).float()
    outside = torch.ones(WIDTH, dtype=torch.bool)
    outside[vocab] = False
    s_logp = torch.log_softmax(full.masked_fill(outside, -1e9), -1)
    mask = batch.loss_mask
    if teacher_logits is None:
        t = topk_uniform_tail(batch.topk_ids[mask], batch.topk_logprobs[mask], WIDTH)
    else:
        t = torch.log_softmax(teacher_logits.float(), -1)
    t = t.masked_fill(outside, -1e9)
    t = t - torch.logsumexp(t, -1, keepdim=True)
    return divergence_per_position(loss, t, s_logp).mean()


@pytest.mark.parametrize("loss", ["fkl", "rkl", "jsd", "tvd"])
def test_reduced_head_loss_and_gradients_equal_the_masked_full_head(pair_dirs, tmp_path, loss):  # noqa: F811
    batch = collate(rows(), pad_id=0, with_topk=True)
    vocab = torch.tensor(sorted(torch.randperm(WIDTH, generator=torch.Generator().manual_seed(3))[:20].tolist()))
    c = cfg(pair_dirs, tmp_path, loss=loss, teacher="cached")
    model = make_model("llama", seed=5, layers=1)
    got, metrics = batch_loss(c, loss_logits(model, batch, vocab), batch, None, WIDTH, vocab)
    got.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want = masked_reference(model, batch, vocab, loss)
    want.backward()
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-5), name
    assert 0.0 <= metrics["expected_acceptance"] <= 1.0


def test_reduced_head_with_an_online_teacher(pair_dirs, tmp_path):  # noqa: F811
    batch = collate(rows(seed=1), pad_id=0)
    vocab = torch.arange(0, WIDTH, 3)
    model, teacher = make_model("llama", seed=5, layers=1), make_model("llama", seed=0)
    c = cfg(pair_dirs, tmp_path, loss="fkl", teacher="online")
    with torch.no_grad():
        t_logits = loss_logits(teacher, batch)
    got, _ = batch_loss(c, loss_logits(model, batch, vocab), batch, t_logits, WIDTH, vocab)
    assert torch.allclose(got, masked_reference(model, batch, vocab, "fkl", t_logits), atol=1e-5)


def test_ce_skips_tokens_outside_the_vocabulary(pair_dirs, tmp_path):  # noqa: F811
    batch = collate(rows(seed=2), pad_id=0)
    labels = batch.input_ids[:, 1:][batch.loss_mask]
    vocab = torch.unique(labels[::2])  # every other label inside, some outside
    model = make_model("llama", seed=5, layers=1)
    c = cfg(pair_dirs, tmp_path, loss="ce")
    got, _ = batch_loss(c, loss_logits(model, batch, vocab), batch, None, WIDTH, vocab)
    with head_at_loss_positions(model, batch.loss_mask):
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(0)
    sub = torch.log_softmax(full[:, vocab].float(), -1)
    cols = positions_in(vocab, labels, WIDTH)
    inside = cols >= 0
    assert 0 < int(inside.sum()) < len(labels)
    want = -sub[inside].gather(-1, cols[inside, None]).mean()
    assert torch.allclose(got, want, atol=1e-6)


def test_restrict_and_positions_by_hand():
    logp = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    assert torch.allclose(restrict(logp, torch.tensor([1, 3])).exp(), torch.tensor([[1 / 3, 2 / 3]]))
    assert positions_in(torch.tensor([1, 3]), torch.tensor([0, 1, 2, 3, 9]), 4).tolist() == [-1, 0, -1, 1, -1]
    model = make_model("llama", seed=5, layers=1)
    ids = torch.tensor([2, 5, 7])
    x = torch.randint(4, WIDTH, (1, 6))
    with torch.no_grad():
        full = model(input_ids=x).logits
        with reduced_head(model, ids):
            sub = model(input_ids=x).logits
    assert sub.shape[-1] == 3 and torch.allclose(sub, full[..., ids], atol=1e-6)
    assert model(input_ids=x).logits.shape[-1] == WIDTH  # the head is restored after the block


def test_training_with_the_reduced_head_records_its_vocabulary(pair_dirs, tmp_path):  # noqa: F811
    metrics = trainer.run(cfg(pair_dirs, tmp_path, reduced_head=True, draft_vocab=24, eval_every=10, steps=20))
    assert metrics["reduced_head"]["size"] == 24 and 0 < metrics["reduced_head"]["heldout_coverage"] <= 1
    a0, a1 = (metrics["history"]["eval"][i]["heldout/expected_acceptance"] for i in (0, -1))
    assert a1 > a0


def test_reduced_head_needs_a_draft_vocabulary(pair_dirs, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="eval.draft_vocab"):
        cfg(pair_dirs, tmp_path, reduced_head=True)
    with pytest.raises(ConfigError, match="method.cached_tail"):
        cfg(pair_dirs, tmp_path, reduced_head=True, draft_vocab=24, cached_tail="bucket")


def scripted_scores(monkeypatch, scores):
    """Held-out evaluations that report `scores` (expected acceptance) in call order, beside the real figures."""
    real, calls = distill.evaluate, {"n": 0}

    def scripted(*args, **kwargs):
        ev = real(*args, **kwargs)
        ev["heldout/expected_acceptance"] = scores[calls["n"]]
        calls["n"] += 1
        return ev

    monkeypatch.setattr(distill, "evaluate", scripted)


def test_the_draft_written_is_the_best_held_out_one(pair_dirs, tmp_path, monkeypatch):  # noqa: F811
    scripted_scores(monkeypatch, [0.9, 0.2, 0.5, 0.3, 0.4])  # steps 0 (never chosen: untrained), 2, 4, 6, 8
    out = tmp_path / "train"
    metrics = trainer.run(cfg(pair_dirs, tmp_path, steps=8, eval_every=2, save_every=2, keep_checkpoints=10))
    assert metrics["best"] == {"step": 4, "metric": "heldout/expected_acceptance", "value": 0.5}
    assert metrics["draft_step"] == 4 and metrics["final"]["step"] == 4
    written = load_file(out / "draft" / "model.safetensors")
    at4 = load_file(out / "checkpoints" / "step_0000004" / "model.safetensors")
    at8 = load_file(out / "checkpoints" / "step_0000008" / "model.safetensors")
    assert all(torch.equal(written[k], at4[k]) for k in written)
    assert not all(torch.equal(written[k], at8[k]) for k in written)


def test_keep_best_false_writes_the_last_step(pair_dirs, tmp_path, monkeypatch):  # noqa: F811
    scripted_scores(monkeypatch, [0.9, 0.2, 0.5, 0.3, 0.4])
    out = tmp_path / "train"
    metrics = trainer.run(cfg(pair_dirs, tmp_path, steps=8, eval_every=2, save_every=2, keep_checkpoints=10,
                              keep_best=False))
    assert metrics["draft_step"] == 8 and metrics["best"]["step"] == 4
    written = load_file(out / "draft" / "model.safetensors")
    at8 = load_file(out / "checkpoints" / "step_0000008" / "model.safetensors")
    assert all(torch.equal(written[k], at8[k]) for k in written)


def test_patience_stops_and_a_resumed_run_stays_stopped(pair_dirs, tmp_path, monkeypatch):  # noqa: F811
    scripted_scores(monkeypatch, [0.1, 0.6, 0.5, 0.4, 0.7, 0.8])  # best at 2; 4 and 6 are not better: stop at 6
    out = tmp_path / "train"
    c = cfg(pair_dirs, tmp_path, steps=12, eval_every=2, save_every=2, patience=2)
    metrics = trainer.run(c)
    assert metrics["stopped_at"] == 6 and metrics["draft_step"] == 2
    assert [h["step"] for h in metrics["history"]["train"]][-1] == 6
    assert [e["step"] for e in metrics["history"]["eval"]] == [0, 2, 4, 6]
    first = load_file(out / "draft" / "model.safetensors")
    again = trainer.run(c)  # resumes from the step-6 checkpoint, which says it stopped
    assert again["stopped_at"] == 6 and len(again["history"]["train"]) == 6
    assert all(torch.equal(first[k], v) for k, v in load_file(out / "draft" / "model.safetensors").items())


def test_resume_keeps_the_best_draft(pair_dirs, tmp_path, monkeypatch):  # noqa: F811
    common = dict(steps=6, save_every=2, eval_every=2, batch_size=4)
    reference_metrics = trainer.run(cfg(pair_dirs, tmp_path / "a", **common))
    reference = load_file(tmp_path / "a" / "train" / "draft" / "model.safetensors")
    real, calls = distill.batch_loss, {"n": 0}

    def crash_on_fifth(*args, **kwargs):  # training micro-batch 5 = step 5, after checkpoint 4
        if args[1].requires_grad:  # evaluations run without grad
            calls["n"] += 1
            if calls["n"] == 5:
                raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "batch_loss", crash_on_fifth)
    with pytest.raises(KeyboardInterrupt):
        trainer.run(cfg(pair_dirs, tmp_path / "b", **common))
    assert (tmp_path / "b" / "train" / "checkpoints" / "step_0000004" / "best_params.pt").exists()
    monkeypatch.setattr(distill, "batch_loss", real)
    resumed_metrics = trainer.run(cfg(pair_dirs, tmp_path / "b", **common))
    assert resumed_metrics["best"] == reference_metrics["best"]
    resumed = load_file(tmp_path / "b" / "train" / "draft" / "model.safetensors")
    for key in reference:
        assert torch.equal(reference[key], resumed[key]), key


def test_pipeline_refuses_a_reduced_head_without_a_draft_vocabulary():
    from draftsmith.config import DraftsmithConfig, validate

    c = DraftsmithConfig()
    c.method.reduced_head, c.stages = True, ["train", "eval"]
    with pytest.raises(ConfigError, match="eval.draft_vocab"):
        validate(c)


def test_best_by_top1_agreement_ranks_by_it(pair_dirs, tmp_path, monkeypatch):  # noqa: F811
    real, calls = distill.evaluate, {"n": 0}
    top1 = [0.1, 0.3, 0.6, 0.4]  # steps 0, 2, 4, 6; expected acceptance says step 2 (0.9)
    accept = [0.1, 0.9, 0.2, 0.3]

    def scripted(*args, **kwargs):
        ev = real(*args, **kwargs)
        ev["heldout/top1_agreement"], ev["heldout/expected_acceptance"] = top1[calls["n"]], accept[calls["n"]]
        calls["n"] += 1
        return ev

    monkeypatch.setattr(distill, "evaluate", scripted)
    m = trainer.run(cfg(pair_dirs, tmp_path / "a", steps=6, eval_every=2, best_by="top1_agreement"))
    assert m["best"] == {"step": 4, "metric": "heldout/top1_agreement", "value": 0.6}
    calls["n"] = 0
    m = trainer.run(cfg(pair_dirs, tmp_path / "b", steps=6, eval_every=2, best_by="expected_acceptance"))
    assert m["best"]["step"] == 2
