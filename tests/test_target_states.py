"""The target's hidden states kept beside a datagen output (data.hidden_states=eagle3): what datagen asks vLLM for and
keeps, and what an EAGLE-3 train stage reads from them (train/target_states.py). Here without vLLM: the states files
are written as vLLM's connector writes them, from the HF forward; the real server's against the forward:
tests/test_datagen_vllm_real.py (slow)."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from conftest import make_model
from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.eagle3 import final_norm, target_aux_features
from draftsmith.serve.errors import VllmError
from draftsmith.train.datagen import DatagenConfig
from draftsmith.train.datagen_vllm import engine, records_of, request_body, server_spec, states_setup
from draftsmith.train.eagle3 import target_aux_rows
from draftsmith.train.features import run_features
from draftsmith.train.target_states import keep_states, state_layers, states_file, stored_features

LAYERS = [2, 4, 5]  # vLLM's EAGLE-3 layers of an 8-layer target: (2, L//2, L-3)


def settings(**kw):
    base = dict(target="t", prompts="-", out_dir="-", max_new_tokens=4, top_k_logprobs=0, hidden_states="eagle3")
    return DatagenConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def target():
    return make_model("llama", seed=0, hidden=32, layers=8)


def vllm_like_states(target, fed: list[int]) -> torch.Tensor:
    """[N, 4, H]: what vLLM's extract_hidden_states keeps for the tokens `fed` at LAYERS and layer L (the stream
    after the last layer, the final norm's input), here from the HF forward."""
    seen = {}
    handle = final_norm(target).register_forward_pre_hook(lambda module, args: seen.setdefault("last", args[0]))
    try:
        x = torch.tensor([fed])
        with torch.no_grad():
            aux, _ = target_aux_features(target, x, torch.ones_like(x), LAYERS)
    finally:
        handle.remove()
    return torch.cat([aux[0].reshape(len(fed), 3, -1), seen["last"][0][:, None]], dim=1)


def write_states(path, target, prompt, completion):
    """A states file as the connector writes it: every token but the last went through a forward."""
    fed = (prompt + completion)[:-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"hidden_states": vllm_like_states(target, fed), "token_ids": torch.tensor(fed)}, str(path))


def test_settings_name_the_key():
    with pytest.raises(ConfigError, match="data.hidden_states"):
        settings(hidden_states="all")
    with pytest.raises(ConfigError, match="data.n_completions=1"):
        settings(n_completions=2, temperature=0.7)
    assert settings(hidden_states="none").hidden_states == "none"


def test_requests_ask_for_the_generated_tokens_states_and_rows_carry_the_file():
    body = request_body("m", [4, 5], settings(), {2}, seed=0)
    assert body["kv_transfer_params"] == {"include_output_tokens": True}
    assert "kv_transfer_params" not in request_body("m", [4, 5], settings(hidden_states="none"), {2}, seed=0)
    response = {"choices": [{"index": 0, "token_ids": [7, 8, 2]}], "kv_transfer_params": {"hidden_states_path": "/x"}}
    [row] = records_of(response, [4, 5], settings(), {2})
    assert row["hidden_states_path"] == "/x" and row["completion_ids"] == [7, 8, 2]
    with pytest.raises(VllmError, match="data.hidden_states=none"):
        records_of({"choices": [{"index": 0, "token_ids": [7]}]}, [4, 5], settings(), {2})


def test_the_server_keeps_the_heads_layers_and_the_last_stream_through_draftsmiths_connector(tmp_path, target):
    target.save_pretrained(tmp_path / "target")
    cfg = settings(target=str(tmp_path / "target"))
    states = states_setup(cfg, tmp_path / "work")
    assert (states["layers"], states["final_layer"]) == (LAYERS, 8)
    assert (tmp_path / "work" / "modules" / f"{states['module']}.py").exists()  # vLLM's interpreter imports it
    spec = server_spec(cfg, "cpu", states)
    args = spec.command(8000)
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    assert speculative["method"] == "extract_hidden_states"
    assert speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [*LAYERS, 8]
    transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "CpuHiddenStatesConnector"
    assert transfer["kv_connector_module_path"] == states["module"]
    assert transfer["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "work" / "states")
    assert spec.environment()["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "work" / "modules")
    assert "--speculative-config" not in server_spec(settings(hidden_states="none"), "cpu").command(8000)


def test_a_target_with_too_few_layers_and_a_server_elsewhere_are_refused(tmp_path):
    make_model("llama", layers=4).save_pretrained(tmp_path / "small")
    with pytest.raises(ConfigError, match="data.hidden_states=none"):
        state_layers(str(tmp_path / "small"))
    with pytest.raises(VllmError, match="data.vllm.url"):
        with engine(settings(vllm={"url": "http://127.0.0.1:1"}), tmp_path / "log"):
            pass


def test_keep_states_moves_each_rows_file_into_the_output_and_checks_its_tokens(tmp_path, target):
    rows = {"train": [{"prompt_ids": [3, 4], "completion_ids": [5, 6, 2]},
                      {"prompt_ids": [3], "completion_ids": [7, 8]}],  # a scored row: no file
            "heldout": [{"prompt_ids": [9, 10, 11], "completion_ids": [12]}]}
    for split, i, path in (("train", 0, tmp_path / "v" / "a.safetensors"), ("heldout", 0, tmp_path / "v" / "b.st")):
        write_states(path, target, rows[split][i]["prompt_ids"], rows[split][i]["completion_ids"])
        (tmp_path / "v" / (path.name + ".lock")).touch()
        rows[split][i]["hidden_states_path"] = str(path)
    assert keep_states(rows, tmp_path / "out") == {"rows": {"train": 1, "heldout": 1}, "rows_without": 0,
                                                     "dtype": "F32"}
    assert states_file(tmp_path / "out", "train", 0).exists() and states_file(tmp_path / "out", "heldout", 0).exists()
    assert not states_file(tmp_path / "out", "train", 1).exists()
    assert not any("hidden_states_path" in r for split in rows.values() for r in split)
    assert not list((tmp_path / "v").iterdir())  # files and locks moved or removed
    # a file of other tokens, and one vLLM never wrote: the rows go without (the train stage runs the target there)
    write_states(tmp_path / "w.st", target, [3, 4], [5, 6])
    said = []
    other = [{"prompt_ids": [3, 4], "completion_ids": [9, 6], "hidden_states_path": str(tmp_path / "w.st")},
             {"prompt_ids": [3, 4], "completion_ids": [5, 6], "hidden_states_path": str(tmp_path / "never.st")}]
    import draftsmith.train.target_states as ts

    real = ts.wait_written
    ts.wait_written = lambda path, timeout_s: real(path, timeout_s=0.1)
    try:
        counts = keep_states({"train": other}, tmp_path / "out2", log=said.append)
    finally:
        ts.wait_written = real
    assert counts["rows"] == {"train": 0} and counts["rows_without"] == 2
    assert "train 0, train 1" in said[0] and not (tmp_path / "w.st").exists()


def test_a_rows_stored_features_are_the_forwards_but_for_its_last_token(tmp_path, target):
    prompt, completion = [3, 14, 15, 9], [26, 5, 35, 2]
    write_states(tmp_path / "s.st", target, prompt, completion)
    head_w = target.get_output_embeddings().weight
    ours = stored_features(tmp_path / "s.st", prompt, completion, 3, final_norm(target), head_w, True, torch.float32)
    hf = target_aux_rows(target, [(prompt, completion)], LAYERS, top=True)[0]
    n = len(prompt) + len(completion) - 1
    assert ours["ids"].tolist() == (prompt + completion)[:n] and ours["prompt_len"] == len(prompt)
    torch.testing.assert_close(ours["aux"], hf["aux"][:n])
    torch.testing.assert_close(ours["h"], hf["h"][:n])  # the last stream through the final norm: the head's input
    assert torch.equal(ours["top"], hf["top"][:n])
    cut = stored_features(tmp_path / "s.st", prompt, completion[:2], 3, final_norm(target), head_w, False,
                          torch.bfloat16)  # a row cut by method.max_len: its first tokens only
    assert cut["ids"].tolist() == prompt + completion[:2] and "top" not in cut and cut["aux"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="regenerate"):
        stored_features(tmp_path / "s.st", [3, 14, 15, 8], completion, 3, final_norm(target), head_w, True,
                        torch.float32)


def test_run_features_reads_the_rows_with_states_and_computes_the_others_in_order(tmp_path):
    import datasets
    from accelerate import Accelerator

    rows = [{"prompt_ids": [3, 4, 5], "completion_ids": [6, 7]}, {"prompt_ids": [8], "completion_ids": []},
            {"prompt_ids": [9, 10], "completion_ids": [11]}, {"prompt_ids": [12, 13], "completion_ids": [14]}]
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "heldout": datasets.Dataset.from_list(rows)})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    cfg = type("Cfg", (), dict(out_dir=str(tmp_path / "train"), data_dir=str(tmp_path / "data"), target="t",
                               max_len=None, eval_rows=2, batch_size=1))()
    asked = []

    def stored(split, row, prompt, completion, top):
        asked.append((split, row))
        return {"from": "stored", "row": row, "ids": [0]} if row == 2 else None

    def compute(items, top):
        return [{"from": "forward", "prompt": p, "ids": [0]} for p, _ in items]

    train, held = run_features(cfg, Accelerator(cpu=True), ds, compute, stored=stored, kind="t")
    # row 1 (one token) is no row: rows 0 and 3 computed, row 2 read, in the split's order
    assert [(it["from"], it.get("row", it.get("prompt"))) for it in train] == \
        [("forward", [3, 4, 5]), ("stored", 2), ("forward", [12, 13])]
    assert [it["from"] for it in held] == ["forward"]  # eval_rows=2: held-out rows 0 and 1 (one token, left out)
    assert ("train", 2) in asked and ("heldout", 0) in asked


def test_the_eagle3_stage_reads_the_states_kept_for_its_own_layers_only(tmp_path, target):
    from draftsmith.train.eagle3_objective import kept_states

    data = tmp_path / "data"
    data.mkdir()
    cfg = type("Cfg", (), dict(data_dir=str(data), target="t"))()
    (data / "manifest.json").write_text(json.dumps({"target": "t"}))
    assert kept_states(cfg, target, LAYERS, False, log=lambda m: None) == (None, "forward")
    kept = {"hidden_states": {"layers": LAYERS, "final_layer": 8, "rows": {"train": 1, "heldout": 0}}}
    said = []
    (data / "manifest.json").write_text(json.dumps({"target": "other", **kept}))
    assert kept_states(cfg, target, LAYERS, False, log=said.append) == (None, "forward")
    assert "not of pair.target=t" in said.pop()
    (data / "manifest.json").write_text(json.dumps({"target": "t", **kept}))
    assert kept_states(cfg, target, [1, 4, 5], False, log=said.append) == (None, "forward")
    assert "the target runs over the rows here" in said[0]
    stored, source = kept_states(cfg, target, LAYERS, True, log=said.append)
    assert source == "vllm"
    assert stored("train", 0, [3, 4], [5, 6], False) is None  # no file: the forward computes that row
    write_states(states_file(data, "train", 0), target, [3, 4], [5, 6])
    item = stored("train", 0, [3, 4], [5, 6], False)
    assert item["ids"].tolist() == [3, 4, 5] and item["aux"].dtype == torch.bfloat16  # bf16 training rows
    assert stored("train", 0, [3], [4], False) is None  # 2 tokens: no slot left without the last
    assert stored("heldout", 0, [3, 4], [5, 6], True) is None


def test_datagen_keeps_the_generated_rows_states_beside_given_rows_in_the_outputs_order(tmp_path, target, monkeypatch):
    """datagen.run end to end with data.hidden_states=eagle3 and data.responses=auto: the generated rows' states
    (written per request as vLLM's connector writes them, here by a fake server from the HF forward) land at their
    rows' places in each split, the scored rows (given responses) go without, and the work folder is removed."""
    import contextlib
    import tempfile
    from pathlib import Path

    from conftest import make_tokenizer
    from test_datagen_given import words, write_jsonl
    from test_datagen_vllm import FakeCompletions

    import draftsmith.train.datagen_vllm as datagen_vllm
    from draftsmith.train.datagen import load_output, run
    from draftsmith.train.datagen_vllm import Engine

    target.save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")

    class StatesServer(FakeCompletions):
        folder: Path

        def response(self, body):
            out = super().response(body)
            if "kv_transfer_params" in body:  # one states file per request
                with self.lock:  # the forward's hooks are the model's: one request's forward at a time
                    path = self.folder / f"{len(list(self.folder.iterdir()))}.safetensors"
                    write_states(path, target, list(body["prompt"]), out["choices"][0]["token_ids"])
                out["kv_transfer_params"] = {"hidden_states_path": str(path)}
            return out

    @contextlib.contextmanager
    def fake_engine(cfg, log_path, log=print):  # the engine datagen starts, its work folder beside the output
        work = Path(tempfile.mkdtemp(prefix=".draftsmith-states-", dir=Path(cfg.out_dir).resolve().parent))
        with StatesServer(delay_s=0.0) as server:
            server.folder = work / "states"
            server.folder.mkdir()
            yield Engine(server.url, "fake-target", {"name": "vllm", "hidden_states": {
                "layers": LAYERS, "final_layer": 8, "workdir": str(work)}})

    monkeypatch.setattr(datagen_vllm, "engine", fake_engine)
    records = [{"prompt": words(i, 3), **({"completion": words(i + 9, 4)} if i % 3 == 0 else {})} for i in range(16)]
    manifest = run(DatagenConfig(target=str(tmp_path / "target"), prompts=str(write_jsonl(tmp_path / "p.jsonl", records)),
                                 out_dir=str(tmp_path / "out"), max_new_tokens=5, batch_size=4, heldout_fraction=0.25,
                                 top_k_logprobs=0, engine="vllm", responses="auto", hidden_states="eagle3"),
                   log=lambda m: None)
    ds, _ = load_output(tmp_path / "out")
    given = {words(i + 9, 4) for i in range(0, 16, 3)}
    tokenizer = make_tokenizer()
    counts = {}
    for split in ("train", "heldout"):
        rows = ds[split].to_list()
        assert rows and "hidden_states_path" not in rows[0]
        counts[split] = 0
        for i, row in enumerate(rows):
            scored = tokenizer.decode(row["completion_ids"], skip_special_tokens=True) in given
            path = states_file(tmp_path / "out", split, i)
            assert path.exists() != scored, (split, i)
            if path.exists():
                counts[split] += 1
                kept = stored_features(path, row["prompt_ids"], row["completion_ids"], 3, final_norm(target),
                                       target.get_output_embeddings().weight, False, torch.float32)
                forward = target_aux_rows(target, [(row["prompt_ids"], row["completion_ids"])], LAYERS, top=False)[0]
                torch.testing.assert_close(kept["aux"], forward["aux"][:len(kept["ids"])])
    assert 0 < counts["train"] < len(ds["train"]) and counts["heldout"] > 0
    assert manifest["hidden_states"]["rows"] == counts and manifest["hidden_states"]["rows_without"] == 0
    assert manifest["hidden_states"]["layers"] == LAYERS and manifest["responses"]["given"] == 6
    assert not list(tmp_path.glob(".draftsmith-states-*"))  # the work folder removed


def test_auto_keeps_the_states_where_the_train_stage_would_run_the_target_in_float32_on_a_cpu(tmp_path, target,
                                                                                                monkeypatch):
    """data.hidden_states=auto (draftsmith/preflight.py resolve_hidden_states): eagle3 for an EAGLE-3 head trained in
    float32 on a CPU from rows a vLLM started here generates, at the layers vLLM keeps; none, with the reason,
    elsewhere; the Python API's datagen, with no train stage to keep them for, takes none."""
    from types import SimpleNamespace

    import draftsmith.train.loop as loop
    from draftsmith.preflight import resolve_hidden_states
    from draftsmith.train.settings import DatagenSettings, TrainSettings

    target.save_pretrained(tmp_path / "target")
    make_model("llama", layers=4).save_pretrained(tmp_path / "small")
    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda cpuinfo=None: False)

    def resolved(data=None, target_dir="target", draft=None, **method):
        cfg = SimpleNamespace(data=DatagenSettings(**{"engine": "vllm", "hidden_states": "auto", **(data or {})}),
                              method=TrainSettings(**{"finetune": "eagle3", "device": "cpu", **method}))
        said = []
        resolve_hidden_states(cfg, str(tmp_path / target_dir), draft, said.append)
        assert len(said) == 1 and said[0].endswith(f"-> data.hidden_states={cfg.data.hidden_states}")
        return cfg.data.hidden_states, said[0]

    assert resolved()[0] == "eagle3"
    assert resolved(eagle_layers=[5, 2, 4])[0] == "eagle3"  # vLLM's default layers, named in another order
    assert resolved(mixed_precision="fp16")[0] == "eagle3"  # the target's forward runs in float32 under fp16 too
    for case, expected in (
            (dict(mixed_precision="bf16"), "in bf16 on this CPU"),
            (dict(finetune="full"), "method.finetune=full"),
            (dict(data={"engine": "hf"}), "data.engine=hf"),
            (dict(data={"vllm": {"url": "http://n:8000"}}), "data.vllm.url"),
            (dict(data={"n_completions": 2, "temperature": 0.7}), "data.n_completions=2"),
            (dict(data={"responses": "given"}), "every row is a given response"),
            (dict(eagle_layers=[1, 4, 5]), "method.eagle_layers reads layers [1, 4, 5], not vLLM's default layers [2, 4, 5]"),
            (dict(target_dir="small"), "has 4 layers, too few")):
        state, said = resolved(**case)
        assert state == "none" and expected in said, (case, said)
    # a head trained further reads its own layers, not method.eagle_layers
    head = tmp_path / "head"
    head.mkdir()
    head_config = {"speculators_model_type": "eagle3", "transformer_layer_config": {}, "draft_vocab_size": 8}
    (head / "config.json").write_text(json.dumps({**head_config, "eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    state, said = resolved(draft=str(head))
    assert state == "none" and f"the head at pair.draft={head} reads layers [1, 3, 5]" in said
    (head / "config.json").write_text(json.dumps({**head_config, "eagle_aux_hidden_state_layer_ids": [2, 4, 5]}))
    assert resolved(draft=str(head))[0] == "eagle3"
    monkeypatch.setattr(loop, "run_device", lambda method: "cuda")
    state, said = resolved()
    assert state == "none" and "runs on cuda (the states from vLLM are not measured there)" in said
    monkeypatch.undo()
    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    with pytest.raises(ConfigError, match="data.hidden_states=auto: cannot read the config of pair.target="):
        resolved(target_dir="missing")
    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda cpuinfo=None: True)  # bf16 there: the forward is cheaper
    state, said = resolved()
    assert state == "none" and "in bf16 on this CPU" in said
    kept = SimpleNamespace(data=DatagenSettings(hidden_states="eagle3"), method=TrainSettings(finetune="full"))
    resolve_hidden_states(kept, str(tmp_path / "target"), None, print)
    assert kept.data.hidden_states == "eagle3"  # only auto is resolved
    assert settings(hidden_states="auto").hidden_states == "none"
