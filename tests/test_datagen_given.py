"""data.responses=given|auto: records that carry a response, read exactly, scored by the target in one forward."""

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from conftest import EOS_ID, WORDS, make_model, make_tokenizer
from draftsmith.decode.eos import eos_ids
from draftsmith.train.datagen import DatagenConfig, generate_all, given_completion, load_output, run, score_all, \
    score_batch
from draftsmith.train.prompts import PromptError, PromptSource, in_heldout, read_prompts, read_records

ROOT = Path(__file__).resolve().parent.parent
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"  # no end-of-turn token
         "{% if add_generation_prompt %}assistant{% endif %}")
TURN_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
STYLES = {"llama3": (LLAMA3, "<|eot_id|>"), "chatml": (CHATML, "<|im_end|>")}
CHAT = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3 w4 w5"},
        {"role": "assistant", "content": "w6 w7 w8"}]


def chat_tokenizer(style: str):
    """A word-level tokenizer with the style's turn tokens as special tokens, its end of turn as EOS, and a newline
    token (as real templates' "\n" after the end of a turn is one: the response must be cut after the EOS)."""
    template, end_of_turn = STYLES[style]
    tokenizer = make_tokenizer(WORDS + ["system", "user", "assistant"] + TURN_TOKENS)
    tokenizer.add_special_tokens({"additional_special_tokens": TURN_TOKENS})
    tokenizer.add_tokens(["\n"])
    tokenizer.eos_token = end_of_turn
    tokenizer.chat_template = template
    return tokenizer


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def words(i: int, n: int) -> str:
    return " ".join(f"w{(i * 7 + j * 3) % 60}" for j in range(n))


from test_datagen import target_dir  # noqa: E402,F401 - the tiny target of the datagen tests


def config(target, prompts, out, **kwargs):
    settings = dict(max_new_tokens=8, batch_size=4, heldout_fraction=0.25, top_k_logprobs=4)
    return DatagenConfig(target=str(target), prompts=str(prompts), out_dir=str(out), **{**settings, **kwargs})


# -- scoring --------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scored_logprobs_equal_a_full_forward_and_padding_changes_nothing(arch):
    model = make_model(arch, seed=1)
    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(4, 64, (p,), generator=gen).tolist(), torch.randint(4, 64, (r,), generator=gen).tolist())
            for p, r in [(3, 9), (11, 2), (1, 5), (6, 6)]]
    batched = score_batch(model, rows, 5, pad=0, device="cpu")
    for (prompt, response), (ids, logprobs) in zip(rows, batched):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)  # position p + j - 1 predicts token j
        top = torch.topk(logp, 5, -1)
        assert len(ids) == len(response) and ids == top.indices.tolist()
        assert torch.allclose(torch.tensor(logprobs), top.values, atol=1e-5)
        (alone_ids, alone_logprobs), = score_batch(model, [(prompt, response)], 5, pad=0, device="cpu")
        assert alone_ids == ids and torch.allclose(torch.tensor(alone_logprobs), torch.tensor(logprobs), atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scoring_generated_completions_gives_what_generate_recorded(arch, tokenizer):
    model = make_model(arch, seed=0)
    model.generation_config.eos_token_id = EOS_ID
    prompts = [tokenizer(words(i, 2 + i % 9)).input_ids for i in range(11)]
    cfg = DatagenConfig(target="-", prompts="-", out_dir="-", max_new_tokens=12, batch_size=4, top_k_logprobs=4)
    generated = generate_all(model, tokenizer, prompts, cfg, "generate")
    scored, truncated = score_all(model, tokenizer, [r["prompt_ids"] for r in generated],
                                  [r["completion_ids"] for r in generated], cfg, "score")
    assert truncated == 0
    for g, s in zip(generated, scored):
        assert s["completion_ids"] == g["completion_ids"] and s["finished"] == g["finished"]
        assert s["topk_ids"] == g["topk_ids"]
        assert torch.allclose(torch.tensor(s["topk_logprobs"]), torch.tensor(g["topk_logprobs"]), atol=1e-4)


def test_given_completion_ends_at_eos_and_at_max_new_tokens():
    assert given_completion([5, 6, 2, 7], {2}, 8) == ([5, 6, 2], True, False)
    assert given_completion([5, 6, 7], {2}, 8) == ([5, 6, 7], False, False)
    assert given_completion([5, 6, 7, 8, 2], {2}, 3) == ([5, 6, 7], False, True)


# -- reading records with a response -------------------------------------------------------------
def test_given_completions_are_kept_token_for_token(tmp_path, target_dir, tokenizer):
    texts = [(words(i, 3 + i % 4), words(i + 1, 2 + i % 5) + (" </s> w9" if i % 3 == 0 else "")) for i in range(16)]
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p, "completion": c} for p, c in texts])
    manifest = run(config(target_dir, prompts, tmp_path / "out", responses="given"))
    ds, _ = load_output(tmp_path / "out")
    expect = {}
    for p, c in texts:
        ids = tokenizer(c, add_special_tokens=False).input_ids
        end = ids.index(EOS_ID) + 1 if EOS_ID in ids else len(ids)
        expect[tuple(tokenizer(p).input_ids)] = (ids[:end], EOS_ID in ids)
    rows = [row for split in ("train", "heldout") for row in ds[split]]
    assert len(rows) == len(texts) and any(r["finished"] for r in rows) and not all(r["finished"] for r in rows)
    for row in rows:
        assert (row["completion_ids"], row["finished"]) == expect[tuple(row["prompt_ids"])]
        assert len(row["topk_ids"]) == len(row["completion_ids"])
    assert manifest["responses"]["given"] == len(texts) and manifest["responses"]["generated"] == 0
    assert manifest["counts"]["completion_tokens"] == sum(len(r["completion_ids"]) for r in rows)


@pytest.mark.parametrize("style, after_eos", [("llama3", 0), ("chatml", 1)])  # ChatML ends a turn "<|im_end|>\n"
def test_chat_template_split_is_exact(tmp_path, style, after_eos):
    tokenizer = chat_tokenizer(style)
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    (record,) = read_records(PromptSource(str(f)), tokenizer, "given")
    whole = tokenizer(tokenizer.apply_chat_template(CHAT, tokenize=False)).input_ids
    prompt = tokenizer(record.text).input_ids
    assert prompt + record.response == whole
    assert record.text == tokenizer.apply_chat_template(CHAT[:-1], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(record.response[:3]) == "w6 w7 w8"
    tokens, finished, _ = given_completion(record.response, eos_ids(GenerationConfig(), tokenizer), 64)
    assert finished and tokens[-1] == tokenizer.eos_token_id
    assert tokens == record.response[: len(record.response) - after_eos]
    # a template that ends the turn without an EOS token: the response is not finished
    tokenizer.chat_template = PLAIN
    (plain,) = read_records(PromptSource(str(f)), tokenizer, "given")
    assert given_completion(plain.response, eos_ids(GenerationConfig(), tokenizer), 64)[1] is False


def test_chat_end_to_end_rows_carry_the_split(tmp_path):
    tokenizer = chat_tokenizer("chatml")
    target = tmp_path / "target"
    make_model("llama", seed=0, vocab_size=len(tokenizer)).save_pretrained(target)  # qwen2: its own tokenizer class
    tokenizer.save_pretrained(target)
    chats = [[{"role": "user", "content": words(i, 3)}, {"role": "assistant", "content": words(i + 2, 1 + i % 4)}]
             for i in range(12)]
    prompts = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in chats])
    run(config(target, prompts, tmp_path / "out", responses="given"))
    ds, _ = load_output(tmp_path / "out")
    rows = {tuple(row["prompt_ids"]): row for split in ("train", "heldout") for row in ds[split]}
    assert len(rows) == len(chats)
    for chat in chats:
        whole = tokenizer(tokenizer.apply_chat_template(chat, tokenize=False)).input_ids
        row = rows[tuple(tokenizer(tokenizer.apply_chat_template(chat[:1], tokenize=False,
                                                                  add_generation_prompt=True)).input_ids)]
        assert row["prompt_ids"] + row["completion_ids"] + [tokenizer.convert_tokens_to_ids("\n")] == whole
        assert row["finished"] and row["completion_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_a_template_that_does_not_split_at_the_assistant_turn_is_an_error(tmp_path):
    tokenizer = chat_tokenizer("chatml")
    # the generation prompt says "assistant", the rendered turn says "system": the prompt is no prefix
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}system{% else %}{{ m['role'] }}"
                               "{% endif %} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}assistant"
                               "{% endif %}")
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[1:]}, {"messages": CHAT}])
    with pytest.raises(PromptError, match=r"chat.jsonl:1: the chat template does not split at the assistant turn"):
        read_records(PromptSource(str(f)), tokenizer, "auto")
    assert len(read_prompts(PromptSource(str(f)), tokenizer)) == 2  # generate reads no response: no split needed


def test_generate_leaves_a_final_assistant_turn_out_of_the_prompt(tmp_path, target_dir, tokenizer):
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[1:]}])
    chat_tok = chat_tokenizer("chatml")
    (text,) = read_prompts(PromptSource(str(f)), chat_tok)
    assert text == chat_tok.apply_chat_template(CHAT[1:2], tokenize=False, add_generation_prompt=True)
    assert "w6" not in text
    (record,) = read_records(PromptSource(str(f)), chat_tok, "generate")
    assert record.response is None
    # end to end: the target answers the user turn; the given answer is nowhere in the row's prompt
    tokenizer = make_tokenizer(WORDS + ["user", "assistant", "answer"])
    tokenizer.chat_template = PLAIN
    target = tmp_path / "target"
    make_model("llama", seed=0, vocab_size=len(tokenizer)).save_pretrained(target)
    tokenizer.save_pretrained(target)
    chats = [[{"role": "user", "content": words(i, 3)}, {"role": "assistant", "content": "answer answer"}]
             for i in range(24)]  # both splits get rows (datasets cannot reload an empty split)
    prompts = write_jsonl(tmp_path / "many.jsonl", [{"messages": m} for m in chats])
    manifest = run(config(target, prompts, tmp_path / "out"))
    ds, _ = load_output(tmp_path / "out")
    answer = tokenizer.convert_tokens_to_ids("answer")
    rows = [row for split in ("train", "heldout") for row in ds[split]]
    assert len(rows) == 24 and all(answer not in row["prompt_ids"] for row in rows)
    assert all(tokenizer.decode(row["prompt_ids"]).endswith("assistant") for row in rows)
    assert (manifest["responses"]["mode"], manifest["responses"]["given"], manifest["responses"]["generated"]) == \
        ("generate", 0, 24)


# -- errors --------------------------------------------------------------------------------------
def test_given_without_a_response_names_the_record_and_auto(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"prompt": "w1", "completion": "w2"}, {"prompt": "w3"}]
    f = write_jsonl(tmp_path / "p.jsonl", records)
    with pytest.raises(PromptError, match=r"p.jsonl:2: the record carries no response.*data.responses=auto"):
        read_records(PromptSource(str(f)), tokenizer, "given")
    w2 = tokenizer.convert_tokens_to_ids("w2")
    assert [r.response for r in read_records(PromptSource(str(f)), tokenizer, "auto")] == [[w2], None]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "p.parquet")  # the second row's completion: null
    with pytest.raises(PromptError, match=r"p.parquet record 1: the record carries no response"):
        read_records(PromptSource(str(tmp_path / "p.parquet")), tokenizer, "given")


def test_a_response_longer_than_max_new_tokens_is_cut_counted_and_said(tmp_path, target_dir, capsys):
    records = [{"prompt": words(i, 3), "completion": words(i, 4 if i % 2 else 12)} for i in range(10)]
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    manifest = run(config(target_dir, prompts, tmp_path / "out", responses="given", max_new_tokens=6))
    ds, _ = load_output(tmp_path / "out")
    rows = [row for split in ("train", "heldout") for row in ds[split]]
    assert max(len(r["completion_ids"]) for r in rows) == 6 and not any(r["finished"] for r in rows)
    assert manifest["responses"]["truncated"] == 5
    assert "5 given responses were longer than data.max_new_tokens=6" in capsys.readouterr().out


def test_an_empty_prompt_file_is_an_error_naming_it(tmp_path, tokenizer, target_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PromptError, match=r"prompt file .*empty.jsonl has no records"):
        read_prompts(PromptSource(str(empty)), tokenizer)
    with pytest.raises(PromptError, match=r"empty.jsonl has no records"):
        run(config(target_dir, empty, tmp_path / "out", responses="given"))
    assert not (tmp_path / "out").exists()


def test_vllm_engine_scores_given_responses_from_prompt_logprobs(tmp_path, target_dir, tokenizer):
    """data.engine=vllm with data.responses=auto: records with a response are scored (one request each: prompt +
    response as the prompt, prompt_logprobs=k, one ignored token), the others generated, on one server; the rows
    keep the responses token for token and the top k of the response positions."""
    from test_datagen_vllm import FakeCompletions

    records = [{"prompt": words(i, 3), **({"completion": words(i + 9, 4)} if i % 2 else {})} for i in range(12)]
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    with FakeCompletions(delay_s=0.0) as fake:
        manifest = run(config(target_dir, prompts, tmp_path / "out", responses="auto", engine="vllm",
                              vllm={"url": fake.url}))
    scoring = [b for b in fake.bodies if "prompt_logprobs" in b]
    assert len(scoring) == 6 and all(b["max_tokens"] == 1 and b["prompt_logprobs"] == 4 for b in scoring)
    assert manifest["responses"]["given"] == 6 and manifest["responses"]["generated"] == 6
    ds, _ = load_output(tmp_path / "out")
    rows = [r for split in ("train", "heldout") for r in ds[split].to_list()]
    given = {tuple(b["prompt"]) for b in scoring}
    for r in rows:
        if tuple(r["prompt_ids"] + r["completion_ids"]) in given:  # scored: the fake's top ids at each position
            n = len(r["prompt_ids"])
            full = r["prompt_ids"] + r["completion_ids"]
            assert [ids[0] for ids in r["topk_ids"]] == [(t * 5) % 64 for t in full[n:]]
            assert all(len(ids) == 4 and -30.0 not in lps for ids, lps in zip(r["topk_ids"], r["topk_logprobs"]))
    texts = {tokenizer.decode(r["completion_ids"], skip_special_tokens=True) for r in rows}
    assert {rec["completion"] for rec in records if "completion" in rec} <= texts  # kept as given


# -- auto: mixed -------------------------------------------------------------------------------------
def test_auto_scores_records_with_responses_and_generates_the_others(tmp_path, target_dir, tokenizer):
    records = [{"prompt": words(i, 2 + i % 5), **({"completion": words(i + 5, 3)} if i % 3 else {})} for i in range(24)]
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    manifest = run(config(target_dir, prompts, tmp_path / "out", responses="auto", max_new_tokens=5))
    ds, _ = load_output(tmp_path / "out")
    model = make_model("llama", seed=0)
    given = {tuple(tokenizer(r["prompt"]).input_ids): tokenizer(r["completion"], add_special_tokens=False).input_ids
             for r in records if "completion" in r}
    for split in ("train", "heldout"):
        expect = [tokenizer(r["prompt"]).input_ids for r in records
                  if in_heldout(r["prompt"], 0.25) == (split == "heldout")]
        assert [row["prompt_ids"] for row in ds[split]] == expect  # the prompt order, scored and generated mixed
        assert [row["prompt_index"] for row in ds[split]] == list(range(len(expect)))
        for row in ds[split]:
            key = tuple(row["prompt_ids"])
            if key in given:
                assert row["completion_ids"] == given[key]
            else:
                ref = model.generate(torch.tensor([row["prompt_ids"]]), do_sample=False, max_new_tokens=5,
                                     pad_token_id=0, eos_token_id=EOS_ID)[0, len(row["prompt_ids"]):]
                assert row["completion_ids"] == ref.tolist()
    n_given = sum("completion" in r for r in records)
    assert manifest["responses"]["given"] == n_given and manifest["responses"]["generated"] == len(records) - n_given
    assert manifest["responses"]["mode"] == "auto" and manifest["responses"]["score_tokens_per_s"] > 0


# -- the documented command ------------------------------------------------------------------------------
def test_docs_responses_given_command(tmp_path, monkeypatch, tokenizer):
    """docs/your-own-pair.md's data.responses=given command, run on a tiny pair (datagen only: the stages after it
    read the same rows as ever) over the page's own example records."""
    from test_pipeline import run_cli, tiny_args

    page = (ROOT / "docs" / "your-own-pair.md").read_text()
    (command,) = re.findall(r"`(draftsmith [^`]*data\.responses=given[^`]*)`", page)
    examples = [json.loads(line) for line in re.findall(r"^(\{.*\})$", page, flags=re.M)]
    assert {"messages", "prompt"} <= {key for e in examples for key in e}
    pair = tmp_path / "pair"
    tokenizer = chat_tokenizer("chatml")
    for name in ("target", "base"):
        make_model("llama", seed=0, vocab_size=len(tokenizer)).save_pretrained(pair / name)
        tokenizer.save_pretrained(pair / name)
    ours = tokenizer.get_vocab()
    variants = [words_only(e, ours, shift) for shift in range(12) for e in examples]
    prompts = write_jsonl(tmp_path / "responses.jsonl", variants)
    args = command.replace("/models/my-target", str(pair / "target")).replace("/models/my-draft", str(pair / "base"))
    args = args.replace("responses.jsonl", str(prompts)).replace("runs/given", str(tmp_path / "given"))
    base = [a for a in tiny_args(pair, tmp_path, "stages=[datagen]")
            if not a.startswith(("out_dir=", "data.prompts="))]
    run_cli(monkeypatch, base + args.split()[1:])
    manifest = json.loads((tmp_path / "given" / "datagen" / "manifest.json").read_text())
    assert manifest["responses"]["given"] == len(variants) and manifest["responses"]["generated"] == 0


def words_only(example: dict, vocab: dict, shift: int) -> dict:
    """The page's example record with every word the tiny tokenizer lacks replaced by a known one (same shape;
    `shift` makes variants)."""
    def known(text: str) -> str:
        return " ".join(w if w in vocab else f"w{(len(w) + shift) % 60}" for w in text.split())

    if "messages" in example:
        return {"messages": [{**m, "content": known(m["content"])} for m in example["messages"]]}
    return {key: known(value) for key, value in example.items()}


def test_answers_to_one_question_are_rows_of_their_own_in_one_split(tokenizer):
    from draftsmith.train.prompts import PromptRecord, prepare_prompts

    records = [PromptRecord("w1 w2", [5, 6]), PromptRecord("w1 w2", [7, 8]), PromptRecord("w1 w2", [5, 6]),
               PromptRecord("w3", None), PromptRecord("w3", None)]
    for fraction in (0.0, 0.999):
        prep = prepare_prompts(records, tokenizer, max_prompt_tokens=64, heldout_fraction=fraction)
        assert prep.counts["duplicates"] == 2
        split = "heldout" if fraction else "train"
        assert sorted(map(tuple, filter(None, prep.responses[split]))) == [(5, 6), (7, 8)]
