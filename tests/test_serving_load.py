"""The load generator against a fake OpenAI-compatible streaming server with scripted token delays,
and the whole A/B (serving.json) against two fakes given as serve.url / baseline_url."""

import json
import random

import pytest

from draftsmith.eval.load import LoadError, run_load
from draftsmith.serve.client import served_model, stream_body
from draftsmith.serve.errors import VllmError
from draftsmith.eval.serving import run_serving_ab
from draftsmith.eval.settings import ServingSettings
from serving_fakes import FakeServer, output_ids

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
SLACK = 0.08  # s: how much later than scripted a time may be on a busy 2-core machine


def test_stream_body_sends_token_ids_greedy_streaming():
    body = stream_body("m", [1, 2], 16, True)
    assert body["prompt"] == [1, 2] and body["temperature"] == 0.0 and body["stream"] is True
    assert body["ignore_eos"] is True and body["return_token_ids"] is True and body["max_tokens"] == 16


@pytest.mark.parametrize("chunk", [1, 3])
def test_ttft_and_tpot_follow_the_scripted_delays(chunk):
    # First token after 150 ms, then 40 ms per token, arriving `chunk` tokens at a time (speculation
    # emits several tokens per step): TPOT is per token, not per chunk.
    with FakeServer(ttft_s=0.15, tpot_s=0.04, chunk=chunk) as fake:
        load = run_load(fake.url, served_model(fake.url), PROMPTS, num_requests=2, max_tokens=7, concurrency=1)
    assert len(load.requests) == 2
    for r in load.requests:
        assert r.error is None and r.output_tokens == 7
        assert r.token_ids == output_ids(PROMPTS[r.prompt_index], 7)
        assert 0.15 <= r.ttft_s < 0.15 + SLACK
        assert 0.04 * (1 - 0.05) <= r.tpot_s < 0.04 + SLACK / 6
        assert r.e2e_s == pytest.approx(r.ttft_s + 6 * r.tpot_s)
    assert load.requests[1].start_s >= load.requests[0].start_s + load.requests[0].e2e_s - 0.01  # one client: in turn


def test_closed_loop_keeps_exactly_n_requests_in_flight():
    with FakeServer(ttft_s=0.05, tpot_s=0.01) as fake:
        load = run_load(fake.url, "fake-model", PROMPTS, num_requests=6, max_tokens=4, concurrency=2)
        assert fake.max_inflight == 2 and fake.requests == 6
        assert [b["prompt"] for b in fake.bodies].count(PROMPTS[0]) == 2  # the schedule cycles the prompts
    assert [r.index for r in load.requests] == list(range(6))
    assert [r.prompt_index for r in load.requests] == [0, 1, 2, 0, 1, 2]
    # 6 requests of ~80 ms, two at a time: ~3 rounds, not 1 (all at once) nor 6 (one at a time).
    assert 0.2 < load.wall_s < 0.2 + 3 * SLACK + 0.1


def test_open_loop_sends_at_seeded_poisson_arrival_times():
    rate, n = 20.0, 5
    rng, expected, t = random.Random(3), [], 0.0
    for _ in range(n):
        expected.append(t)
        t += rng.expovariate(rate)
    with FakeServer(ttft_s=0.01, tpot_s=0.005) as fake:
        load = run_load(fake.url, "fake-model", PROMPTS, num_requests=n, max_tokens=3, request_rate=rate, seed=3)
    assert load.concurrency is None and load.request_rate == rate
    starts = [r.start_s for r in sorted(load.requests, key=lambda r: r.index)]
    assert all(e - 0.005 <= s < e + SLACK for s, e in zip(starts, expected))


def test_failed_requests_raise_only_when_all_fail():
    with FakeServer() as fake:
        with pytest.raises(LoadError, match="every request"):
            run_load(fake.url + "/nowhere", "fake-model", PROMPTS, num_requests=2, max_tokens=2, concurrency=1)
    with pytest.raises(VllmError, match="v1/models"):
        served_model("http://127.0.0.1:9")  # nothing listens on the discard port


def test_ab_against_user_servers_writes_the_serving_json_contract(tmp_path):
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1, 2], max_tokens=6, max_prompts=3, warmup=1, repeats=1)
    with FakeServer(ttft_s=0.02, tpot_s=0.004, chunk=2, k=3) as spec, FakeServer(ttft_s=0.02, tpot_s=0.008) as plain:
        settings.url, settings.baseline_url = spec.url, plain.url
        serving = run_serving_ab(settings, target="t", drafts={"trained": "d"}, k=[3], prompts=PROMPTS,
                                 out_dir=tmp_path, reference=[output_ids(p, 6) for p in PROMPTS], log=lambda *_: None)
    on_disk = json.loads((tmp_path / "serving.json").read_text())
    assert on_disk["cells"] == json.loads(json.dumps(serving["cells"]))
    assert [(c["draft"], c["k"], c["concurrency"]) for c in on_disk["cells"]] == [("trained", 3, 1), ("trained", 3, 2)]
    for c in on_disk["cells"]:
        for side in ("spec", "plain"):
            assert c[side]["output_tokens_per_s"] > 0 and c[side]["ttft_ms_p50"] > 0 and c[side]["tpot_ms_p50"] > 0
            assert c[side]["requests"] == max(3, 2 * c["concurrency"]) and c[side]["errors"] == 0
        assert c["speedup"] > 0 and c["outputs_equal"] is True and c["compared"] == c["spec"]["requests"]
        assert 0 < c["acceptance_rate"] < 1 and len(c["per_position_acceptance"]) == 3
        assert c["spec_equals_reference"] is True and c["plain_equals_reference"] is True
    assert set(on_disk["boundary"]) == {"trained"}
    assert on_disk["boundary"]["trained"]["per_k"][0]["k"] == 3
    assert on_disk["plots"] == ["serving_speedup.png", "serving_latency.png"]
    assert all((tmp_path / p).stat().st_size > 0 for p in on_disk["plots"])
    assert on_disk["warnings"] == []


def test_ab_reports_a_greedy_mismatch(tmp_path):
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=6, max_prompts=2, warmup=0, repeats=1)
    with FakeServer(k=2, mismatch=True, ttft_s=0.01, tpot_s=0.002) as spec, FakeServer(ttft_s=0.01, tpot_s=0.002) as plain:
        settings.url, settings.baseline_url = spec.url, plain.url
        serving = run_serving_ab(settings, target="t", drafts={"a": "x", "b": "y"}, k=[2], prompts=PROMPTS,
                                 out_dir=tmp_path, log=lambda *_: None)
    c = serving["cells"][0]
    assert c["draft"] == "served" and c["k"] == 2  # two drafts given: the served one is unnamed; K from /metrics
    assert c["outputs_equal"] is False and c["mismatches"] == 2
    assert c["first_mismatch"]["position"] == 3
    assert any("greedy outputs differ" in w for w in serving["warnings"])


def test_ab_refuses_a_spec_url_that_does_not_speculate(tmp_path):
    from draftsmith.serve.errors import VllmError

    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=3, max_prompts=1, warmup=0)
    with FakeServer(ttft_s=0.01, tpot_s=0.001) as a, FakeServer(ttft_s=0.01, tpot_s=0.001) as b:
        settings.url, settings.baseline_url = a.url, b.url
        with pytest.raises(VllmError, match="drafted nothing"):
            run_serving_ab(settings, target="t", drafts={"d": "x"}, k=[2], prompts=PROMPTS, out_dir=tmp_path,
                           log=lambda *_: None)


def test_ab_needs_engine_vllm(tmp_path):
    from draftsmith.artifacts.errors import ConfigError

    with pytest.raises(ConfigError, match="serve.engine=vllm"):
        run_serving_ab(ServingSettings(engine="none"), target="t", drafts={"d": "x"}, k=[2], prompts=PROMPTS,
                       out_dir=tmp_path)
