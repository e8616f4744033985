"""A reduced draft vocabulary (decode/vocab.py): ranking, the restricted head, and that decoding stays exact.

Greedy speculative output must equal plain decoding's, and rejection sampling must follow the target's
distribution, whatever tokens the draft may not propose; the restriction must really be in force
(a draft that would agree with the target is refused the tokens outside the set).
"""

import json

import pytest
import torch

from conftest import make_model, perturbed_copy
from draftsmith.decode import autoregressive_generate, speculative_generate
from draftsmith.decode.lean import LeanModel
from draftsmith.decode.runners import RestrictedRunner, make_runner, runner_name
from draftsmith.decode.vocab import coverage, frequency_vocab, load_vocab, save_vocab
from stubs import random_table, scripted
from test_pipeline import pair as pair  # noqa: F401  (the tiny model pair fixture)
from test_sampling_distribution import PROMPT, V, chi_square_p, exact_first, sample_first, tv
from test_sampling_distribution import pair as marginal


def test_frequency_vocab_ranks_what_the_target_says_then_its_alternatives_then_the_prompts():
    completions = [[5, 5, 3], [3, 5, 7]]  # said: 5 x3, 3 x2, 7 x1
    alternatives = [[[9, 2], [9, 5]], [[2, 9]]]  # top-k ids per position: 9 x3, 2 x2, 5 x1
    prompts = [[11, 11, 12], [4]]  # 11 x2, 12 x1, 4 x1
    rank = lambda n, **kw: frequency_vocab(completions, n, 16, alternatives=alternatives, prompts=prompts, **kw).tolist()
    assert rank(1) == [5]
    assert rank(3) == [3, 5, 7]
    assert rank(4) == [3, 5, 7, 9]  # 9: never said, most often an alternative
    assert rank(5) == [2, 3, 5, 7, 9]
    assert rank(6) == [2, 3, 5, 7, 9, 11]  # then the prompts' tokens
    assert rank(8) == [2, 3, 4, 5, 7, 9, 11, 12]  # ties (4 and 12 once each) by id
    assert rank(3, always=[0]) == [0, 3, 5] and rank(2, always=[0]) == [0, 5]  # EOS kept, and counted in the size
    assert frequency_vocab([[3, 40]], 5, 16).tolist() == [3]  # ids outside the width are dropped
    with pytest.raises(ValueError, match="size must be >= 1"):
        frequency_vocab(completions, 0, 16)


def test_coverage_by_hand():
    ids = torch.tensor([3, 5])
    assert coverage(ids, [[3, 5, 7], [5]]) == pytest.approx(3 / 4)
    assert coverage(ids, []) is None


def test_save_and_load_round_trip_and_a_bad_file_names_itself(tmp_path):
    ids = torch.tensor([2, 9, 30])
    path = save_vocab(tmp_path, ids, source="here")
    assert path.name == "draft_vocab.json" and json.loads(path.read_text())["size"] == 3
    assert load_vocab(tmp_path).tolist() == [2, 9, 30]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: not a draft vocabulary file"):
        load_vocab(tmp_path / "bad.json")


@torch.inference_mode()
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_lean_head_computes_only_the_kept_rows_and_equals_the_full_logits_there(arch):
    model = make_model(arch, seed=1, layers=2, hidden=32)
    width = model.get_output_embeddings().weight.shape[0]
    ids = torch.tensor([1, 4, 7, 20, 33])
    tokens = torch.tensor([[3, 8, 2, 9, 14]])
    full = LeanModel(model, 32).forward(tokens, keep=3)
    lean = make_runner(model, "lean", 32, vocab=ids)
    assert isinstance(lean, RestrictedRunner) and lean.sliced and runner_name(lean) == "lean"
    assert lean.runner.head[0].shape[0] == len(ids)  # the head product streams only the kept rows
    cut = lean.forward(tokens, keep=3)
    hf = make_runner(model, "hf", vocab=ids)
    assert isinstance(hf, RestrictedRunner) and not hf.sliced and runner_name(hf) == "hf"
    cut_hf = hf.forward(tokens, keep=3)
    assert cut.shape == cut_hf.shape == (3, width)
    torch.testing.assert_close(cut[:, ids], full[:, ids])
    torch.testing.assert_close(cut_hf[:, ids], full[:, ids], rtol=1e-4, atol=1e-4)
    others = torch.ones(width, dtype=torch.bool)
    others[ids] = False
    assert torch.isneginf(cut[:, others]).all() and torch.isneginf(cut_hf[:, others]).all()
    # next tokens after the block: still the kept rows of the same forward
    torch.testing.assert_close(lean.forward(torch.tensor([[5]]), keep=1)[0, ids],
                               LeanModel(model, 32).forward(torch.tensor([[3, 8, 2, 9, 14, 5]]), keep=1)[0, ids])


def test_a_vocabulary_id_outside_the_head_is_a_clear_error():
    model = make_model("llama", seed=1, layers=1, hidden=16)
    width = model.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=rf"ids must be in \[0, {width}\)"):
        make_runner(model, "lean", 16, vocab=torch.tensor([0, width]))
    with pytest.raises(ValueError, match="empty"):
        make_runner(model, "hf", vocab=torch.tensor([], dtype=torch.long))


@pytest.mark.parametrize("backend", ["lean", "hf"])
def test_greedy_with_a_reduced_draft_vocabulary_equals_plain_decoding(backend):
    target = make_model("llama", seed=2, layers=2, hidden=32)
    draft = perturbed_copy(target, 0.3)
    prompts = [torch.tensor([[5, 9, 30, 2]]), torch.tensor([[40]])]
    refs = [autoregressive_generate(target, p, max_new_tokens=24, backend=backend).sequences for p in prompts]
    said = sorted({t for r, p in zip(refs, prompts) for t in r[0, p.shape[1]:].tolist()})
    for ids in (torch.tensor(said[: len(said) // 2]), torch.tensor(said), torch.arange(3)):
        for p, ref in zip(prompts, refs):
            for k in (1, 3):
                out = speculative_generate(target, draft, p, k=k, max_new_tokens=24, backend=backend, draft_vocab=ids)
                assert torch.equal(out.sequences, ref), (ids.tolist(), k)


def test_the_restriction_is_in_force():
    """Draft and target script the same tokens: full acceptance, until the draft may not say them."""
    script = [0, 5, 5, 6, 5, 6, 5, 5, 6]
    target, draft = scripted(script, V), scripted(script, V)
    prompt = torch.tensor([[0]])
    full = speculative_generate(target, draft, prompt, k=2, max_new_tokens=7)
    no_five = speculative_generate(target, draft, prompt, k=2, max_new_tokens=7,
                                   draft_vocab=torch.tensor([0, 1, 2, 3, 4, 6, 7]))
    assert torch.equal(full.sequences, no_five.sequences)
    assert full.stats.rejected == 0 and full.stats.accepted > 0
    assert no_five.stats.rejected > 0 and no_five.stats.accepted < full.stats.accepted


def test_sampling_with_a_reduced_draft_vocabulary_follows_the_target():
    """q is 0 outside the kept ids, where the target has mass: the resampling covers them exactly."""
    target, draft = random_table(V, seed=10), random_table(V, seed=11)
    ids = torch.tensor([1, 3, 4, 6])
    exact = exact_first(target, PROMPT, 1.0, 0, 1.0)
    assert float(exact.sum(dim=(1, 2))[[0, 2, 5, 7]].sum()) > 0.2  # the excluded ids carry real target mass
    counts, stats = sample_first(lambda g: speculative_generate(target, draft, PROMPT, k=2, max_new_tokens=4,
                                                                temperature=1.0, generator=g, draft_vocab=ids),
                                 n=6000, seed=0)
    assert sum(s.accepted for s in stats) > 1000  # the draft's proposals are tested, not all refused
    assert chi_square_p(counts, exact) > 1e-3
    assert tv(marginal(counts, 0), marginal(exact, 0)) < 0.05 and tv(marginal(counts, 1), marginal(exact, 1)) < 0.05


# -- the pipeline: eval.draft_vocab ------------------------------------------------------------------

def test_the_pipeline_evaluates_with_a_reduced_draft_vocabulary_and_registers_it(pair, tmp_path, monkeypatch, capsys):
    from test_pipeline import run_cli, tiny_args

    from draftsmith.registry import LocalRegistry

    run_cli(monkeypatch, tiny_args(pair, tmp_path, "eval.draft_vocab=12"))
    out = tmp_path / "run"
    metrics = json.loads((out / "eval/metrics.json").read_text())
    info = metrics["draft_vocab"]
    assert info["size"] == 12 and info["source"] == str(out / "datagen") and 0 < info["heldout_coverage"] <= 1
    ids = load_vocab(out / "eval/draft_vocab.json")
    assert len(ids) == 12
    import datasets

    data = datasets.load_from_disk(str(out / "datagen/data"))
    said = [t for row in data["train"]["completion_ids"] for t in row]
    most = max(set(said), key=said.count)
    assert most in ids.tolist()  # the token the target says most is kept
    heldout = data["heldout"]["completion_ids"]
    assert info["heldout_coverage"] == pytest.approx(coverage(ids, heldout))
    assert all(r["greedy_match"] == 1.0 for r in metrics["records"])
    assert "Draft vocabulary (`eval.draft_vocab=12`)" in (out / "eval/report.md").read_text()
    assert "draft vocabulary: every draft proposed only the 12 tokens" in capsys.readouterr().out
    version = LocalRegistry(tmp_path / "registry").path("tiny", 1)
    assert load_vocab(version / "draft_vocab.json").tolist() == ids.tolist()

    # the full-vocabulary eval is another eval set: its speedups are not compared with these
    run_cli(monkeypatch, tiny_args(pair, tmp_path, "eval.draft_vocab=0"))
    full = json.loads((out / "eval/metrics.json").read_text())
    assert full["draft_vocab"] is None and full["eval_set"] != metrics["eval_set"]
    assert not (out / "eval/draft_vocab.json").exists()


def test_draft_vocab_without_a_datagen_output_fails_before_any_work(pair, tmp_path, monkeypatch, capsys):
    from test_pipeline import run_cli, tiny_args

    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, tiny_args(pair, tmp_path, "stages=[eval]", "eval.draft_vocab=64"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "eval.draft_vocab=64" in err and "add datagen to stages" in err
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, tiny_args(pair, tmp_path, "eval.draft_vocab=-1"))
    assert "eval.draft_vocab must be an integer >= 0" in capsys.readouterr().err


def test_the_lean_forward_and_the_vocabulary_do_not_import_each_other():
    """decode/runners.py makes the one slice-or-mask decision: lean.py slices the rows it is given, vocab.py knows
    no runner."""
    from test_import_direction import ROOT, imported_modules

    assert not any(n.startswith("draftsmith.decode.vocab") for n in imported_modules(ROOT / "decode" / "lean.py"))
    assert not any(n.startswith(("draftsmith.decode.lean", "draftsmith.decode.runners"))
                   for n in imported_modules(ROOT / "decode" / "vocab.py"))
