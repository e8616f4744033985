"""scripts/search_draft_shape.py end to end on a tiny 3-layer target: 2 depths x 2 heads costed, distilled, ranked;
and its bad inputs as one-line errors that name the flag."""

import json
import math
import sys
from pathlib import Path

import pytest

from conftest import make_model
from draftsmith.eval.theory import predicted_speedup
from draftsmith.train.datagen import DatagenConfig
from draftsmith.train.datagen import run as run_datagen
from test_train import word_prompts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import search_draft_shape  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def target_and_data(tmp_path_factory, tokenizer):
    """A 3-layer tiny llama target and its datagen output (64 train rows, 16 held out, top-k kept)."""
    root = tmp_path_factory.mktemp("shape")
    make_model("llama", seed=0, layers=3).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in word_prompts(80)))
    run_datagen(DatagenConfig(target=str(root / "target"), prompts=str(prompts), out_dir=str(root / "data"),
                              max_new_tokens=12, batch_size=16, heldout_fraction=0.2, top_k_logprobs=8))
    return root


def args(root, out, *extra):
    return ["--target", str(root / "target"), "--data", str(root / "data"), "--out", str(out),
            "--cache", str(root / "cache"), "--device", "cpu", "--max-new-tokens", "16", *extra]


def test_search_ranks_every_candidate_and_trains_the_winner(target_and_data, tmp_path, capsys):
    out = tmp_path / "shapes"
    doc = search_draft_shape.main(args(target_and_data, out, "--layers", "1", "2", "--heads", "0", "24",
                                       "--k", "1", "2", "--steps", "4", "--cost-repeats", "2",
                                       "--train-full-steps", "2"))
    printed = json.loads(capsys.readouterr().out)  # stdout is the JSON, nothing else
    written = json.loads((out / "shapes.json").read_text())
    assert printed["candidates"] == written["candidates"] == json.loads(json.dumps(doc["candidates"]))
    rows = written["candidates"]
    assert sorted(r["name"] for r in rows) == ["layers1-full", "layers1-head24", "layers2-full", "layers2-head24"]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert written["alpha_key"] == "heldout/top1_agreement" and written["ks"] == [1, 2]
    for r in rows:
        assert r["layers"] in (1, 2) and r["head"] in (0, 24) and r["parameters"] > 0 and r["train_s"] > 0
        assert 0.0 <= r["alpha"] <= 1.0
        for k in ("1", "2"):
            assert math.isfinite(r["c"][k]) and r["c"][k] > 0 and math.isfinite(r["c_v"][k]) and r["c_v"][k] > 0
            assert math.isclose(r["predicted_speedup"][k], predicted_speedup(r["alpha"], int(k), r["c"][k], r["c_v"][k]))
        assert r["speedup_at_best_k"] == max(r["predicted_speedup"].values())
        assert r["speedup_at_best_k"] == r["predicted_speedup"][str(r["best_k"])]
        assert (Path(r["draft"]) / "config.json").is_file()
        assert (r["head_coverage_heldout"] is None) == (r["head"] == 0)
    speedups = [r["speedup_at_best_k"] for r in rows]
    assert speedups == sorted(speedups, reverse=True)  # the ranks follow the predicted speedups
    assert written["winner"]["name"] == rows[0]["name"]
    # the reduced head's ids sit beside its training; the metrics say the head was trained on 24 ids
    for r in rows:
        vocab = out / r["name"] / "draft_vocab.json"
        assert vocab.is_file() == (r["head"] == 24)
        metrics = json.loads((out / r["name"] / "train" / "train_metrics.json").read_text())
        assert (metrics["reduced_head"] is not None) == (r["head"] == 24)
        assert metrics["final"]["heldout/top1_agreement"] == r["alpha"]
    png = out / "shapes.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    full = written["winner"]["full_training"]
    assert full["candidate"] == rows[0]["name"] and full["steps"] == 2
    assert (Path(full["draft"]) / "config.json").is_file() and full["draft"].startswith(str(out / "winner"))


def test_a_second_run_reuses_finished_trainings_and_retrains_changed_ones(target_and_data, tmp_path, capsys):
    out = tmp_path / "again"
    extra = ("--layers", "1", "--k", "1", "--steps", "2", "--cost-repeats", "1")
    first = search_draft_shape.main(args(target_and_data, out, *extra))
    capsys.readouterr()
    second = search_draft_shape.main(args(target_and_data, out, *extra))
    assert "reusing the training" in capsys.readouterr().err
    assert [r["alpha"] for r in first["candidates"]] == [r["alpha"] for r in second["candidates"]]
    assert [r["train_s"] for r in first["candidates"]] == [r["train_s"] for r in second["candidates"]]
    third = search_draft_shape.main(args(target_and_data, out, *extra[:-3], "3", "--cost-repeats", "1"))
    assert "other settings; starting afresh" in capsys.readouterr().err
    metrics = json.loads((out / "layers1-full" / "train" / "train_metrics.json").read_text())
    assert metrics["history"]["train"][-1]["step"] == 3 and third["steps"] == 3


def test_chosen_layer_indices_are_a_candidate(target_and_data, tmp_path, capsys):
    out = tmp_path / "shapes"
    doc = search_draft_shape.main(args(target_and_data, out, "--layers", "0,-1", "1", "--k", "1", "--steps", "2",
                                       "--cost-repeats", "1"))
    rows = {r["name"]: r for r in doc["candidates"]}
    assert set(rows) == {"layers0_-1-full", "layers1-full"}
    assert rows["layers0_-1-full"]["layers"] == 2 and rows["layers0_-1-full"]["layer_indices"] == [0, -1]
    assert rows["layers1-full"]["layer_indices"] is None
    record = json.loads((Path(rows["layers0_-1-full"]["base_draft"]) / "layer_draft.json").read_text())
    assert record["indices"] == [0, 2]


def test_an_eagle_head_is_a_candidate_costed_trained_and_ranked_beside_cut_drafts(target_and_data, tmp_path, capsys):
    from draftsmith.decode.eagle import is_eagle_dir

    out = tmp_path / "shapes"
    doc = search_draft_shape.main(args(target_and_data, out, "--layers", "1", "--eagle", "--heads", "0", "24",
                                       "--k", "1", "2", "--steps", "4", "--cost-repeats", "1", "--train-full-steps", "2"))
    rows = {r["name"]: r for r in doc["candidates"]}
    assert set(rows) == {"layers1-full", "layers1-head24", "eagle-full", "eagle-head24"}
    for name in ("eagle-full", "eagle-head24"):
        r = rows[name]
        assert r["source"] == "eagle" and r["layers"] == 1 and r["base_draft"] is None
        assert is_eagle_dir(r["draft"])  # its brief training wrote a head in vLLM's layout
        assert r["c"]["1"] > 0 and 0.0 <= r["alpha"] <= 1.0
        metrics = json.loads((out / name / "train" / "train_metrics.json").read_text())
        assert metrics["kind"] == "eagle" and metrics["final"]["heldout/top1_agreement"] == r["alpha"]
    # fc + one layer of the target's: a fraction of a one-layer cut, which carries the embedding and the head too
    assert rows["eagle-full"]["parameters"] < rows["layers1-full"]["parameters"]
    speedups = [r["speedup_at_best_k"] for r in doc["candidates"]]
    assert speedups == sorted(speedups, reverse=True)
    full = doc["winner"]["full_training"]  # whichever won is trained further in its own kind
    assert full["candidate"] == doc["candidates"][0]["name"]
    assert is_eagle_dir(full["draft"]) == (doc["candidates"][0]["source"] == "eagle")


@pytest.mark.parametrize("extra, says", [
    (("--layers", "0"), "--layers 0: a draft keeps the target's first N decoder layers"),
    (("--layers", "2", "3"), "--layers 3: the target has 3 decoder layers, so a draft keeps 1..2"),
    (("--heads", "64"), "--heads 64: the vocabulary has"),
    (("--layers", "0,5"), "--layers 0,5: pair.draft_layers=[0, 5]: [5] out of range"),
    (("--k", "0"), "--k 0"),
    ((), "no candidate: give draft depths with --layers"),
    (("--layers", "1", "--eagle", "--backend", "hf"), "--eagle with --backend hf"),
])
def test_bad_flags_are_one_line_errors_naming_the_flag(target_and_data, tmp_path, capsys, extra, says):
    extra = extra if "--layers" in extra or not extra else ("--layers", "1", *extra)
    with pytest.raises(SystemExit) as exit_:
        search_draft_shape.main(args(target_and_data, tmp_path / "out", *extra))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    last = err.splitlines()[-1]  # before it: progress lines (building a draft, loading it)
    assert last.startswith("search_draft_shape: error: ") and says in last, err


def test_data_that_is_not_a_datagen_output_names_the_flag(target_and_data, tmp_path, capsys):
    argv = args(target_and_data, tmp_path / "out", "--layers", "1")
    argv[argv.index("--data") + 1] = str(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        search_draft_shape.main(argv)
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert exit_.value.code == 2 and "Traceback" not in err and last.startswith("search_draft_shape: error: ")
    assert f"--data {tmp_path}: " in last and "is not a datagen output" in last and "run the datagen stage" in last


def test_the_documented_command_parses():
    """docs/real-model.md's command names only flags the script has (the run above uses each of them)."""
    import shlex

    page = (Path(__file__).resolve().parent.parent / "docs" / "real-model.md").read_text()
    (command,) = [line for line in page.splitlines() if line.startswith("python scripts/search_draft_shape.py")]
    parsed = search_draft_shape.parse_args(shlex.split(command)[2:])
    assert parsed.layers == [2, 3, 4] and parsed.heads == [0, 8192] and parsed.k == [2, 3, 4] and parsed.steps == 60
    search_draft_shape.check_args(parsed)


def test_a_sibling_draft_is_a_candidate(target_and_data, tmp_path, tokenizer, capsys):
    sibling = tmp_path / "small"
    make_model("llama", seed=9, layers=1).save_pretrained(sibling)
    tokenizer.save_pretrained(sibling)
    doc = search_draft_shape.main(args(target_and_data, tmp_path / "out", "--sibling", str(sibling), "--k", "1",
                                       "--steps", "1", "--cost-repeats", "1"))
    (row,) = doc["candidates"]
    assert row["name"] == "sibling-small-full" and row["source"] == "sibling" and row["layers"] == 1
    assert row["base_draft"] == str(sibling.resolve()) and row["rank"] == 1


def test_a_sibling_that_is_not_a_model_and_data_of_another_target_name_the_flag(target_and_data, tmp_path, capsys):
    import shutil

    with pytest.raises(SystemExit):
        search_draft_shape.main(args(target_and_data, tmp_path / "out", "--sibling", str(tmp_path)))
    last = capsys.readouterr().err.splitlines()[-1]
    assert f"--sibling {tmp_path}: not a model directory (no config.json)" in last
    other = tmp_path / "other-target"
    shutil.copytree(target_and_data / "target", other)
    argv = args(target_and_data, tmp_path / "out", "--layers", "1")
    argv[argv.index("--target") + 1] = str(other)
    with pytest.raises(SystemExit):
        search_draft_shape.main(argv)
    last = capsys.readouterr().err.splitlines()[-1]
    assert f"--data {target_and_data / 'data'} was generated by" in last and f"not by --target '{other}'" in last


def test_the_verify_cost_is_pooled_over_the_candidates():
    costed = [{"costs": {"c": {2: 0.1}, "c_v": {2: v}}} for v in (1.1, 1.3, 1.2)]
    out = search_draft_shape.pooled_verify_costs(costed)
    assert [c["costs"]["c_v"][2] for c in out] == [1.2, 1.2, 1.2]
    assert [c["costs"]["c_v_own"][2] for c in out] == [1.1, 1.3, 1.2]
    assert all(c["costs"]["c"] == {2: 0.1} for c in out)
