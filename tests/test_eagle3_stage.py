"""The train stage with ``method.finetune=eagle3``: a speculators-format head that learned, kept by its acceptance
length, resumed bit for bit after a crash, trained for a Qwen2 (biased) target too; preflight refuses what it
cannot train; the eval stage measures the head in draftsmith's loop beside plain decoding."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model
from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.eagle3 import Eagle3Head, is_eagle3_dir, load_eagle3
from draftsmith.preflight import check_draft_kind, check_eagle3_target
from draftsmith.train import eagle3_objective, features, loop
from draftsmith.train.checkpoints import latest_checkpoint
from draftsmith.train.datagen import DatagenConfig
from draftsmith.train.datagen import run as run_datagen
from draftsmith.train.trainer import TrainConfig
from draftsmith.train.trainer import run as run_train

LAYERS = [0, 1, 3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("eagle3-stage")
    for name, model in (("target", make_model("llama", seed=0, layers=4)), ("qwen", make_model("qwen2", seed=0,
                                                                                                layers=4))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{(i * 7 + j * 3) % 60}" for j in range(5))}) + "\n"
                               for i in range(80)))
    run_datagen(DatagenConfig(target=str(root / "target"), prompts=str(prompts), out_dir=str(root / "data"),
                              max_new_tokens=10, heldout_fraction=0.2))
    return root


def train_cfg(setup, out, name="target", **kw):
    base = dict(data_dir=str(setup / "data"), draft=str(setup / name), target=str(setup / name),
                allow_other_target=name != "target",  # the Llama's rows, the same tokenizer
                out_dir=str(out), finetune="eagle3", eagle_layers=LAYERS, ttt_steps=3, steps=90, batch_size=8,
                lr=3e-3, warmup_steps=5, eval_every=30, save_every=30, device="cpu", mixed_precision="no",
                best_by="top1_agreement", eagle_loss_on="completion")
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(setup):
    out = setup / "train"
    return out, run_train(train_cfg(setup, out, draft_vocab=40))


def test_the_stage_writes_a_speculators_head_that_learned(setup, trained):
    out, metrics = trained
    draft = out / "draft"
    assert is_eagle3_dir(draft) and (draft / "tokenizer.json").exists()
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str((setup / "target").resolve())
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert cfg["draft_vocab_size"] == 40 and cfg["eagle_aux_hidden_state_layer_ids"] == LAYERS
    weights = load_file(str(draft / "model.safetensors"))
    assert weights["d2t"].shape == (40,) and int(weights["t2d"].sum()) == 40
    assert json.loads((out / "manifest.json").read_text())["kind"] == "eagle3"
    assert not (out / features.FEATURES).exists()
    evals = metrics["history"]["eval"]
    assert [e["step"] for e in evals] == [0, 30, 60, 90]
    assert metrics["best"]["metric"] == "heldout/acceptance_length"  # what ranks a greedy head's evaluations
    assert metrics["best"]["value"] > evals[0]["heldout/acceptance_length"] + 0.5, metrics["best"]
    assert {f"heldout/agreement_at_{j}" for j in (1, 2, 3)} <= set(metrics["final"])
    head = load_eagle3(draft, make_model("llama", seed=0, layers=4))
    assert isinstance(head, Eagle3Head) and head.draft_vocab_size == 40


def test_a_crashed_eagle3_run_resumes_to_the_same_head(setup, tmp_path, monkeypatch):
    """Killed right after its first checkpoint, the run resumes from it (features read back) and writes the head an
    uninterrupted run writes, bit for bit."""
    whole = tmp_path / "whole"
    run_train(train_cfg(setup, whole, steps=40, save_every=20, eval_every=20))
    real_save = loop.save_checkpoint

    class Crash(RuntimeError):
        pass

    def save_then_crash(*args, **kw):
        path = real_save(*args, **kw)
        raise Crash(str(path))

    cut = tmp_path / "cut"
    monkeypatch.setattr(loop, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        run_train(train_cfg(setup, cut, steps=40, save_every=20, eval_every=20))
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    assert latest_checkpoint(cut)[1] == 20 and (cut / features.FEATURES).exists() and not (cut / "draft").exists()
    kept = torch.load(cut / features.FEATURES, weights_only=False)  # the objective asks the argmax of held-out rows only
    assert all("top" not in it for it in kept["train"]) and all("top" in it for it in kept["heldout"])
    computed = []
    monkeypatch.setattr(eagle3_objective, "target_aux_rows", lambda *a, **k: computed.append(1))
    metrics = run_train(train_cfg(setup, cut, steps=40, save_every=20, eval_every=20))
    assert computed == []
    assert [e["step"] for e in metrics["history"]["eval"]] == [0, 20, 40]
    a, b = load_file(str(whole / "draft" / "model.safetensors")), load_file(str(cut / "draft" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_qwen2_target_trains_a_head_too(setup, tmp_path):
    metrics = run_train(train_cfg(setup, tmp_path / "q", name="qwen"))
    evals = metrics["history"]["eval"]
    assert metrics["best"]["value"] > evals[0]["heldout/acceptance_length"] + 0.2
    cfg = json.loads((tmp_path / "q" / "draft" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["transformer_layer_config"]["model_type"] == "llama"  # the head's own layer


def test_preflight_says_what_it_cannot_train(setup, trained):
    check_eagle3_target(str(setup / "qwen"), LAYERS)
    with pytest.raises(ConfigError, match="4 layers; the default .* needs at least 7"):
        check_eagle3_target(str(setup / "target"), None)  # (2, 2, 1): not three distinct layers
    gpt2 = setup / "gpt2"
    make_model("gpt2").save_pretrained(gpt2)
    with pytest.raises(ConfigError, match="model type 'gpt2'"):
        check_eagle3_target(str(gpt2), LAYERS)
    windowed = setup / "mistral-window"
    from transformers import MistralConfig

    MistralConfig(num_hidden_layers=8, sliding_window=16, hidden_size=32, intermediate_size=64,
                  num_attention_heads=4, num_key_value_heads=2).save_pretrained(windowed)
    with pytest.raises(ConfigError, match="mistral sliding window"):  # refused before datagen, not after training
        check_eagle3_target(str(windowed), None)
    with pytest.raises(ConfigError, match="is an EAGLE-3 head .* method.finetune=full cannot train"):
        check_draft_kind(str(trained[0] / "draft"), "full")
    with pytest.raises(ConfigError, match="method.draft_vocab sizes an EAGLE-3"):
        TrainConfig(data_dir="d", draft="x", out_dir="o", draft_vocab=10)
    with pytest.raises(ConfigError, match="method.eagle_layers must be 3 distinct"):
        TrainConfig(data_dir="d", draft="x", target="t", out_dir="o", finetune="eagle3", eagle_layers=[1, 1, 2])
    with pytest.raises(ConfigError, match="method.eagle_w_reg=0.5: EAGLE-1's loss terms do not apply"):
        TrainConfig(data_dir="d", draft="x", target="t", out_dir="o", finetune="eagle3", eagle_w_reg=0.5)


def test_a_head_trained_further_keeps_its_own_layers_and_vocabulary(setup, trained, tmp_path):
    """pair.draft an EAGLE-3 folder: the run starts from it (the monitor's retrain command); settings that would
    change its shape are refused naming the key, not silently ignored."""
    from draftsmith.train.loop import TrainingError

    head_dir = str(trained[0] / "draft")
    metrics = run_train(train_cfg(setup, tmp_path / "more", draft=head_dir, eagle_layers=None, steps=10,
                                  eval_every=10, save_every=0))
    assert metrics["draft_vocab"]["size"] == 40 and metrics["eagle_layers"] == LAYERS
    start = metrics["history"]["eval"][0]["heldout/acceptance_length"]
    assert start == pytest.approx(trained[1]["best"]["value"], abs=1e-6)  # it starts where the trained head ended
    with pytest.raises(TrainingError, match=r"method.draft_vocab=30, but the head at pair.draft"):
        run_train(train_cfg(setup, tmp_path / "v", draft=head_dir, eagle_layers=None, draft_vocab=30, steps=2))
    with pytest.raises(TrainingError, match=r"method.eagle_layers=\[0, 2, 3\], but the head"):
        run_train(train_cfg(setup, tmp_path / "l", draft=head_dir, eagle_layers=[0, 2, 3], steps=2))


def test_the_eval_stage_runs_an_eagle3_head(setup, trained, tmp_path):
    """An EAGLE-3 folder as a draft: measured in draftsmith's loop (its own vocabulary, eval.draft_vocab left to draft
    models), greedy outputs equal, its proposals accepted at every position, its costs timed as its loop runs it."""
    from draftsmith.eval.runner import EvalConfig
    from draftsmith.eval.runner import run as run_eval

    metrics = run_eval(EvalConfig(target=str(setup / "target"), drafts={"e3": str(trained[0] / "draft")},
                                  data_dir=str(setup / "data"), out_dir=str(tmp_path / "eval"), k=[1, 3],
                                  temperature=[0.0, 0.8], max_new_tokens=12, max_prompts=4, cost_repeats=2,
                                  hf_ab=True))
    records = {(r["k"], r["temperature"]): r for r in metrics["records"] if r["draft"] == "e3"}
    assert len(records) == 4
    for (k, temperature), rec in records.items():
        assert rec["backend"] == {"target": "lean", "draft": "eagle3"} and rec["c"] > 0 and rec["c_v"] > 0
        assert "hf_assisted" not in rec
        if temperature == 0:
            assert rec["greedy_match"] == 1.0
    assert metrics["summary"]["e3"]["token_acceptance"] > 0.3
    assert records[(3, 0.0)]["per_position_acceptance"][2] > 0  # third proposals accepted
