"""The serving A/B's statistics on hand-made data, /metrics parsing on recorded text, and ServingSettings checks."""

import pytest

from draftsmith.artifacts.errors import ConfigError
from draftsmith.serve.metrics import SpecCounters, counters_delta, parse_spec_counters
from draftsmith.eval.load import LoadResult, RequestResult
from draftsmith.eval.serving_stats import (
    best_k_per_concurrency,
    boundary,
    compare_outputs,
    make_cell,
    percentile,
    side_stats,
    summarize,
    summary_lines,
)
from draftsmith.eval.settings import ServingSettings


# -- percentiles and one side ---------------------------------------------------------------------
def test_percentile_interpolates_linearly_between_order_statistics():
    xs = [10.0, 20.0, 30.0, 40.0]  # positions 0..3
    assert percentile(xs, 50) == 25.0  # pos 1.5: halfway between 20 and 30
    assert percentile(xs, 95) == pytest.approx(38.5)  # pos 2.85: 30 + 0.85 * 10
    assert percentile(reversed(xs), 0) == 10.0 and percentile(xs, 100) == 40.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None and percentile([None], 50) is None


def req(i, ttft, e2e, n, ids=None, error=None, start=0.0, prompt=None):
    return RequestResult(index=i, prompt_index=i if prompt is None else prompt, start_s=start, e2e_s=e2e, ttft_s=ttft,
                         output_tokens=n, token_ids=ids, text="", error=error)


def test_side_stats_by_hand():
    # TPOT = (e2e - ttft) / (n - 1): (1.0 - 0.1) / 9 = 0.1 s and (2.1 - 0.3) / 9 = 0.2 s.
    load = LoadResult(concurrency=2, request_rate=None, wall_s=2.0,
                      requests=[req(0, 0.1, 1.0, 10), req(1, 0.3, 2.1, 10), req(2, None, 0.5, 0, error="HTTP 500")])
    s = side_stats(load)
    assert s["requests"] == 2 and s["errors"] == 1 and s["output_tokens"] == 20
    assert s["output_tokens_per_s"] == 10.0 and s["requests_per_s"] == 1.0
    assert s["ttft_ms_p50"] == pytest.approx(200.0) and s["ttft_ms_p95"] == pytest.approx(290.0)
    assert s["tpot_ms_p50"] == pytest.approx(150.0) and s["tpot_ms_p95"] == pytest.approx(195.0)
    assert s["e2e_ms_p50"] == pytest.approx(1550.0)


def test_tpot_needs_two_tokens():
    assert req(0, 0.1, 0.1, 1).tpot_s is None and req(0, None, 1.0, 0).tpot_s is None


# -- outputs on vs off ----------------------------------------------------------------------------
def test_compare_outputs_reports_the_first_mismatch():
    plain = LoadResult(1, None, 1.0, [req(0, .1, 1, 3, [5, 6, 7]), req(1, .1, 1, 3, [8, 9, 10], prompt=0)])
    same = LoadResult(1, None, 1.0, [req(0, .1, 1, 3, [5, 6, 7]), req(1, .1, 1, 3, [8, 9, 10], prompt=0)])
    assert compare_outputs(same, plain) == {"outputs_equal": True, "compared": 2, "mismatches": 0, "by": "token_ids",
                                            "first_mismatch": None}
    other = LoadResult(1, None, 1.0, [req(0, .1, 1, 3, [5, 6, 7]), req(1, .1, 1, 3, [8, 4, 10], prompt=0)])
    out = compare_outputs(other, plain)
    assert out["outputs_equal"] is False and out["mismatches"] == 1
    assert out["first_mismatch"] == {"request": 1, "prompt_index": 0, "position": 1, "spec": [4, 10], "plain": [9, 10]}
    shorter = LoadResult(1, None, 1.0, [req(0, .1, 1, 2, [5, 6]), req(1, .1, 1, 3, [8, 9, 10], prompt=0)])
    assert compare_outputs(shorter, plain)["first_mismatch"]["position"] == 2  # a prefix is not equal


def test_compare_outputs_falls_back_to_text_and_skips_failed_requests():
    a = LoadResult(1, None, 1.0, [req(0, .1, 1, 2), req(1, None, 1, 0, error="boom")])
    b = LoadResult(1, None, 1.0, [req(0, .1, 1, 2), req(1, .1, 1, 2)])
    a.requests[0].text = b.requests[0].text = " w1 w2"
    out = compare_outputs(a, b)
    assert out["by"] == "text" and out["compared"] == 1 and out["outputs_equal"] is True
    assert compare_outputs(LoadResult(1, None, 1.0, []), b)["outputs_equal"] is None  # nothing compared: unknown


# -- cells, boundary, best K ----------------------------------------------------------------------
def test_make_cell_ratios_and_vllm_acceptance():
    spec = LoadResult(4, None, 1.0, [req(0, 0.1, 0.5, 9, [1] * 9)])  # TPOT 50 ms, 9 tok/s
    plain = LoadResult(4, None, 3.0, [req(0, 0.2, 1.0, 9, [1] * 9)])  # TPOT 100 ms, 3 tok/s
    counters = SpecCounters(drafts=10, draft_tokens=40, accepted_tokens=25, accepted_per_pos={0: 9, 1: 8, 2: 5, 3: 3})
    cell = make_cell("trained", 4, spec, plain, counters)
    assert (cell["draft"], cell["k"], cell["concurrency"]) == ("trained", 4, 4)
    assert cell["speedup"] == pytest.approx(3.0) and cell["tpot_ratio"] == pytest.approx(0.5)
    assert cell["ttft_ratio"] == pytest.approx(0.5)
    assert cell["acceptance_rate"] == pytest.approx(25 / 40)
    assert cell["per_position_acceptance"] == pytest.approx([0.9, 0.8, 0.5, 0.3])
    assert cell["mean_accepted_tokens"] == pytest.approx(3.5) and cell["mean_draft_tokens"] == pytest.approx(4.0)
    assert cell["outputs_equal"] is True
    # prompt lookup: 10 drafts of 28 tokens in all (some shorter than K): only the first position is known
    short = SpecCounters(drafts=10, draft_tokens=28, accepted_tokens=20, accepted_per_pos={0: 9, 1: 6, 2: 3, 3: 2})
    lookup = make_cell("ngram", 4, spec, plain, short, full_positions=1)
    assert lookup["per_position_acceptance"] == [pytest.approx(0.9), None, None, None]
    assert lookup["mean_draft_tokens"] == pytest.approx(2.8) and lookup["acceptance_rate"] == pytest.approx(20 / 28)
    for side in ("spec", "plain"):
        assert {"output_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50"} <= set(cell[side])


def load(conc, e2es, wall, tokens=9):
    return LoadResult(conc, None, wall, [req(i, 0.1, e, tokens, [1] * tokens) for i, e in enumerate(e2es)])


def test_make_cell_pools_passes_and_carries_the_interval():
    # two passes of two requests; plain e2e twice spec's, throughput ratio 2 in both passes
    spec = [load(2, [0.5, 0.6], 1.0), load(2, [0.55, 0.5], 1.0)]
    plain = [load(2, [1.0, 1.2], 2.0), load(2, [1.1, 1.0], 2.0)]
    cell = make_cell("trained", 2, spec, plain)
    assert cell["repeats"] == 2 and cell["speedup"] == pytest.approx(2.0)
    assert cell["spec"]["requests"] == 4 and cell["spec"]["wall_s"] == pytest.approx(2.0)
    assert cell["timings"]["plain_s"] == [[1.0, 1.2], [1.1, 1.0]]
    lo, hi = cell["speedup_ci95"]  # every request pair is exactly 2x: a zero-width interval at the speedup
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    assert make_cell("trained", 2, load(1, [0.5], 1.0), load(1, [1.0], 2.0))["speedup_ci95"] is None  # one pair
    assert cell["outputs_equal"] is True and cell["compared"] == 4  # request i of pass j meets its twin


def test_best_k_per_concurrency_takes_the_smallest_indistinguishable_k():
    def timed(k, conc, ratios):  # a cell whose request j ran ratios[j] times faster with speculation
        spec = [load(conc, [1.0 / r for r in ratios], 1.0)]
        plain = [load(conc, [1.0] * len(ratios), sum(ratios) / len(ratios))]
        return make_cell("d", k, spec, plain)

    close = [timed(2, 1, [1.3, 1.9, 1.4, 1.8]), timed(4, 1, [1.2, 2.1, 1.5, 1.9])]  # 1.6 vs 1.675: within noise
    best = best_k_per_concurrency(close)[0]
    assert best["k"] == 2 and best["indistinguishable"] == [2, 4] and best["pays"] == "yes"
    apart = [timed(2, 1, [1.3, 1.35, 1.3, 1.35]), timed(4, 1, [2.0, 2.1, 2.0, 2.1])]
    assert best_k_per_concurrency(apart)[0]["k"] == 4
    unsure = best_k_per_concurrency([timed(2, 8, [0.7, 1.5, 0.7, 1.5])])[0]
    assert unsure["k"] == 2 and unsure["pays"] == "unsure"  # 1.1x, but its interval straddles 1


def test_boundary_interpolates_in_log2_concurrency():
    # 1.5x at 4, 0.5x at 16: halfway in log2 between 4 (2) and 16 (4) -> 2^3 = 8.
    b = boundary([(1, 2.0), (16, 0.5), (4, 1.5)])
    assert b["status"] == "crosses" and b["concurrency"] == pytest.approx(8.0) and b["pays_up_to"] == 4
    # 1.2x at 1, 0.8x at 4: t = 0.2 / 0.4 -> 2^1 = 2.
    assert boundary([(1, 1.2), (4, 0.8)])["concurrency"] == pytest.approx(2.0)
    # speedup exactly 1 does not pay: the crossing is at that level.
    assert boundary([(1, 2.0), (2, 1.0)])["concurrency"] == pytest.approx(2.0)


def test_boundary_outside_the_measured_range():
    beyond = boundary([(1, 2.0), (4, 1.3), (16, 1.05)])
    assert beyond["status"] == "beyond" and beyond["concurrency"] is None and beyond["pays_up_to"] == 16
    assert "beyond the measured range" in beyond["text"]
    never = boundary([(1, 0.9), (4, 0.7)])
    assert never["status"] == "never" and never["pays_up_to"] is None
    assert boundary([])["status"] == "unmeasured"


def cell(draft, k, conc, speedup):
    return {"draft": draft, "k": k, "concurrency": conc, "request_rate": None, "speedup": speedup,
            "outputs_equal": True}


CELLS = [cell("d", 2, 1, 1.8), cell("d", 4, 1, 2.5), cell("d", 2, 4, 1.3), cell("d", 4, 4, 1.1),
         cell("d", 2, 16, 0.9), cell("d", 4, 16, 0.7)]


def test_best_k_per_concurrency_turns_speculation_off_where_no_k_pays():
    best = best_k_per_concurrency(CELLS)  # cells without timings: the fastest K
    assert [(b["concurrency"], b["k"], b["speedup"]) for b in best] == [(1, 4, 2.5), (4, 2, 1.3), (16, 0, 1.0)]
    assert best[2]["best_speedup"] == 0.9 and best[2]["best_speedup_k"] == 2
    tie = [cell("d", 2, 1, 1.5), cell("d", 4, 1, 1.5)]
    assert best_k_per_concurrency(tie)[0]["k"] == 2  # a tie goes to the cheaper K


def test_summarize_and_summary_lines():
    summary = summarize(CELLS + [cell("e", 2, 1, 0.8), {**cell("d", 2, None, 3.0), "request_rate": 2.0}])
    assert set(summary) == {"d", "e"}
    k2 = summary["d"]["per_k"][0]
    assert k2["k"] == 2 and k2["status"] == "crosses"
    assert k2["concurrency"] == pytest.approx(2 ** (2 + 0.3 / 0.4 * 2))  # 1.3 at 4 -> 0.9 at 16
    assert summary["e"]["per_k"][0]["status"] == "never"
    lines = summary_lines({"cells": CELLS, "boundary": summarize(CELLS)})
    assert lines[0].startswith("serving d K=2: 1.80x at concurrency 1, 0.90x at 16; speedup falls to 1x")
    assert lines[-1] == "serving d best K per concurrency: 1: K=4, 4: K=2, 16: off"


# -- /metrics ---------------------------------------------------------------------------------------
def metrics_text(e0: dict, e1: dict) -> str:
    """vLLM's /metrics as prometheus_client writes it: two engines, _created samples, another family."""
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge",
             'vllm:num_requests_running{engine="0",model_name="m"} 0.0']
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        full = f"vllm:spec_decode_{name}"
        lines += [f"# HELP {full}_total counter", f"# TYPE {full}_total counter",
                  f'{full}_total{{engine="0",model_name="m"}} {e0[name]}',
                  f'{full}_total{{engine="1",model_name="m"}} {e1[name]}',
                  f'{full}_created{{engine="0",model_name="m"}} 1.7e9']
    full = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"# HELP {full} per position", f"# TYPE {full} counter"]
    for engine, e in (("0", e0), ("1", e1)):
        lines += [f'{full}{{engine="{engine}",model_name="m",position="{i}"}} {v}' for i, v in enumerate(e["pos"])]
    return "\n".join(lines) + "\n"


def engine(drafts, draft_tokens, accepted, pos):
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted, "pos": pos}


def test_spec_counters_summed_over_engines():
    c = parse_spec_counters(metrics_text(engine(10, 20, 12, [7, 5]), engine(5, 10, 3, [2, 1])))
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (15, 30, 15)
    assert c.accepted_per_pos == {0: 9, 1: 6}
    assert c.acceptance_rate() == 0.5 and c.per_position_acceptance() == [9 / 15, 6 / 15]
    assert c.mean_accepted_tokens() == 2.0


def test_counter_difference_handles_a_reset_per_engine():
    before = metrics_text(engine(10, 20, 12, [7, 5]), engine(5, 10, 3, [2, 1]))
    # engine 0 moved on by (4, 8, 6, [4, 2]); engine 1 restarted and counted (2, 4, 1, [1, 0]) since.
    after = metrics_text(engine(14, 28, 18, [11, 7]), engine(2, 4, 1, [1, 0]))
    d = counters_delta(before, after)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens) == (6, 12, 7)
    assert d.accepted_per_pos == {0: 5, 1: 2}
    assert counters_delta(after, after).acceptance_rate() is None  # nothing drafted in between


def test_no_spec_counters_on_a_plain_server():
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    c = parse_spec_counters(text)
    assert c.drafts == 0 and c.acceptance_rate() is None and c.per_position_acceptance() == []


# -- settings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, key", [
    ({"engine": "sglang"}, "serve.engine"),
    ({"concurrency": []}, "serve.concurrency"),
    ({"concurrency": [0, 4]}, "serve.concurrency"),
    ({"request_rate": [0.0]}, "serve.request_rate"),
    ({"max_tokens": 0}, "serve.max_tokens"),
    ({"url": "http://h:8000"}, "serve.baseline_url"),
    ({"url": "h:8000", "baseline_url": "http://h:8001"}, "serve.url"),
    ({"gpu_memory_utilization": 1.5}, "serve.gpu_memory_utilization"),
])
def test_serving_settings_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ServingSettings(**kwargs)


def test_serving_settings_defaults_are_the_command_lines():
    """One declaration, one default: the Python API's ServingSettings() is what `draftsmith` composes."""
    from dataclasses import asdict

    from test_config import built

    s = ServingSettings()
    assert s.engine == "auto" and s.concurrency == [1, 8] and s.drafts == ["candidate"] and s.request_rate == []
    assert asdict(built().serve) == asdict(s)


# -- the scheduled column (eval/serving.py) -------------------------------------------------------------
def test_the_schedule_is_measured_only_when_the_best_k_changes_with_load():
    from draftsmith.eval.serving import schedule_to_measure

    drafts = {"trained": "d", "base": "b"}
    changing = CELLS + [cell("base", 2, 1, 3.0)]
    s = schedule_to_measure([{**c, "draft": "trained" if c["draft"] == "d" else c["draft"]} for c in changing],
                            drafts)
    assert s["draft"] == "trained" and [b["k"] for b in s["bands"]] == [4, 2, 0]
    assert s["schedule"][0][:1] == [1] and s["schedule"][-1][2] == 0  # contiguous from batch size 1, off at the top
    static = [cell("trained", 2, 1, 1.8), cell("trained", 4, 1, 1.2), cell("trained", 2, 8, 1.5)]
    assert schedule_to_measure(static, drafts) is None  # K=2 everywhere: already a measured column
    off = [cell("trained", 2, 1, 0.9), cell("trained", 2, 8, 0.8)]
    assert schedule_to_measure(off, drafts) is None


def test_track_schedule_compares_with_the_best_static_k_or_off_within_the_intervals():
    from draftsmith.eval.serving import track_schedule

    static = [{**cell("t", 4, 1, 2.5), "speedup_ci95": [2.3, 2.7]}, {**cell("t", 2, 1, 1.8), "speedup_ci95": [1.7, 1.9]},
              {**cell("t", 4, 16, 0.8), "speedup_ci95": [0.7, 0.9]}]
    good = {"draft": "t", "cells": [{**cell("t", None, 1, 2.4), "speedup_ci95": [2.2, 2.6]},
                                    {**cell("t", None, 16, 1.0), "speedup_ci95": [0.95, 1.05]}]}
    out = track_schedule(static, good)
    assert out["tracks"] is True
    assert [(r["concurrency"], r["best_static_k"]) for r in out["tracking"]] == [(1, 4), (16, 0)]
    bad = {"draft": "t", "cells": [{**cell("t", None, 1, 1.5), "speedup_ci95": [1.4, 1.6]}]}
    assert track_schedule(static, bad)["tracks"] is False


def test_a_schedule_that_falls_short_says_where_and_what_to_do():
    from draftsmith.eval.serving import track_schedule
    from draftsmith.eval.serving_stats import schedule_shortfall, summary_lines

    static = [{**cell("t", 2, 1, 1.5), "speedup_ci95": [1.3, 1.7]},
              {**cell("t", 2, 8, 0.85), "speedup_ci95": [0.75, 0.95]},
              {**cell("t", 4, 16, 1.2), "speedup_ci95": [1.1, 1.3]},
              {**cell("t", 2, 16, 0.9), "speedup_ci95": [0.8, 1.0]}]
    sched = {"draft": "t", "schedule": [[1, 2, 2], [3, 11, 0], [12, 16, 4]],
             "cells": [{**cell("t", None, 1, 1.4), "speedup_ci95": [1.2, 1.6]},
                       {**cell("t", None, 8, 0.69), "speedup_ci95": [0.52, 0.88]},   # off was best: K 0 is not off
                       {**cell("t", None, 16, 0.95), "speedup_ci95": [0.9, 1.0]}]}   # K=4 [1.1, 1.3] was best
    sched.update(track_schedule(static, sched))
    assert sched["tracks"] is False and [r["agrees"] for r in sched["tracking"]] == [True, False, False]
    text = schedule_shortfall(sched)
    assert "0.69x [0.52, 0.88] at concurrency 8 against off (1.00x)" in text
    assert "0.95x [0.90, 1.00] at concurrency 16 against K=4 1.20x [1.10, 1.30]" in text
    assert "1.40x" not in text  # the level that tracked is not listed
    assert "a K 0 band is not speculation off" in text and "promote.k_schedule=false" in text
    only_off = {**sched, "cells": sched["cells"][:2]}
    only_off.update(track_schedule(static, only_off))
    assert "K 0 band" in schedule_shortfall(only_off) and "k_schedule" not in schedule_shortfall(only_off)
    good = {**sched, "cells": [{**cell("t", None, 1, 1.5), "speedup_ci95": [1.3, 1.7]}]}
    good.update(track_schedule(static, good))
    assert good["tracks"] is True and schedule_shortfall(good) is None
    assert schedule_shortfall(None) is None and schedule_shortfall({**sched, "tracks": None}) is None
    lines = summary_lines({"cells": static, "rate_cells": [], "boundary": {}, "scheduled": sched})
    assert any(line.strip() == text for line in lines)


def test_undecided_serving_names_the_cells_more_passes_could_settle():
    from draftsmith.eval.serving import undecided_serving

    def timed(draft, k, conc, ratios):
        spec = [load(conc, [1.0 / r for r in ratios], 1.0)]
        plain = [load(conc, [1.0] * len(ratios), sum(ratios) / len(ratios))]
        return make_cell(draft, k, spec, plain)

    clear = timed("trained", 2, 4, [1.5, 1.6, 1.55, 1.5])
    straddling = timed("trained", 4, 4, [0.8, 1.6, 0.8, 1.6])
    drafts = {"trained": "d"}
    from draftsmith.eval.policy import Contract

    decide = Contract(at=(1.0, 1.1))
    assert undecided_serving([clear], drafts, 4, decide) == []
    assert undecided_serving([straddling], drafts, 4, decide) == [("trained", 4)]
    assert undecided_serving([straddling], drafts, 8, decide) == []  # nothing measured at that level
    # the candidate clears the bars, but its difference with production straddles the margin
    prod = timed("production", 2, 4, [1.4, 1.7, 1.5, 1.55])
    both = undecided_serving([clear, prod], {"trained": "d", "production": "p"}, 4, Contract(at=(1.0, 1.1), margin=0.02))
    assert both == [("trained", 2), ("production", 2)]
    # and with n-gram lookup beside it (a spec string, not a folder): its difference with the candidate straddles 0
    ngram = timed("ngram", 3, 4, [1.4, 1.7, 1.5, 1.55])
    free = undecided_serving([clear, ngram], {"trained": "d", "ngram": "ngram:2-4"}, 4,
                             Contract(at=(1.0, 1.1), free_margin=0.0))
    assert free == [("trained", 2), ("ngram", 3)]
    assert undecided_serving([clear, ngram], {"trained": "d", "ngram": "ngram:2-4"}, 4, decide) == []  # no free gate


def test_a_verdict_is_not_taken_on_a_cell_short_of_its_server_lives():
    """The decision lives went to lookup's K=4, then its choice moved to K=2, measured on one server life: the
    difference trained - lookup reads settled (wholly below 0) on the requests alone, but a cell on fewer lives
    than a decision is taken on is open — it is measured on lives of its own — and promotion holds the verdict."""
    from draftsmith.eval.policy import Contract
    from draftsmith.eval.serving import undecided_serving
    from draftsmith.eval.serving_stats import MIN_LIVES, lives_of, short_of_lives

    def lived(draft, k, speedup, servers):
        spec = [load(1, [1.0 / speedup * (1 + 0.01 * i)] * 4, 1.0) for i, _ in enumerate(servers)]
        for one, server in zip(spec, servers):
            one.server = server
        plain = [load(1, [1.0] * 4, speedup) for _ in servers]
        return make_cell(draft, k, spec, plain)

    mine = lived("trained", 2, 1.4, ["t+plain", "t+plain", "t-life2", "t-life3"])
    theirs = lived("ngram", 2, 1.9, ["n+plain", "n+plain"])
    drafts, decide = {"trained": "d", "ngram": "ngram:2-4"}, Contract(at=(1.1,), free_margin=0.0)
    assert (lives_of(mine), lives_of(theirs)) == (3, 1)
    assert undecided_serving([mine, theirs], drafts, 1, decide) == []  # settled on the requests alone
    assert undecided_serving([mine, theirs], drafts, 1, decide, lives=MIN_LIVES) == [("trained", 2), ("ngram", 2)]
    assert short_of_lives({"decision_servers": {"servers": 2}}, mine, theirs)
    assert not short_of_lives({"decision_servers": None}, mine, theirs)  # no lives asked for: none missing
    assert not short_of_lives({"decision_servers": {"servers": 2}}, mine, mine)


def test_passes_reach_counts_lives_where_added_passes_are_new_lives():
    """The most more passes could narrow a serving cell's interval: with new server lives and MIN_LIVES lives
    already, the lives' t-interval (3 lives, up to 5 passes from 4: 4 lives); else the passes (4 -> 6)."""
    from draftsmith.eval.intervals import narrowing
    from draftsmith.eval.serving_stats import passes_reach

    cell = {"repeats": 4, "timings": {"servers": ["a+plain", "a+plain", "a-life2", "a-life3"]}}
    assert passes_reach(cell, 6, new_lives=True) == pytest.approx(narrowing(3, 5, t=True))
    assert passes_reach(cell, 6, new_lives=False) == pytest.approx(narrowing(4, 6))
    two = {"repeats": 2, "timings": {"servers": ["a+plain", "a-life2"]}}  # too few lives: the passes count
    assert passes_reach(two, 5, new_lives=True) == pytest.approx(narrowing(2, 5))
    assert passes_reach(cell, 4, new_lives=True) == 1.0  # none left


def test_interleaved_servers_must_both_fit():
    from draftsmith.artifacts.errors import ConfigError

    with pytest.raises(ConfigError, match=r"serve.gpu_memory_utilization=0.9 with serve.interleave=true"):
        ServingSettings(gpu_memory_utilization=0.9)
    ServingSettings(gpu_memory_utilization=0.9, interleave=False)  # one server at a time
    ServingSettings(gpu_memory_utilization=0.45)


def test_a_cells_interval_holds_the_spread_of_three_server_lives_or_more():
    """Two passes per life agree within a life but the lives differ: with three lives the interval widens to the
    lives' t-interval; two lives (t_0.975 = 12.7 on one degree of freedom) keep the passes' bootstrap."""
    from draftsmith.eval.serving_stats import speedup_interval

    def timings(speedups, servers):
        plain = [[1.0 * s for _ in range(8)] for s in speedups]  # plain latency / spec latency = the speedup
        return {"plain_s": plain, "spec_s": [[1.0] * 8 for _ in speedups], "servers": servers}

    three = timings([1.8, 1.8, 2.0, 2.2], ["a", "a", "b", "c"])
    one = {k: v for k, v in three.items() if k != "servers"}  # the same passes, lives not recorded
    point = 7.8 / 4
    with_lives, without = speedup_interval(point, three), speedup_interval(point, one)
    assert with_lives[0] < without[0] and with_lives[1] > without[1]
    assert with_lives[0] < 1.8 < 2.2 < with_lives[1]
    two = timings([1.8, 1.8, 2.2, 2.2], ["a", "a", "b", "b"])
    assert speedup_interval(2.0, two) == speedup_interval(2.0, {k: v for k, v in two.items() if k != "servers"})


def _lives_cell(k: int, speedups: list[float], servers: list[str] | None) -> dict:
    """A concurrency-1 cell whose pass i ran on server life servers[i] at speedup speedups[i] (8 identical
    requests a pass: the requests alone carry no spread)."""
    timings = {"plain_s": [[s] * 8 for s in speedups], "spec_s": [[1.0] * 8 for _ in speedups]}
    if servers:
        timings["servers"] = servers
    speedup = sum(speedups) / len(speedups)
    from draftsmith.eval.serving_stats import speedup_interval

    return {"draft": "trained", "k": k, "concurrency": 1, "speedup": speedup,
            "speedup_ci95": speedup_interval(speedup, timings), "timings": timings}


def test_a_difference_of_cells_on_three_lives_holds_the_lives_spread():
    """K=4 reads 2.0 and K=2 1.9 on every request; within each life the passes agree, between lives they differ.
    On the requests alone the difference 0.1 is sure (a zero-width interval); with the cells' three server lives
    recorded the difference's interval (a candidate against its champion) holds 0. Fewer than three lives on
    either side leave the requests' interval."""
    from draftsmith.eval.serving_stats import cell_difference_ci

    lives = ["a", "b", "c"]
    k4, k2 = _lives_cell(4, [1.8, 2.0, 2.2], lives), _lives_cell(2, [1.7, 1.9, 2.1], ["x", "y", "z"])
    bare4, bare2 = _lives_cell(4, [1.8, 2.0, 2.2], None), _lives_cell(2, [1.7, 1.9, 2.1], None)
    assert cell_difference_ci(bare4, bare2) == pytest.approx([0.1, 0.1])
    lo, hi = cell_difference_ci(k4, k2)
    assert lo < 0.0 < 0.1 < hi
    two_lives = _lives_cell(2, [1.7, 1.9, 2.1], ["x", "x", "y"])
    assert cell_difference_ci(k4, two_lives) == pytest.approx([0.1, 0.1])


def test_the_k_to_serve_is_the_smallest_whose_interval_overlaps_the_fastest():
    """On vLLM each K runs on its own server starts, so two K are told apart only when their own intervals part:
    figures as a demo run read them (K=2 1.42x [1.21, 1.62], K=4 1.69x [1.52, 1.87] at concurrency 1, three server
    lives each) take K=2; K=2 wholly below K=4's interval is passed over; a K that clearly pays is not passed over
    for a faster K that is unsure (its interval reaching below 1); a K whose interval is unknown is not tied."""
    from draftsmith.eval.serving_stats import best_k_per_concurrency

    def cell(k, speedup, ci):
        return {"draft": "trained", "k": k, "concurrency": 1, "speedup": speedup, "speedup_ci95": ci,
                "timings": {"plain_s": [[speedup] * 4], "spec_s": [[1.0] * 4]}}

    choice = best_k_per_concurrency([cell(2, 1.42, [1.21, 1.62]), cell(4, 1.69, [1.52, 1.87])])[0]
    assert (choice["k"], choice["indistinguishable"], choice["pays"]) == (2, [2, 4], "yes")
    choice = best_k_per_concurrency([cell(2, 1.42, [1.30, 1.50]), cell(4, 1.69, [1.52, 1.87])])[0]
    assert (choice["k"], choice["indistinguishable"]) == (4, [4])
    choice = best_k_per_concurrency([cell(2, 1.22, [1.12, 1.32]), cell(4, 1.28, [0.94, 1.69])])[0]
    assert (choice["k"], choice["pays"]) == (2, "yes")  # K=2 surely pays where the fastest, K=4, is unsure
    assert best_k_per_concurrency([cell(2, 1.6, None), cell(4, 1.69, [1.52, 1.87])])[0]["k"] == 4


def test_contenders_are_the_k_whose_interval_overlaps_the_fastest():
    """One server life can tell K=2 (1.6x) from K=4 (1.85x) apart on its passes while their intervals overlap: both
    are contenders for the decision lives; a K whose interval lies wholly below the fastest's is not, nor one that
    does not pay; with no K paying, only the chosen one."""
    from draftsmith.eval.serving_stats import contenders

    def cell(k, speedup, ci):
        return {"draft": "trained", "k": k, "concurrency": 1, "speedup": speedup, "speedup_ci95": ci}

    cells = [cell(2, 1.6, [1.34, 1.81]), cell(4, 1.85, [1.69, 1.99]), cell(6, 1.2, [1.1, 1.3]),
             cell(8, 0.9, [0.8, 1.7])]
    assert contenders(cells) == [2, 4]
    assert contenders([cell(2, 0.8, [0.7, 0.9]), cell(4, 0.7, [0.6, 0.85])]) == [2]
    assert contenders([]) == []
