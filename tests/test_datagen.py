"""datagen: prompt sources, filtering and split, batched target generation, top-k log-probs, atomic output."""

import json

import pytest
import torch

from conftest import make_model, make_tokenizer
from draftsmith.train.datagen import DatagenConfig, generate_all, load_output, run
from draftsmith.train.prompts import PromptError, PromptSource, in_heldout, prepare_prompts, read_prompts


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("models") / "target"
    make_model("llama", seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def word_prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(2, 10, (1,), generator=gen))
        out.append(" ".join(f"w{int(i)}" for i in torch.randint(0, 60, (length,), generator=gen)))
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_prompts_and_missing_field(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 w2"}, {"prompt": "w3"}])
    assert read_prompts(PromptSource(str(f)), tokenizer) == ["w1 w2", "w3"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "w1", "id": 3}])
    with pytest.raises(PromptError, match=r"bad.jsonl:1: no field 'prompt'.*\['id', 'text'\]"):
        read_prompts(PromptSource(str(bad)), tokenizer)
    assert read_prompts(PromptSource(str(bad), field="text"), tokenizer) == ["w1"]


def test_chat_messages_need_a_chat_template(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "w1"}]}])
    with pytest.raises(PromptError, match="no chat template"):
        read_prompts(PromptSource(str(f)), tokenizer)
    tokenizer = make_tokenizer()  # a fresh one: the session fixture stays without a template
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w0{% endif %}"
    assert read_prompts(PromptSource(str(f)), tokenizer) == ["w1 w0"]


def test_parquet_and_folder_sources(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["w1 w2", "w5"]}), tmp_path / "p.parquet")
    assert read_prompts(PromptSource(str(tmp_path / "p.parquet"), field="question"), tokenizer) == ["w1 w2", "w5"]
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(" ".join(f"w{i}" for i in range(10)))
    (folder / "skip.bin").write_text("w1 w2 w3 w4")
    chunks = read_prompts(PromptSource(str(folder), chunk_tokens=4), tokenizer)
    assert chunks == ["w0 w1 w2 w3", "w4 w5 w6 w7"]  # the 2-token tail is dropped


def test_unreachable_dataset_is_a_clear_error(tokenizer):
    with pytest.raises(PromptError, match="neither a local file/folder nor a loadable HF dataset"):
        read_prompts(PromptSource("no-such-org/no-such-dataset"), tokenizer)


def test_prepare_dedupes_filters_and_splits_by_hash(tokenizer):
    texts = word_prompts(200) + ["w1 w2"] * 3 + [" ".join(["w1"] * 40)]
    prep = prepare_prompts(texts, tokenizer, max_prompt_tokens=20, heldout_fraction=0.2)
    assert prep.counts["too_long"] == 1 and prep.counts["duplicates"] >= 2
    assert 10 < len(prep.heldout) < 70 and len(prep.train) + len(prep.heldout) == len(set(texts)) - 1
    held = {tuple(p) for p in prep.heldout}
    assert not held & {tuple(p) for p in prep.train}
    # the split depends on the text only: a shuffled source gives the same held-out set
    again = prepare_prompts(list(reversed(texts)), tokenizer, max_prompt_tokens=20, heldout_fraction=0.2)
    assert {tuple(p) for p in again.heldout} == held
    assert in_heldout("anything", 0.0) is False


def test_greedy_batched_completions_equal_the_targets_own_generate(target_dir, tokenizer):
    model = make_model("llama", seed=0)
    prompts = [tokenizer(t).input_ids for t in word_prompts(12, seed=3)]
    cfg = DatagenConfig(target=str(target_dir), prompts="-", out_dir="-", max_new_tokens=12,
                        batch_size=5, top_k_logprobs=3)
    model.generation_config.eos_token_id = 2
    rows = generate_all(model, tokenizer, prompts, cfg, "test")
    assert [r["prompt_index"] for r in rows] == list(range(12))
    for row, ids in zip(rows, prompts):
        ref = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, pad_token_id=0)[0, len(ids):]
        assert row["completion_ids"] == ref.tolist()
        # top-k log-probs are the target's at each completion position
        with torch.no_grad():
            full = torch.tensor([ids + row["completion_ids"]])
            logp = torch.log_softmax(model(input_ids=full).logits[0, len(ids) - 1 : -1], -1)
        top = torch.topk(logp, 3, -1)
        assert row["topk_ids"] == top.indices.tolist()
        assert torch.allclose(torch.tensor(row["topk_logprobs"]), top.values, atol=1e-4)


def test_run_writes_dataset_and_manifest(tmp_path, target_dir):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": t} for t in word_prompts(30, seed=5)])
    out = tmp_path / "datagen"
    manifest = run(DatagenConfig(target=str(target_dir), prompts=str(prompts), out_dir=str(out),
                                 max_new_tokens=6, batch_size=8, heldout_fraction=0.2, temperature=0.9,
                                 n_completions=2, top_k_logprobs=2))
    ds, m = load_output(out)
    assert m == json.loads(json.dumps(manifest, default=str))
    assert len(ds["train"]) == 2 * manifest["counts"]["train"] and len(ds["heldout"]) == 2 * manifest["counts"]["heldout"]
    row = ds["train"][0]
    assert len(row["topk_ids"]) == len(row["completion_ids"]) and len(row["topk_ids"][0]) == 2
    assert manifest["tokenizer_hash"] and manifest["config"]["temperature"] == 0.9
    assert manifest["timing"]["tokens_per_s"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["datagen", "p.jsonl"]


def test_too_few_prompts_fails_before_generation(tmp_path, target_dir):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "w1 w2"}])
    with pytest.raises(ValueError, match="only 1 usable training prompts"):
        run(DatagenConfig(target=str(target_dir), prompts=str(prompts), out_dir=str(tmp_path / "o"),
                          heldout_fraction=0.0, min_prompts=5))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kwargs, match", [(dict(n_completions=2), "needs data.temperature > 0"),
                                           (dict(max_new_tokens=0), "data.max_new_tokens"),
                                           (dict(top_k_logprobs=-1), "data.top_k_logprobs"),
                                           (dict(chunk_tokens=0), "data.chunk_tokens")])
def test_config_errors_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DatagenConfig(target="t", prompts="p", out_dir="o", **kwargs)
