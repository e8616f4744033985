"""Checkpoints of a draft with a tied head: saved without accelerate's per-checkpoint "Removed shared tensor"
warning (the tied head is stored once, as transformers stores it), while any other shared tensor is still said."""

import logging

from transformers import LlamaConfig, LlamaForCausalLM

from draftsmith.train.checkpoints import _TiedTensorsExpected, latest_checkpoint, save_checkpoint, tied_parameter_names


def tied_llama():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 0, message, None, None)


def test_tied_parameter_names_finds_the_tied_head():
    assert tied_parameter_names(tied_llama()) == {"lm_head.weight"}
    untied = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    assert tied_parameter_names(untied) == set()


def test_the_filter_drops_only_the_expected_tied_tensors():
    quiet = _TiedTensorsExpected({"lm_head.weight"})
    tail = " while saving. This should be OK, but check by verifying that you don't receive any warning while reloading"
    assert not quiet.filter(record("Removed shared tensor {'lm_head.weight'}" + tail))
    assert not quiet.filter(record("Removed shared tensor {'module.lm_head.weight'}" + tail))  # DDP's wrapper
    assert quiet.filter(record("Removed shared tensor {'lm_head.weight', 'other.weight'}" + tail))
    assert quiet.filter(record("Removed shared tensor {'other.weight'}" + tail))
    assert quiet.filter(record("something else entirely"))


def test_checkpoints_of_a_tied_draft_do_not_warn(tmp_path, caplog):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(tied_llama())
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):
            save_checkpoint(accelerator, tmp_path, step, {"train": []}, keep=2, tied=tied_parameter_names(model))
    assert not [r for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    assert latest_checkpoint(tmp_path)[1] == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # without the names it is said: the test can fail
        save_checkpoint(accelerator, tmp_path, 3, {"train": []}, keep=2)
    assert [r for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    accelerator.end_training()
