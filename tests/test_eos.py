"""The one EOS resolver (decode/eos.py): the generation config's id or list, else the tokenizer's."""

from types import SimpleNamespace

from conftest import make_model
from draftsmith.decode.eos import eos_ids, eos_token_id, pretrained_eos_ids

TOKENIZER = SimpleNamespace(eos_token_id=2)


def test_the_generation_config_wins_and_the_tokenizer_fills_in():
    assert eos_token_id(SimpleNamespace(eos_token_id=[2, 5]), TOKENIZER) == [2, 5]
    assert eos_token_id(SimpleNamespace(eos_token_id=7), TOKENIZER) == 7
    assert eos_token_id(SimpleNamespace(eos_token_id=None), TOKENIZER) == 2
    assert eos_token_id(None, TOKENIZER) == 2  # a model without a generation config
    assert eos_token_id(SimpleNamespace(eos_token_id=None)) is None  # no tokenizer given: none
    assert eos_ids(SimpleNamespace(eos_token_id=[2, 5]), TOKENIZER) == {2, 5}
    assert eos_ids(SimpleNamespace(eos_token_id=7), TOKENIZER) == {7}
    assert eos_ids(None, SimpleNamespace(eos_token_id=None)) == set()


def test_a_saved_models_eos_without_loading_its_weights(tmp_path, tokenizer):
    model = make_model("llama", seed=0)
    model.generation_config.eos_token_id = [2, 5]
    model.save_pretrained(tmp_path / "with")
    assert pretrained_eos_ids(tmp_path / "with", tokenizer) == {2, 5}
    model.config.save_pretrained(tmp_path / "config-only")  # no generation_config.json: derived from config.json
    assert pretrained_eos_ids(tmp_path / "config-only", tokenizer) == eos_ids(model.config, tokenizer)
