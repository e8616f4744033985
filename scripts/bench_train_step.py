"""One training step (forward, loss, backward), the trainer of another commit vs this one, on the same batches.

    git show 14a4151:train/trainer.py > /tmp/old_trainer.py
    python scripts/bench_train_step.py DRAFT_DIR DATAGEN_DIR /tmp/old_trainer.py [--freeze]

Interleaved (order alternating per repeat), 3 repeats over 4 batches of 16 rows, medians; the losses of
both are compared (they must agree). Measured for the SmolLM2 preset: the head and log-softmax over every
position (before) vs at the loss positions only (after).
"""
import importlib.util, json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from draftsmith.train import distill as new
from draftsmith.train.data import collate
from draftsmith.train.datagen import load_output
spec = importlib.util.spec_from_file_location("old_trainer", sys.argv[3])
old = importlib.util.module_from_spec(spec); sys.modules["old_trainer"] = old; spec.loader.exec_module(old)
from draftsmith.decode.pair import load_model
from draftsmith.decode.runners import logit_width
ds, _ = load_output(sys.argv[2])
rows = [ds["train"][i] for i in range(64)]
model = load_model(sys.argv[1], "draft", "float32", "cpu"); model.train()
if "--freeze" in sys.argv: new.freeze_embeddings(model)
from draftsmith.train.settings import TrainConfig
cfg = TrainConfig(data_dir="d", draft="x", out_dir="o", loss="fkl", teacher="cached")
width = logit_width(model)
times = {"old": [], "new": []}; losses = {"old": [], "new": []}
for rep in range(3):
    for b in range(0, 64, 16):
        batch = collate(rows[b:b+16], 2, None, True)
        for name in (("old", "new") if rep % 2 == 0 else ("new", "old")):
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            if name == "old":
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                loss, _ = old.batch_loss(cfg, logits, batch, None, width)
            else:
                loss, _ = new.batch_loss(cfg, new.loss_logits(model, batch), batch, None, width)
            loss.backward()
            times[name].append(time.perf_counter() - t); losses[name].append(loss.item())
tokens = sum(int(collate(rows[b:b+16], 2, None, True).attention_mask.sum()) for b in range(0, 64, 16)) / 4
print(json.dumps({"draft": sys.argv[1], "freeze": "--freeze" in sys.argv, "row_tokens_per_batch": tokens,
                  "loss_positions_per_batch": sum(int(collate(rows[b:b+16], 2, None, True).loss_mask.sum()) for b in range(0, 64, 16)) / 4,
                  "step_s_median": {k: statistics.median(v) for k, v in times.items()},
                  "speedup": statistics.median(times["old"]) / statistics.median(times["new"]),
                  "max_loss_diff": max(abs(a - b) for a, b in zip(losses["old"], losses["new"]))}))
