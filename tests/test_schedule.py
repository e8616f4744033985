"""vLLM's batch-size K schedule: built from the serving A/B's K per concurrency band (serve/schedule.py), handed to
vLLM in --speculative-config (serve/server.py), written by the registry and shown by ``draftsmith-registry show``;
and (slow) accepted by vLLM's own validator and served by a real vLLM server."""

import json
import subprocess
import textwrap

import pytest
from test_registry import PROMOTION, fake_draft
from test_serving_vllm import vllm_info, vllm_python  # noqa: F401  (the same skip rule and interpreter)

from draftsmith import registry_cli
from draftsmith.registry import LocalRegistry, RegistryError
from draftsmith.serve.schedule import (batch_size_schedule, check_schedule, describe_schedule, schedule_k,
                                       speculated_ks)
from draftsmith.serve.server import ServerSpec, speculative_config

BRIEF = [{"from": 1, "to": 4, "k": 4}, {"from": 8, "to": 8, "k": 2}, {"from": 16, "k": 0}]


def k_at(schedule, batch_size: int) -> int:
    """The K vLLM runs at `batch_size` under `schedule`: the range holding it, else the last K before it (carried)."""
    k = None
    for start, end, value in schedule:
        if start <= batch_size:
            k = value
    return k


def measured_levels(band) -> list[int]:
    return sorted({band["from"], band.get("to", band["from"])})


# -- the builder ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bands, expected", [
    (BRIEF, [[1, 5, 4], [6, 11, 2], [12, 16, 0]]),  # switch at sqrt(4*8)=5.7 and sqrt(8*16)=11.3
    ([{"from": 1, "to": 1, "k": 4}, {"from": 4, "to": 8, "k": 2}, {"from": 16, "k": 0}],
     [[1, 2, 4], [3, 11, 2], [12, 16, 0]]),
    ([{"from": 1, "to": 1, "k": 3}, {"from": 8, "k": 1}], [[1, 2, 3], [3, 8, 1]]),  # a gap: levels 1 and 8
    ([{"from": 1, "to": 1, "k": 0}, {"from": 8, "k": 4}], [[1, 2, 0], [3, 8, 4]]),  # off at low load, K 4 above
    ([{"from": 1, "to": 1, "k": 2}, {"from": 2, "k": 0}], [[1, 1, 2], [2, 2, 0]]),  # neighbours: sqrt(2) = 1.4
    ([{"from": 1, "k": 2}], [[1, 1, 2]]),  # one band
    ([{"from": 4, "k": 3}], [[1, 4, 3]]),  # the lowest measured level above 1: still from batch 1
    ([{"from": 4, "to": 4, "k": 4}, {"from": 16, "k": 2}], [[1, 8, 4], [9, 16, 2]]),
    ([{"from": 1, "to": 1, "k": 4}, {"from": 2, "to": 2, "k": 4}, {"from": 8, "to": 8, "k": 2}, {"from": 16, "k": 2}],
     [[1, 4, 4], [5, 16, 2]]),  # equal K merged: one switch, between 2 and 8
    ([{"from": 1, "to": 32, "k": 4}, {"from": 64, "k": 4}], [[1, 64, 4]]),  # all one K: one range
])
def test_batch_size_schedule_from_k_by_concurrency(bands, expected):
    schedule = batch_size_schedule(bands)
    assert schedule == expected
    assert schedule[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in zip(schedule, schedule[1:]))  # contiguous
    for band in bands:  # every measured level is served at the K measured best there
        for level in measured_levels(band):
            assert k_at(schedule, level) == band["k"], (band, level)
    assert k_at(schedule, 10_000) == bands[-1]["k"]  # vLLM carries the last K forward
    assert bands == [dict(b) for b in bands]  # the input is not modified


def test_the_geometric_switch_point():
    # K differs between measured levels a and b: a's K up to floor(sqrt(a*b)), b's from one above
    for a, b in [(1, 2), (1, 4), (2, 8), (8, 16), (16, 64), (3, 7), (100, 101)]:
        schedule = batch_size_schedule([{"from": a, "to": a, "k": 3}, {"from": b, "k": 1}])
        end = schedule[0][1]
        assert end * end <= a * b < (end + 1) * (end + 1) and a <= end < b


@pytest.mark.parametrize("bands, message", [
    ([], "non-empty list"),
    (None, "non-empty list"),
    ({"from": 1, "k": 2}, "non-empty list"),
    ([{"from": 8, "to": 8, "k": 2}, {"from": 1, "k": 4}], "sorted by concurrency"),
    ([{"from": 1, "to": 8, "k": 2}, {"from": 8, "k": 4}], "sorted by concurrency without overlap"),
    ([{"from": 1, "k": 2}, {"from": 8, "k": 4}], "only the last band may omit 'to'"),
    ([{"from": 0, "k": 2}], "'from' must be a concurrency level >= 1"),
    ([{"from": 4, "to": 2, "k": 2}], "'to' must be an integer >= its 'from' 4"),
    ([{"from": 1, "k": -1}], "'k' must be an integer >= 0"),
    ([{"from": 1, "k": True}], "'k' must be an integer"),
    ([{"from": 1.5, "k": 2}], "'from' must be"),
    (["1-4: K=2"], "is not a mapping"),
])
def test_bad_band_tables_are_clear_errors(bands, message):
    with pytest.raises(ValueError, match=message) as err:
        batch_size_schedule(bands)
    assert "k_by_concurrency" in str(err.value)


def test_schedule_k_describe_and_check():
    schedule = [[1, 2, 4], [3, 11, 2], [12, 16, 0]]
    assert schedule_k(schedule) == 4 and speculated_ks(schedule) == [2, 4]
    assert describe_schedule(schedule) == "batch 1-2: K=4; 3-11: K=2; >=12: off"
    assert describe_schedule([[1, 1, 2], [2, 2, 0]]) == "batch 1: K=2; >=2: off"
    assert describe_schedule([[1, 4, 3]]) == "K=3 at every batch size"  # one range: vLLM carries it beyond 4
    assert check_schedule(schedule) == schedule
    assert check_schedule([(1, 4, 3), (9, 16, 1)]) == [[1, 4, 3], [9, 16, 1]]  # a gap is fine for vLLM (carried)


@pytest.mark.parametrize("schedule, message", [
    ([], "non-empty list"),
    ([[2, 4, 3]], "first range must start at batch size 1"),
    ([[1, 4, 3], [4, 8, 2]], "sorted and non-overlapping"),
    ([[1, 4, 3], [9, 16, 1], [5, 8, 2]], "sorted and non-overlapping"),
    ([[1, 4, 3], [8, 6, 2]], "1 <= start <= end"),
    ([[1, 4, -1]], "K must be >= 0"),
    ([[1, 4]], "three integers"),
    ([[1, 4, 2.5]], "three integers"),
    ([[1, 4, 0], [5, 8, 0]], "K 0 \\(off\\) at every batch size: nothing to speculate"),
])
def test_schedules_vllm_would_refuse_are_clear_errors(schedule, message):
    with pytest.raises(ValueError, match=message):
        check_schedule(schedule)


# -- the speculative config and the server spec ------------------------------------------------------
def test_speculative_config_with_a_schedule():
    schedule = [[1, 5, 4], [6, 11, 2], [12, 16, 0]]
    expected = {"model": "D", "method": "draft_model", "num_speculative_tokens": 4,
                "num_speculative_tokens_per_batch_size": schedule}
    assert speculative_config("D", None, schedule) == expected
    assert speculative_config("D", 4, schedule) == expected  # k may repeat the largest K
    with pytest.raises(ValueError, match="K=2 does not match .*largest K, 4; pass k=None or k=4"):
        speculative_config("D", 2, schedule)
    with pytest.raises(ValueError, match="nothing to speculate.*without a draft"):
        speculative_config("D", None, [[1, 4, 0]])
    assert speculative_config("D", 3) == {"model": "D", "method": "draft_model", "num_speculative_tokens": 3}


def test_server_spec_hands_the_schedule_to_vllm():
    schedule = [[1, 1, 2], [2, 2, 0]]
    spec = ServerSpec(model="/m/target", draft="/m/draft", schedule=schedule, python="/venv/bin/python")
    cmd = spec.command(8000)
    config = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert config == {"model": "/m/draft", "method": "draft_model", "num_speculative_tokens": 2,
                      "num_speculative_tokens_per_batch_size": schedule}
    assert spec.speculation() == "batch 1: K=2; >=2: off"
    static = ServerSpec(model="/m/target", draft="/m/draft", k=3).command(8000)
    assert json.loads(static[static.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert "num_speculative_tokens_per_batch_size" not in static[static.index("--speculative-config") + 1]
    with pytest.raises(ValueError, match="needs a draft"):
        ServerSpec(model="/m/target", schedule=schedule)
    with pytest.raises(ValueError, match="nothing to speculate"):
        ServerSpec(model="/m/target", draft="/m/draft", schedule=[[1, 8, 0]])
    with pytest.raises(ValueError, match="first range must start at batch size 1"):
        ServerSpec(model="/m/target", draft="/m/draft", schedule=[[2, 8, 2]])


# -- the registry ------------------------------------------------------------------------------------
def serving(bands, concurrency=8):
    return {"table": {"cells": []}, "concurrency": concurrency, "k_by_concurrency": bands}


def test_the_registry_writes_the_schedule_from_the_serving_bands(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    version = reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=2,
                           serving=serving(BRIEF))
    path = reg.path("demo", 1)
    schedule = [[1, 5, 4], [6, 11, 2], [12, 16, 0]]
    assert json.loads((path / "speculative_config.json").read_text()) == {
        "model": str((path / "draft").resolve()), "method": "draft_model", "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": schedule}
    record = reg.resolve("demo", 1)
    assert record["k_schedule"] == schedule and version["k_schedule"] == schedule
    assert record["best_k"] == 2 and record["k_by_concurrency"] == BRIEF  # the K at the serving concurrency, kept


def test_schedule_false_or_no_serving_ab_keeps_the_static_k(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    reg.register("off", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=2, serving=serving(BRIEF),
                 schedule=False)
    reg.register("batch1", fake_draft(tmp_path / "b", 2), metrics={}, promotion=PROMOTION, k=3)
    for name, k in (("off", 2), ("batch1", 3)):
        path = reg.path(name, 1)
        assert json.loads((path / "speculative_config.json").read_text()) == {
            "model": str((path / "draft").resolve()), "method": "draft_model", "num_speculative_tokens": k}, name
        assert reg.resolve(name, 1)["k_schedule"] is None, name


def test_one_k_at_every_level_is_a_one_range_schedule(tmp_path):
    """The contract: a version promoted on a serving A/B carries num_speculative_tokens_per_batch_size, also when
    every measured level chose the same K (it says over which loads that K was measured)."""
    reg = LocalRegistry(tmp_path / "reg")
    reg.register("oneband", fake_draft(tmp_path / "c", 3), metrics={}, promotion=PROMOTION, k=2,
                 serving=serving([{"from": 1, "to": 4, "k": 2}, {"from": 8, "k": 2}]))
    path = reg.path("oneband", 1)
    config = json.loads((path / "speculative_config.json").read_text())
    assert config["num_speculative_tokens"] == 2 and config["num_speculative_tokens_per_batch_size"] == [[1, 8, 2]]
    assert reg.resolve("oneband", 1)["k_schedule"] == [[1, 8, 2]]


def test_the_transaction_registers_with_a_schedule_and_refuses_an_all_off_table(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    with reg.transaction("demo") as tx:
        with pytest.raises(RegistryError, match="k_by_concurrency .*nothing to speculate"):
            tx.register(fake_draft(tmp_path / "off", 9), metrics={}, promotion=PROMOTION, k=2,
                        serving=serving([{"from": 1, "to": 4, "k": 0}, {"from": 8, "k": 0}]))
        with pytest.raises(RegistryError, match="k_by_concurrency .*sorted"):
            tx.register(fake_draft(tmp_path / "bad", 8), metrics={}, promotion=PROMOTION, k=2,
                        serving=serving([{"from": 8, "to": 8, "k": 2}, {"from": 1, "k": 4}]))
        assert tx.versions() == []  # nothing written
        version = tx.register(fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=4,
                              serving=serving([{"from": 1, "to": 1, "k": 4}, {"from": 8, "k": 0}], concurrency=1))
    assert version["k_schedule"] == [[1, 2, 4], [3, 8, 0]]
    config = json.loads((reg.path("demo", 1) / "speculative_config.json").read_text())
    assert config["num_speculative_tokens"] == 4 and config["num_speculative_tokens_per_batch_size"] == [
        [1, 2, 4], [3, 8, 0]]


def test_show_prints_the_schedule_and_the_speculative_config(tmp_path, capsys):
    reg = LocalRegistry(tmp_path / "reg")
    reg.register("demo", fake_draft(tmp_path / "a", 1), metrics={}, promotion=PROMOTION, k=2, serving=serving(BRIEF))
    reg.register("demo", fake_draft(tmp_path / "b", 2), metrics={}, promotion=PROMOTION, k=3, aliases=["staging"])
    assert registry_cli.main(["--root", str(reg.root), "show", "demo"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["k_schedule_description"] == "batch 1-5: K=4; 6-11: K=2; >=12: off"
    assert shown["k_schedule"] == [[1, 5, 4], [6, 11, 2], [12, 16, 0]]
    assert shown["speculative_config"]["num_speculative_tokens_per_batch_size"] == shown["k_schedule"]
    assert shown["speculative_config"]["num_speculative_tokens"] == 4
    assert shown["serving_bands"] == "concurrency 1-4: K=4; 8: K=2; >=16: off"
    assert registry_cli.main(["--root", str(reg.root), "show", "demo", "staging"]) == 0
    static = json.loads(capsys.readouterr().out)
    assert static["k_schedule_description"] == "static K=3 at every batch size" and static["k_schedule"] is None
    assert registry_cli.main(["--root", str(reg.root), "list", "demo"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-1] == "serves"
    assert lines[2].split()[:3] == ["v1", "production", "2"] and lines[3].split()[:3] == ["v2", "staging", "3"]
    assert lines[2].endswith("  batch 1-5: K=4; 6-11: K=2; >=12: off") and lines[3].endswith("  K=3")


# -- vLLM itself (slow) -------------------------------------------------------------------------------
TABLES = [
    BRIEF,
    [{"from": 1, "to": 1, "k": 4}, {"from": 4, "to": 8, "k": 2}, {"from": 16, "k": 0}],
    [{"from": 1, "to": 1, "k": 0}, {"from": 8, "k": 4}],
    [{"from": 4, "to": 4, "k": 4}, {"from": 16, "to": 32, "k": 2}, {"from": 64, "k": 1}],
    [{"from": 1, "to": 1, "k": 2}, {"from": 2, "k": 0}],
]
VALIDATE = textwrap.dedent("""\
    import json, sys
    from vllm.v1.spec_decode.dynamic.utils import (build_dynamic_sd_schedule_lookup,
                                                   validate_and_normalize_dynamic_sd_schedule)
    out = []
    for schedule in json.loads(sys.stdin.read()):
        k = max(entry[2] for entry in schedule)
        normalized = [list(e) for e in validate_and_normalize_dynamic_sd_schedule(schedule)]
        out.append({"normalized": normalized, "dense": build_dynamic_sd_schedule_lookup(schedule, 128, k)})
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_vllms_own_validator_accepts_the_built_schedules(vllm_info):
    schedules = [batch_size_schedule(bands) for bands in TABLES]
    done = subprocess.run([vllm_python(), "-c", VALIDATE], input=json.dumps(schedules), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for bands, schedule, result in zip(TABLES, schedules, results):
        assert result["normalized"] == schedule  # accepted as it is (already sorted, from 1, no overlap)
        dense = result["dense"]  # vLLM's batch size -> K lookup, index 0 unused
        assert dense[1:] == [k_at(schedule, b) for b in range(1, 129)]  # vLLM serves what k_at says
        for band in bands:
            for level in measured_levels(band):
                assert dense[level] == band["k"]


@pytest.mark.slow
def test_a_real_vllm_server_speculates_under_the_schedule(vllm_info, tmp_path):
    from conftest import prompts, save_vllm_pair
    from draftsmith.eval.load import run_load
    from draftsmith.serve.client import served_model
    from draftsmith.serve.metrics import counters_delta, scrape_metrics
    from draftsmith.serve.server import VllmServer

    save_vllm_pair(tmp_path)
    schedule = batch_size_schedule([{"from": 1, "to": 1, "k": 2}, {"from": 2, "k": 0}])
    assert schedule == [[1, 1, 2], [2, 2, 0]]
    spec = ServerSpec(model=str(tmp_path / "target"), draft=str(tmp_path / "draft"), schedule=schedule,
                      python=vllm_python(), kvcache_gib=1)
    with VllmServer(spec, log_path=tmp_path / "vllm.log", startup_timeout_s=300) as server:
        before = scrape_metrics(server.url)
        model = served_model(server.url)
        load = run_load(server.url, model, [p[0].tolist() for p in prompts(2, seed=1)], num_requests=2,
                        max_tokens=12, concurrency=1)  # one at a time: batch size 1
        counters = counters_delta(before, scrape_metrics(server.url))
    log = (tmp_path / "vllm.log").read_text()
    assert '"num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 0]]' in log  # what the server was given
    assert all(r.error is None and r.output_tokens == 12 for r in load.requests)
    print(json.dumps({"drafts": counters.drafts, "draft_tokens": counters.draft_tokens,
                      "accepted": counters.accepted_tokens, "per_pos": counters.accepted_per_pos}))
    assert counters.drafts > 0  # batch size 1: K=2 drafts
    assert counters.draft_tokens == 2 * counters.drafts  # every draft at batch size 1 proposed K=2 tokens
    assert sorted(counters.accepted_per_pos) == [0, 1]  # num_speculative_tokens = the schedule's largest K
