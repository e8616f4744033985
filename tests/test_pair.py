"""load_pair: loading from directories, tokenizer checks with clear errors, padded vocab tables."""

import pytest

from conftest import SPECIALS, WORDS, make_model, make_tokenizer
from draftsmith.decode import PairError, load_pair, speculative_generate
from draftsmith.decode.pair import check_tokenizers, load_model


def save(tmp_path, name, model, tokenizer):
    path = tmp_path / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_load_pair_from_directories_and_decode(tmp_path, tokenizer):
    t = save(tmp_path, "target", make_model("llama", seed=0), tokenizer)
    d = save(tmp_path, "draft", make_model("qwen2", seed=1, layers=1), tokenizer)
    pair = load_pair(t, d, dtype="float32")
    assert not pair.target.training and not pair.draft.training
    assert pair.tokenizer.get_vocab() == tokenizer.get_vocab()
    ids = pair.tokenizer("w1 w2 w3", return_tensors="pt").input_ids
    out = speculative_generate(pair.target, pair.draft, ids, k=3, max_new_tokens=5)
    assert out.sequences.shape == (1, ids.shape[1] + 5)


def test_padded_draft_vocab_is_accepted(tmp_path, tokenizer):
    """Like Qwen: config vocab_size (80) larger than the tokenizer (64)."""
    t = save(tmp_path, "target", make_model("qwen2", seed=0), tokenizer)
    d = save(tmp_path, "draft", make_model("qwen2", seed=1, layers=1, vocab_size=80), tokenizer)
    pair = load_pair(t, d)
    assert pair.draft.config.vocab_size == 80 and pair.target.config.vocab_size == 64


def test_different_vocab_is_a_clear_error(tmp_path, tokenizer):
    t = save(tmp_path, "target", make_model("llama", seed=0), tokenizer)
    other = make_tokenizer(WORDS[:-1] + ["zz"])
    d = save(tmp_path, "draft", make_model("llama", seed=1), other)
    with pytest.raises(PairError) as err:
        load_pair(t, d)
    msg = str(err.value)
    assert str(t) in msg and str(d) in msg and "'w59' only in" in msg


def test_same_tokens_different_ids_is_a_clear_error():
    a = make_tokenizer()
    b = make_tokenizer(list(reversed(WORDS)))
    with pytest.raises(PairError, match=r"token 'w0' has id 4 in tgt but 63 in dft"):
        check_tokenizers(a, b, "tgt", "dft")


def test_different_special_tokens_is_a_clear_error():
    a = make_tokenizer()
    b = make_tokenizer()
    b.eos_token = "<pad>"
    with pytest.raises(PairError, match="special tokens .* differ at eos_token"):
        check_tokenizers(a, b)


def test_model_narrower_than_tokenizer_is_a_clear_error(tmp_path, tokenizer):
    t = save(tmp_path, "target", make_model("llama", seed=0), tokenizer)
    d = save(tmp_path, "draft", make_model("llama", seed=1, vocab_size=32), tokenizer)
    with pytest.raises(PairError, match="32 output logits but its tokenizer has 64 tokens"):
        load_pair(t, d)


def test_missing_model_is_a_clear_error(tmp_path, tokenizer):
    t = save(tmp_path, "target", make_model("llama", seed=0), tokenizer)
    with pytest.raises(PairError, match="the draft model .*nowhere does not exist"):
        load_pair(t, tmp_path / "nowhere")
    with pytest.raises(PairError, match="the draft model .*nowhere does not exist"):  # not the hub's "Repo id must be"
        load_model(tmp_path / "nowhere", "draft")


def test_unknown_dtype_is_a_clear_error(tmp_path, tokenizer):
    t = save(tmp_path, "target", make_model("llama", seed=0), tokenizer)
    with pytest.raises(PairError, match="unknown dtype 'float99'"):
        load_pair(t, t, dtype="float99")


def test_eos_comes_from_the_generation_config(tmp_path, tokenizer):
    model = make_model("llama", seed=0)
    model.generation_config.eos_token_id = [2, 5]
    t = save(tmp_path, "target", model, tokenizer)
    pair = load_pair(t, t)
    assert pair.eos_token_id == [2, 5]
    assert SPECIALS[2] == "</s>" and pair.tokenizer.eos_token_id == 2
