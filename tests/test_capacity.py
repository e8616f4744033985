"""Capacity at a latency target (eval/capacity.py) on hand-made serving cells."""

import json

import pytest

from draftsmith.eval.capacity import capacity_at_slo, capacity_lines, capacity_markdown, side_meets


def side(tput, tpot95, ttft95, errors=0):
    return {"requests": 16, "errors": errors, "output_tokens": 0, "wall_s": 1.0, "output_tokens_per_s": tput,
            "requests_per_s": 1.0, "ttft_ms_p50": None if ttft95 is None else ttft95 / 2, "ttft_ms_p95": ttft95,
            "tpot_ms_p50": None if tpot95 is None else tpot95 / 2, "tpot_ms_p95": tpot95,
            "e2e_ms_p50": 100.0, "e2e_ms_p95": 200.0}


def cell(draft, k, conc, spec, plain):
    """One serving.json cell; `spec` / `plain` = (output tokens/s, p95 TPOT ms, p95 TTFT ms[, errors])."""
    s, p = side(*spec), side(*plain)
    return {"draft": draft, "k": k, "concurrency": conc, "request_rate": None, "spec": s, "plain": p,
            "speedup": s["output_tokens_per_s"] / p["output_tokens_per_s"]}


# plain (the same for every K): TPOT p95 20, 30, 45, 70 ms; TTFT p95 100, 200, 400, 900 ms at 1, 2, 4, 8
PLAIN = {1: (60.0, 20.0, 100.0), 2: (110.0, 30.0, 200.0), 4: (220.0, 45.0, 400.0), 8: (300.0, 70.0, 900.0)}
SPEC2 = {1: (120.0, 10.0, 120.0), 2: (200.0, 15.0, 250.0), 4: (260.0, 25.0, 450.0), 8: (310.0, 40.0, 1200.0)}
SPEC4 = {1: (150.0, 9.0, 130.0), 2: (230.0, 20.0, 260.0), 4: (250.0, 60.0, 500.0), 8: (280.0, 90.0, 1500.0)}


def grid(draft="trained", specs=None):
    specs = specs or {2: SPEC2, 4: SPEC4}
    return [cell(draft, k, c, sp[c], PLAIN[c]) for k, sp in specs.items() for c in sorted(sp)]


def entry(cap, draft, k):
    return next(e for e in cap["drafts"][draft]["per_k"] if e["k"] == k)


def test_no_target_no_capacity():
    assert capacity_at_slo(grid()) is None
    assert capacity_at_slo(grid(), slo_tpot_ms=None, slo_ttft_ms=None) is None
    assert capacity_lines(None) == [] and capacity_markdown(None) == ""
    with pytest.raises(ValueError, match="slo_tpot_ms"):
        capacity_at_slo(grid(), slo_tpot_ms=0)
    with pytest.raises(ValueError, match="slo_ttft_ms"):
        capacity_at_slo(grid(), slo_ttft_ms="500")


def test_tpot_target_only():
    cap = capacity_at_slo(grid(), slo_tpot_ms=50)
    assert cap["slo"] == {"tpot_ms_p95": 50.0, "ttft_ms_p95": None} and cap["rule"] == "monotone"
    k2, k4 = entry(cap, "trained", 2), entry(cap, "trained", 4)
    assert k2["levels"] == [1, 2, 4, 8]
    assert k2["spec"]["concurrency"] == 8 and k2["spec"]["output_tokens_per_s"] == 310.0  # TPOT 40 <= 50
    assert k2["plain"]["concurrency"] == 4 and k2["plain"]["output_tokens_per_s"] == 220.0  # 70 > 50 at 8
    assert k2["gain"] == pytest.approx(310 / 220)
    assert k4["spec"]["concurrency"] == 2 and k4["spec"]["output_tokens_per_s"] == 230.0  # 60 > 50 at 4
    assert k4["plain"] == k2["plain"]  # the plain figures are repeated per K
    assert k4["gain"] == pytest.approx(230 / 220)
    json.dumps(cap)  # serving.json-ready


def test_ttft_target_only():
    cap = capacity_at_slo(grid(), slo_ttft_ms=420)
    k2, k4 = entry(cap, "trained", 2), entry(cap, "trained", 4)
    assert k2["spec"]["concurrency"] == 2 and k2["spec"]["output_tokens_per_s"] == 200.0  # 450 > 420 at 4
    assert k4["spec"]["concurrency"] == 2 and k4["spec"]["output_tokens_per_s"] == 230.0
    assert k2["plain"]["concurrency"] == 4 and k2["plain"]["output_tokens_per_s"] == 220.0  # 400 <= 420
    assert k2["gain"] == pytest.approx(200 / 220) and k4["gain"] == pytest.approx(230 / 220)


def test_both_targets_must_hold():
    # TPOT <= 50 alone: K=2 reaches 8; TTFT <= 1000 alone: K=2 reaches 4 (1200 at 8); both: 4
    cap = capacity_at_slo(grid(), slo_tpot_ms=50, slo_ttft_ms=1000)
    k2 = entry(cap, "trained", 2)
    assert k2["spec"] == {"concurrency": 4, "output_tokens_per_s": 260.0, "tpot_ms_p95": 25.0, "ttft_ms_p95": 450.0}
    assert k2["plain"]["concurrency"] == 4  # TTFT 900 <= 1000 but TPOT 70 > 50 at 8
    assert cap["slo"] == {"tpot_ms_p95": 50.0, "ttft_ms_p95": 1000.0}


def test_a_side_that_meets_at_no_level():
    cap = capacity_at_slo(grid(), slo_tpot_ms=15)  # plain's lowest is 20 ms; K=2 meets at 1, 2; K=4 at 1
    k2, k4 = entry(cap, "trained", 2), entry(cap, "trained", 4)
    assert k2["plain"] is None and k2["gain"] is None
    assert k2["spec"]["concurrency"] == 2 and k4["spec"]["concurrency"] == 1
    best = cap["drafts"]["trained"]["best"]
    assert best == {"k": 2, "concurrency": 2, "output_tokens_per_s": 200.0, "gain": None}
    none = capacity_at_slo(grid(), slo_tpot_ms=5)  # nobody meets it
    assert all(e["spec"] is None and e["plain"] is None for e in none["drafts"]["trained"]["per_k"])
    assert none["drafts"]["trained"]["best"] is None
    lines = capacity_lines(none)
    assert "trained K=2: does not meet the target at any measured concurrency (off: does not meet" in lines[0]


def test_errors_or_a_missing_percentile_disqualify():
    cells = grid(specs={2: {**SPEC2, 4: (260.0, 25.0, 450.0, 1)}})  # one failed request at 4
    k2 = entry(capacity_at_slo(cells, slo_tpot_ms=50), "trained", 2)
    assert k2["spec"]["concurrency"] == 2  # 4 fails on errors, and the monotone rule stops there
    assert k2["passes_above"]["spec"] == [8]
    assert not side_meets(side(100.0, 10.0, 10.0, errors=1), slo_tpot_ms=50)
    assert side_meets(side(100.0, 10.0, 10.0), slo_tpot_ms=50)
    assert not side_meets(side(100.0, None, 10.0), slo_tpot_ms=50)  # no TPOT measured
    assert side_meets(side(100.0, None, 10.0), slo_ttft_ms=50)  # ...which a TTFT-only target does not need
    assert not side_meets(None, slo_tpot_ms=50)


def test_non_monotone_levels_use_the_monotone_rule():
    noisy = {1: (120.0, 10.0, 100.0), 2: (200.0, 55.0, 100.0), 4: (260.0, 30.0, 100.0), 8: (310.0, 40.0, 100.0)}
    cap = capacity_at_slo(grid(specs={2: noisy}), slo_tpot_ms=50)
    k2 = entry(cap, "trained", 2)
    # 2 fails (55 > 50) while 4 and 8 pass: capacity stops below the first failure
    assert k2["spec"]["concurrency"] == 1 and k2["spec"]["output_tokens_per_s"] == 120.0
    assert k2["passes_above"] == {"spec": [4, 8], "plain": []}
    assert "spec also meets it at 4, 8 above a failing level" in capacity_lines(cap)[0]
    low = {**noisy, 1: (120.0, 60.0, 100.0)}  # the lowest level fails: no capacity at all
    k2 = entry(capacity_at_slo(grid(specs={2: low}), slo_tpot_ms=50), "trained", 2)
    assert k2["spec"] is None and k2["gain"] is None and k2["passes_above"]["spec"] == [4, 8]


def test_best_k_and_off():
    best = capacity_at_slo(grid(), slo_tpot_ms=50)["drafts"]["trained"]["best"]
    assert best == {"k": 2, "concurrency": 8, "output_tokens_per_s": 310.0, "gain": pytest.approx(310 / 220)}
    # TTFT <= 420: K=2 200, K=4 230 tok/s at 2; off 220 at 4 -> K=4
    assert capacity_at_slo(grid(), slo_ttft_ms=420)["drafts"]["trained"]["best"]["k"] == 4
    # TTFT <= 125: K=2 120 at 1, K=4 none (130 ms at 1), off 60 at 1 -> K=2, 2x
    assert capacity_at_slo(grid(), slo_ttft_ms=125)["drafts"]["trained"]["best"] == {
        "k": 2, "concurrency": 1, "output_tokens_per_s": 120.0, "gain": 2.0}
    # TPOT <= 50, TTFT <= 1000: K=2 260 at 4, off 220 at 4 -> K=2; with a slower K=2 (200 at 4), off
    both = dict(slo_tpot_ms=50, slo_ttft_ms=1000)
    assert capacity_at_slo(grid(specs={2: SPEC2}), **both)["drafts"]["trained"]["best"]["k"] == 2
    slow = {**SPEC2, 4: (200.0, 25.0, 450.0)}
    best = capacity_at_slo(grid(specs={2: slow}), **both)["drafts"]["trained"]
    assert best["best"] == {"k": 0, "concurrency": 4, "output_tokens_per_s": 220.0, "gain": 1.0}
    # ties: the smaller K wins, and off (K = 0) wins a tie with speculation
    tie = {2: {1: (150.0, 9.0, 1.0)}, 4: {1: (150.0, 9.0, 1.0)}}
    cells = [cell("d", k, 1, sp[1], (100.0, 20.0, 1.0)) for k, sp in tie.items()]
    assert capacity_at_slo(cells, slo_tpot_ms=50)["drafts"]["d"]["best"]["k"] == 2
    cells = [cell("d", k, 1, sp[1], (150.0, 20.0, 1.0)) for k, sp in tie.items()]
    assert capacity_at_slo(cells, slo_tpot_ms=50)["drafts"]["d"]["best"]["k"] == 0
    # no K meets the target but off does -> off
    cap = capacity_at_slo(grid(specs={4: SPEC4}), slo_tpot_ms=21, slo_ttft_ms=110)
    assert cap["drafts"]["trained"]["best"] == {"k": 0, "concurrency": 1, "output_tokens_per_s": 60.0, "gain": 1.0}


def test_open_loop_and_unknown_k_cells_are_left_out():
    cells = grid() + [{**cell("trained", 2, None, (999.0, 1.0, 1.0), (1.0, 1.0, 1.0)), "request_rate": 2.0},
                      cell("other", None, 1, (999.0, 1.0, 1.0), (1.0, 1.0, 1.0))]
    cap = capacity_at_slo(cells, slo_tpot_ms=50)
    assert list(cap["drafts"]) == ["trained"]
    assert entry(cap, "trained", 2)["levels"] == [1, 2, 4, 8]
    assert entry(cap, "trained", 2)["spec"]["output_tokens_per_s"] == 310.0


def test_lines_and_markdown_carry_the_numbers():
    cells = grid() + grid("vanilla", {2: {c: (v[0] * 0.5, v[1], v[2]) for c, v in SPEC2.items()}})
    cap = capacity_at_slo(cells, slo_tpot_ms=50)
    lines = capacity_lines(cap)
    assert lines[0] == "capacity at p95 TPOT <= 50 ms: trained K=2: concurrency 8, 310 tok/s (off: 4, 220 tok/s; 1.41x)"
    assert lines[1] == "capacity at p95 TPOT <= 50 ms: trained K=4: concurrency 2, 230 tok/s (off: 4, 220 tok/s; 1.05x)"
    assert lines[2] == "capacity at p95 TPOT <= 50 ms: trained best: K=2 (concurrency 8, 310 tok/s; 1.41x)"
    assert lines[3] == "capacity at p95 TPOT <= 50 ms: vanilla K=2: concurrency 8, 155 tok/s (off: 4, 220 tok/s; 0.70x)"
    assert lines[4] == "capacity at p95 TPOT <= 50 ms: vanilla best: off (concurrency 4, 220 tok/s)"
    assert len(lines) == 5
    both = capacity_lines(capacity_at_slo(cells, slo_tpot_ms=50, slo_ttft_ms=1000))
    assert both[0].startswith("capacity at p95 TPOT <= 50 ms and TTFT <= 1000 ms: "
                              "trained K=2: concurrency 4, 260 tok/s")

    md = capacity_markdown(cap)
    assert "## Capacity at a latency target" in md and "p95 TPOT <= 50 ms" in md
    assert "| trained | 2 | 8 | 310.0 | 4 | 220.0 | 1.41x |  |" in md
    assert "| trained | 4 | 2 | 230.0 | 4 | 220.0 | 1.05x |  |" in md
    assert "| vanilla | 2 | 8 | 155.0 | 4 | 220.0 | 0.70x |  |" in md
    assert "- trained best at the target: K=2 (concurrency 8, 310 tok/s; 1.41x)" in md
    assert "- vanilla best at the target: off (concurrency 4, 220 tok/s)" in md
    assert "measured beside each row" in md and "every measured level below it" in md
    none = capacity_markdown(capacity_at_slo(cells, slo_tpot_ms=15))
    assert "| trained | 2 | 2 | 200.0 | not met | - | - |  |" in none
