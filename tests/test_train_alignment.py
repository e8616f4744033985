"""collate / batch_loss alignment by hand: which logit positions are scored against which labels.

Convention (train/data.py): logits at position i predict token i+1, so completion token j of a row
with a prompt of length p is scored at position p - 1 + j. A loss mask or a cached top-k one
position off must show up as a non-zero loss for a student that is perfect exactly there.
"""

import pytest
import torch

from draftsmith.train.data import collate
from draftsmith.train.distill import batch_loss
from draftsmith.train.settings import TrainConfig

V = 16  # vocab
ROWS = [{"prompt_ids": [5, 6, 7], "completion_ids": [8, 9]},
        {"prompt_ids": [10, 11], "completion_ids": [12, 13, 14]}]
# by hand: row 0's tokens 8, 9 sit at 3, 4 and are predicted at 2, 3; row 1's 12, 13, 14 sit at 2, 3, 4 -> 1, 2, 3
PREDICTING = torch.tensor([[False, False, True, True], [False, True, True, True]])  # [B, T-1]


def with_topk(rows):
    """Rows with a one-hot cached teacher: top-1 = the completion token (log-prob 0), top-2 = token 3."""
    return [{**r, "topk_ids": [[t, 3] for t in r["completion_ids"]],
             "topk_logprobs": [[0.0, -30.0] for _ in r["completion_ids"]]} for r in rows]


def perfect_student(input_ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits that put all mass on the next token at positions `where` ([B, T-1] bool), and on
    a wrong token everywhere else."""
    b, t = input_ids.shape
    logits = torch.zeros(b, t, V)
    nxt = input_ids[:, 1:]  # [B, T-1] the token each position predicts
    right = torch.where(where, nxt, (nxt + 1) % V)  # [B, T-1]
    logits[:, :-1].scatter_(-1, right.unsqueeze(-1), 30.0)
    return logits


def cfg(loss):
    return TrainConfig(data_dir="d", draft="x", out_dir="o", loss=loss, teacher="cached", target="t")


def test_collate_places_mask_and_topk_at_the_predicting_positions():
    batch = collate(with_topk(ROWS), pad_id=0, with_topk=True)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert torch.equal(batch.loss_mask, PREDICTING)
    labels = batch.input_ids[:, 1:]
    assert labels[batch.loss_mask].tolist() == [8, 9, 12, 13, 14]
    assert batch.topk_ids[..., 0][batch.loss_mask].tolist() == [8, 9, 12, 13, 14]
    assert batch.prompt_lens == [3, 2]


def test_collate_truncation_keeps_the_alignment():
    batch = collate(ROWS, pad_id=0, max_len=4)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [10, 11, 12, 13]]
    assert batch.loss_mask.tolist() == [[False, False, True], [False, True, True]]
    short = collate([ROWS[0], {"prompt_ids": [1], "completion_ids": [2]}], pad_id=0)
    assert short.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 0, 0, 0]]
    assert short.loss_mask.tolist() == [[False, False, True, True], [True, False, False, False]]  # padding unscored


@pytest.mark.parametrize("loss, topk", [("ce", False), ("fkl", True), ("tvd", True)])
def test_a_student_perfect_at_the_completion_positions_has_zero_loss(loss, topk):
    batch = collate(with_topk(ROWS) if topk else ROWS, pad_id=0, with_topk=topk)
    logits = perfect_student(batch.input_ids, PREDICTING)  # the positions by hand, not collate's mask
    value, metrics = batch_loss(cfg(loss), logits, batch, None, V)
    assert value.item() == pytest.approx(0.0, abs=1e-6)
    assert metrics["top1_agreement"] == 1.0


@pytest.mark.parametrize("shift", [-1, 1])
@pytest.mark.parametrize("loss, topk", [("ce", False), ("fkl", True)])
def test_a_mask_one_position_off_scores_wrong_positions(loss, topk, shift):
    batch = collate(with_topk(ROWS) if topk else ROWS, pad_id=0, with_topk=topk)
    logits = perfect_student(batch.input_ids, PREDICTING)
    batch.loss_mask = torch.roll(batch.loss_mask, shift, dims=1)  # what an off-by-one collate would give
    if topk:  # the cached teacher moves with the mask, as an off-by-one collate would place it
        batch.topk_ids = torch.roll(batch.topk_ids, shift, dims=1)
        batch.topk_logprobs = torch.roll(batch.topk_logprobs, shift, dims=1)
    value, metrics = batch_loss(cfg(loss), logits, batch, None, V)
    assert value.item() > 1.0
    assert metrics["top1_agreement"] < 1.0


def test_student_logits_are_read_one_position_before_the_label():
    """The student scored at the label's own position (no shift) would not be perfect."""
    batch = collate(ROWS, pad_id=0)
    logits = perfect_student(batch.input_ids, PREDICTING)
    unshifted = torch.cat([logits[:, -1:], logits[:, :-1]], dim=1)  # logits moved one position later
    assert batch_loss(cfg("ce"), unshifted, batch, None, V)[0].item() > 1.0


@pytest.mark.parametrize("loss", ["fkl", "ce"])
def test_logits_at_the_loss_positions_give_the_same_loss_as_whole_rows(loss):
    torch.manual_seed(0)
    batch = collate(with_topk(ROWS), pad_id=0, with_topk=True)
    logits = torch.randn(2, batch.input_ids.shape[1], V)
    full, full_metrics = batch_loss(cfg(loss), logits, batch, None, V)
    selected, selected_metrics = batch_loss(cfg(loss), logits[:, :-1][PREDICTING], batch, None, V)
    assert torch.allclose(full, selected) and full_metrics == pytest.approx(selected_metrics)
    with pytest.raises(ValueError, match="loss positions"):
        batch_loss(cfg(loss), logits[:, :-1][PREDICTING][:-1], batch, None, V)


@pytest.mark.parametrize("lora", [False, True])
def test_the_head_runs_only_at_the_loss_positions_with_the_same_logits(lora, tokenizer):
    """loss_logits: the forward's head hook gives exactly the whole-row logits at the masked positions, for a plain
    model and through a PEFT wrapper, and the head sees N positions, not B x T."""
    from conftest import make_model
    from draftsmith.train.distill import apply_lora, loss_logits

    model = make_model("llama", layers=2, hidden=32)
    if lora:
        model = apply_lora(model, TrainConfig(data_dir="d", draft="x", out_dir="o", finetune="lora", lora_r=4))
    rows = [{"prompt_ids": [5, 6, 7], "completion_ids": [8, 9]}, {"prompt_ids": [10, 11], "completion_ids": [12, 13, 14]}]
    batch = collate(rows, pad_id=0)
    seen = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        whole = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        at = loss_logits(model, batch)
    handle.remove()
    assert seen[1] == (1, 5, whole.shape[-1])  # 2 + 3 completion positions, not 2 x 5
    assert torch.allclose(at, whole[:, :-1][batch.loss_mask], atol=1e-6)
