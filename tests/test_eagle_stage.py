"""An EAGLE head through the stages: ``method.finetune=eagle`` trains one on a datagen output (train/eagle_objective.py),
resumably, and writes vLLM's checkpoint as the train output; the eval stage runs it in eagle_generate beside draft
models, greedy output equal to the target's, its costs timed as that loop runs it."""

import json

import pytest
import torch

from conftest import make_model, perturbed_copy
from draftsmith.artifacts.errors import ConfigError
from draftsmith.preflight import check_draft_kind, check_eagle_target
from draftsmith.decode.eagle import EagleHead, is_eagle_dir, load_eagle
from draftsmith.decode.timing import cost_ratios
from draftsmith.eval.runner import EvalConfig, EvalError
from draftsmith.eval.runner import run as run_eval
from draftsmith.train import eagle_objective, features, loop
from draftsmith.train.datagen import DatagenConfig
from draftsmith.train.datagen import run as run_datagen
from draftsmith.train.trainer import TrainConfig, TrainingError
from draftsmith.train.trainer import run as run_train


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("eagle-stage")
    target = make_model("llama", seed=0)
    for name, model in (("target", target), ("draft", perturbed_copy(target, 0.1)),
                        ("qwen", make_model("qwen2", seed=0))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{(i * 7 + j * 3) % 60}" for j in range(5))}) + "\n"
                               for i in range(80)))
    run_datagen(DatagenConfig(target=str(root / "target"), prompts=str(prompts), out_dir=str(root / "data"),
                              max_new_tokens=10, heldout_fraction=0.2))
    return root


def train_cfg(setup, out, **kw):
    base = dict(data_dir=str(setup / "data"), draft=str(setup / "draft"), target=str(setup / "target"),
                out_dir=str(out), finetune="eagle", steps=120, batch_size=8, lr=3e-3, warmup_steps=5, eval_every=40,
                save_every=40, device="cpu", mixed_precision="no", best_by="top1_agreement")
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(setup):
    out = setup / "train"
    return out, run_train(train_cfg(setup, out))


def test_the_train_stage_writes_a_served_eagle_head_that_learned(setup, trained):
    out, metrics = trained
    draft = out / "draft"
    assert is_eagle_dir(draft)
    assert json.loads((draft / "draftsmith_eagle.json").read_text())["kind"] == "eagle"
    assert (draft / "tokenizer.json").exists()  # the target's: draft-directory checks (registry, eval) read it
    assert json.loads((out / "manifest.json").read_text())["kind"] == "eagle"
    assert not (out / features.FEATURES).exists()  # kept only until the stage completes
    evals = metrics["history"]["eval"]
    assert [e["step"] for e in evals] == [0, 40, 80, 120]
    first, best = evals[0]["heldout/top1_agreement"], metrics["best"]["value"]
    assert best > max(0.3, first + 0.25), (first, best)  # from ~chance (0.02) to 0.42 here
    assert metrics["final"]["heldout/top1_agreement"] == best  # the best evaluation's head is the one written
    assert 0 < metrics["final"]["heldout/expected_acceptance"] <= 1
    head = load_eagle(draft, make_model("llama", seed=0))
    assert isinstance(head, EagleHead)


def test_a_head_trained_on_completion_slots_only_learns_and_says_so(setup, trained, tmp_path):
    """method.eagle_loss_on=completion: the held-out agreement (measured at completion slots) still rises well
    above the untrained head's, and the head's training record names the setting."""
    metrics = run_train(train_cfg(setup, tmp_path / "c", eagle_loss_on="completion"))
    evals = metrics["history"]["eval"]
    assert metrics["best"]["value"] > max(0.3, evals[0]["heldout/top1_agreement"] + 0.2)
    info = json.loads((tmp_path / "c" / "draft" / "draftsmith_eagle.json").read_text())
    assert info["loss_on"] == "completion"


def test_a_bf16_run_learns_as_the_float32_one_does(setup, trained, tmp_path, monkeypatch):
    """method.mixed_precision=bf16 (the SmolLM2 preset's on an AMX CPU): the training steps run under bf16 autocast,
    the held-out evaluations in float32 (as the head is served), the same steps reach the float32 run's held-out
    agreement within a few points, and what is written is a float32 head vLLM loads."""
    out, metrics = trained
    seen = []
    real = eagle_objective.eagle_loss

    def spy(head, *args, **kwargs):
        seen.append((head.training, torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
        return real(head, *args, **kwargs)

    monkeypatch.setattr(eagle_objective, "eagle_loss", spy)
    half = run_train(train_cfg(setup, tmp_path / "bf16", mixed_precision="bf16"))
    assert {autocast for training, autocast in seen if training} == {torch.bfloat16}
    assert {autocast for training, autocast in seen if not training} == {False}
    assert [t["loss"] for t in half["history"]["train"]] != [t["loss"] for t in metrics["history"]["train"]]
    assert half["best"]["value"] == pytest.approx(metrics["best"]["value"], abs=0.05)
    head = load_eagle(tmp_path / "bf16" / "draft", make_model("llama", seed=0))
    assert all(p.dtype == torch.float32 for p in head.parameters())


def test_a_crashed_eagle_run_resumes_to_the_same_head(setup, tmp_path, monkeypatch):
    """Interrupted after its first checkpoint, the run resumes from it (features read back, not recomputed) and
    writes the head an uninterrupted run writes."""
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
    assert (cut / features.FEATURES).exists() and not (cut / "draft").exists()
    kept = torch.load(cut / features.FEATURES, weights_only=False)  # the objective asks the argmax of held-out rows only
    assert all("top" not in it for it in kept["train"]) and all("top" in it for it in kept["heldout"])
    computed = []
    monkeypatch.setattr(eagle_objective, "target_features", lambda *a, **k: computed.append(1))
    metrics = run_train(train_cfg(setup, cut, steps=40, save_every=20, eval_every=20))
    assert computed == []  # the features came from the run that crashed
    assert [e["step"] for e in metrics["history"]["eval"]] == [0, 20, 40]
    target = make_model("llama", seed=0)
    a, b = load_eagle(whole / "draft", target), load_eagle(cut / "draft", target)
    for name, value in a.weights().items():
        torch.testing.assert_close(b.weights()[name], value, rtol=0, atol=1e-6)


def test_eagle_settings_and_targets_that_cannot_carry_a_head_are_clear_errors(setup, tmp_path):
    with pytest.raises(ConfigError, match="method.on_policy_fraction"):
        train_cfg(setup, tmp_path / "x", on_policy_fraction=0.5)
    with pytest.raises(ConfigError, match="method.freeze_embeddings"):
        train_cfg(setup, tmp_path / "x", freeze_embeddings=True)
    with pytest.raises(ConfigError, match="method.finetune=eagle"):
        train_cfg(setup, tmp_path / "x", target=None)
    with pytest.raises(ConfigError, match="method.eagle_loss_on"):
        train_cfg(setup, tmp_path / "x", eagle_loss_on="prompt")
    with pytest.raises(ConfigError, match="method.eagle_noise"):
        train_cfg(setup, tmp_path / "x", eagle_noise=-0.1)
    with pytest.raises(TrainingError, match="for Llama targets"):  # Qwen2: attention biases, no EagleLlama head
        run_train(train_cfg(setup, tmp_path / "q", target=str(setup / "qwen"), allow_other_target=True))


def test_the_eval_stage_runs_an_eagle_head_beside_a_draft_model(setup, trained):
    out = setup / "eval"
    metrics = run_eval(EvalConfig(target=str(setup / "target"),
                                  drafts={"eagle": str(trained[0] / "draft"), "draft": str(setup / "draft")},
                                  data_dir=str(setup / "data"), out_dir=str(out), k=[1, 2], temperature=[0.0, 0.8],
                                  max_new_tokens=12, max_prompts=4, cost_repeats=2, hf_ab=True, baselines=[]))
    records = {(r["draft"], r["k"], r["temperature"]): r for r in metrics["records"]}
    assert len(records) == 8
    for (name, k, temperature), rec in records.items():
        assert rec["backend"] == {"target": "lean", "draft": "eagle" if name == "eagle" else "lean"}
        assert rec["c"] > 0 and rec["c_v"] > 0
        assert rec["repeats"] == 2 and len(rec["timings"]["spec_s"][0]) == 4
        if temperature == 0:
            assert rec["greedy_match"] == 1.0
            assert ("hf_assisted" in rec) == (name == "draft")  # HF assisted generation has no EAGLE mode
    # one plain run per prompt and pass serves both drafts
    assert records[("eagle", 1, 0.0)]["timings"]["plain_s"] == records[("draft", 1, 0.0)]["timings"]["plain_s"]
    assert metrics["summary"]["eagle"]["token_acceptance"] > 0.3
    assert "| eagle |" in (out / "report.md").read_text()


def test_an_eagle_head_of_another_target_is_a_clear_error(setup, tmp_path):
    """A head trained for a 48-wide target, evaluated against the 32-wide one: refused before any timing."""
    from draftsmith.decode.eagle import save_eagle

    save_eagle(tmp_path / "h", EagleHead(make_model("llama", seed=0, hidden=48)))
    with pytest.raises(EvalError, match="does not fit the target"):
        run_eval(EvalConfig(target=str(setup / "target"), drafts={"eagle": str(tmp_path / "h")},
                            data_dir=str(setup / "data"), out_dir=str(tmp_path / "e"), k=[1], max_new_tokens=4,
                            max_prompts=1, cost_repeats=1, hf_ab=False))


def test_cost_ratios_time_an_eagle_head_as_its_loop_runs_it(setup, trained):
    target = make_model("llama", seed=0)
    head = load_eagle(trained[0] / "draft", target)
    context = torch.randint(4, 60, (1, 20))
    costs = cost_ratios(target, head, context, [1, 2], repeats=3)
    assert set(costs["c"]) == {1, 2} and all(0 < costs["c"][k] and 0 < costs["c_v"][k] for k in (1, 2))
    vocab = torch.arange(4, 40)
    assert cost_ratios(target, head, context, [1], repeats=2, draft_vocab=vocab)["c"][1] > 0


def test_a_head_is_trained_further_from_a_head(setup, trained, tmp_path):
    """pair.draft = an EAGLE head's directory (the monitor's retrain of a production head): training starts from it,
    so the first held-out evaluation is the trained head's own."""
    out, metrics = trained
    again = run_train(train_cfg(setup, tmp_path / "again", draft=str(out / "draft"), steps=1, lr=1e-6,
                                eval_every=1, save_every=0))
    start = again["history"]["eval"][0]
    assert start["step"] == 0
    assert start["heldout/top1_agreement"] == pytest.approx(metrics["final"]["heldout/top1_agreement"])
    assert start["heldout/top1_agreement"] > metrics["history"]["eval"][0]["heldout/top1_agreement"] + 0.2


def test_features_of_other_data_or_a_torn_file_are_computed_again(setup, tmp_path, monkeypatch):
    target = make_model("llama", seed=0)
    rows = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
    calls = []
    real = eagle_objective.target_features
    monkeypatch.setattr(eagle_objective, "target_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    key = {"data": "a", "rows": 2}

    def compute(rows_, top):
        return eagle_objective.target_features(target, rows_, top=top)

    first, held = features.load_features(tmp_path, key, compute, rows, rows[:1], log=lambda m: None)
    assert len(calls) == 2 and (tmp_path / features.FEATURES).exists()
    # the target's argmax only on the held-out rows (the held-out figures read it; the loss does not)
    assert all("top" not in it for it in first) and all("top" in it for it in held)
    again, _ = features.load_features(tmp_path, key, compute, rows, rows[:1], log=lambda m: None)
    assert len(calls) == 2 and torch.equal(again[1]["h"], first[1]["h"])  # read back, not recomputed
    features.load_features(tmp_path, {**key, "data": "b"}, compute, rows, rows[:1], log=lambda m: None)
    assert len(calls) == 4  # another key: computed again
    (tmp_path / features.FEATURES).write_bytes(b"torn")
    features.load_features(tmp_path, key, compute, rows, rows[:1], log=lambda m: None)
    assert len(calls) == 6
    other = tmp_path / "other"
    other.mkdir()
    features.load_features(other, key, compute, rows, rows[:1], log=lambda m: None, write=False)
    assert not (other / features.FEATURES).exists()  # a process other than the main one writes nothing


def test_the_training_rows_features_follow_the_training_precision_the_held_out_ones_stay_float32(tmp_path):
    """Under method.mixed_precision=bf16 the target's features of the training rows are computed in its autocast
    (a CPU with AMX ran that pass ~2x faster on SmolLM2), the held-out rows' in float32 as the head is served, and
    the precision is part of the key (train/features.py run_features), so a file computed under the other one is
    not read back; fp16 leaves the target's forward in float32."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from datasets import Dataset

    from draftsmith.artifacts.formats import DATAGEN_MANIFEST

    target = make_model("llama", seed=0)
    data = tmp_path / "datagen"
    data.mkdir()
    (data / DATAGEN_MANIFEST).write_text("{}")
    split = Dataset.from_dict({"prompt_ids": [[5, 6, 7], [10, 11]], "completion_ids": [[8, 9], [12, 13, 14]]})
    ds = {"train": split, "heldout": split.select([0])}
    cfg = SimpleNamespace(data_dir=str(data), target="t", max_len=None, eval_rows=1, out_dir=str(tmp_path / "out"),
                          batch_size=1)
    seen = []

    def compute(rows_, top):
        seen.append(torch.is_autocast_enabled("cpu"))
        return eagle_objective.target_features(target, rows_, top=top)

    def run(precision):
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            return features.run_features(cfg, Accelerator(cpu=True, mixed_precision=precision), ds, compute)
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)

    bf16, held = run("bf16")
    assert seen == [True, False]
    run("bf16")
    assert seen == [True, False]  # the same precision: read back
    plain, held32 = run("no")
    assert seen == [True, False, False, False]  # another precision, another key: computed again
    assert torch.equal(held[0]["h"], held32[0]["h"])  # the held-out rows in float32 either way
    assert not torch.equal(bf16[0]["h"], plain[0]["h"])  # the training rows in bf16: close, not equal
    torch.testing.assert_close(bf16[0]["h"], plain[0]["h"], rtol=0.1, atol=0.1)
    (tmp_path / "out" / features.FEATURES).unlink()
    run("fp16")
    assert seen[4:] == [False, False]  # computed again, in float32


def test_the_features_key_changes_when_the_datagen_output_is_regenerated(setup, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(setup / "data", data)
    cfg = train_cfg(setup, tmp_path / "t", data_dir=str(data))
    before = features.features_key(cfg, 10, 2)
    manifest = data / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["timing"] = {"total_s": 1.0}  # what a new datagen run at the same path would write
    manifest.write_text(json.dumps(doc))
    assert features.features_key(cfg, 10, 2) != before
    assert features.features_key(cfg, 10, 2) == features.features_key(cfg, 10, 2)


def test_preflight_refuses_targets_and_drafts_that_do_not_fit_an_eagle_run(setup, trained):
    check_eagle_target(str(setup / "target"))  # a Llama without biases
    with pytest.raises(ConfigError, match="method.finetune=eagle .* its model type is 'qwen2'"):
        check_eagle_target(str(setup / "qwen"))
    with pytest.raises(ConfigError, match="is an EAGLE head .* method.finetune=full cannot train"):
        check_draft_kind(str(trained[0] / "draft"), "full")
    check_draft_kind(str(trained[0] / "draft"), "eagle")
    check_draft_kind(str(setup / "draft"), "full")
    check_draft_kind(None, "eagle")


def test_an_eagle_head_against_the_hf_forward_is_refused(setup, trained, tmp_path):
    with pytest.raises(EvalError, match="decode.backend=auto"):
        run_eval(EvalConfig(target=str(setup / "target"), drafts={"eagle": str(trained[0] / "draft")},
                            data_dir=str(setup / "data"), out_dir=str(tmp_path / "e"), k=[1], max_new_tokens=4,
                            max_prompts=1, cost_repeats=1, hf_ab=False, backend="hf"))
