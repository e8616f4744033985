"""The serving A/B's statistics: pure functions over load results and vLLM's counters.

One *cell* is (draft, K, concurrency): the same requests served with speculation on (``spec``) and
off (``plain``), side by side. Names (one per quantity, as in serving.json and the report):

- ``output_tokens_per_s``: output tokens of the level / its wall time (first send -> last response);
- ``requests_per_s``: finished requests / wall time;
- ``ttft_ms_p50/p95``, ``tpot_ms_p50/p95``, ``e2e_ms_p50/p95``: percentiles over requests;
- ``speedup``: spec / plain ``output_tokens_per_s`` (> 1: speculation pays at this concurrency), pooled over
  the cell's passes (``serve.repeats``: every level driven that many times per server);
- ``speedup_ci95``: its 95% interval — a bootstrap (eval/intervals.py nested_ratio_ci) of
  sum(plain e2e) / sum(spec e2e), which is the throughput ratio of a closed loop in steady state (Little's
  law: throughput = concurrency x tokens / e2e), resampling the passes (a slow spell slows a whole pass)
  and then the requests within them (request i of a level sends the same prompt on both sides); scaled by
  speedup / that ratio so that it is centred on the throughput speedup. With one pass (``serve.repeats=1``)
  it is over requests only and leaves the pass-to-pass noise out. ``timings`` keeps the per-pass,
  per-request e2e seconds it is taken over;
- ``tpot_ratio``: spec / plain ``tpot_ms_p50`` (< 1: speculation makes each token faster);
- ``acceptance_rate``: vLLM's accepted / drafted tokens over the cell (counter differences),
  the same quantity as draftsmith's ``acceptance_rate``; ``per_position_acceptance``: accepted at
  position i / drafts, None from the first position not every draft reaches (vLLM counts a draft of any length
  and does not say how many reached position i: a prompt-lookup draft may be shorter than K, a scheduled
  server's K moves with the batch); ``mean_draft_tokens``: drafted tokens / drafts (K for a draft model at a
  static K); ``mean_accepted_tokens``: 1 + accepted / drafts;
- ``outputs_equal``: every request's greedy output identical with speculation on and off;
- the *boundary* of a (draft, K): the concurrency at which ``speedup`` falls to 1 (interpolated
  linearly in log2(concurrency) between the measured levels around the crossing).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from draftsmith.serve.metrics import SpecCounters
from draftsmith.eval.intervals import (ABOVE, BELOW, choose_k, difference_ci, format_ci, lives_ci,  # noqa: F401
                                      lives_ratio_ci, narrowing, nested_ratio_ci, ratio, units_from_passes, verdict)
from draftsmith.eval.load import LoadResult


def percentile(values, q: float) -> Optional[float]:
    """The `q`-th percentile (0..100) with linear interpolation between order statistics (numpy's default);
    None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(value: Optional[float]) -> Optional[float]:
    return None if value is None else value * 1e3


def side_stats(load: LoadResult) -> dict:
    """Throughput and latency percentiles of one side (spec or plain) of a cell; failed requests are counted
    apart and left out of the latencies."""
    ok = [r for r in load.requests if not r.error]
    tokens = sum(r.output_tokens for r in ok)
    wall = load.wall_s
    out = {"requests": len(ok), "errors": len(load.requests) - len(ok), "output_tokens": tokens, "wall_s": wall,
           "output_tokens_per_s": tokens / wall if wall > 0 else 0.0,
           "requests_per_s": len(ok) / wall if wall > 0 else 0.0}
    for name, values in (("ttft", [r.ttft_s for r in ok]), ("tpot", [r.tpot_s for r in ok]),
                         ("e2e", [r.e2e_s for r in ok])):
        for q in (50, 95):
            out[f"{name}_ms_p{q}"] = _ms(percentile(values, q))
    return out


def compare_outputs(spec: LoadResult, plain: LoadResult) -> dict:
    """Request-by-request comparison of the two sides' greedy outputs (token ids when both have them, else text).

    -> {"outputs_equal" (None when nothing could be compared), "compared", "mismatches", "by",
    "first_mismatch": {"request", "prompt_index", "position", "spec", "plain"} or None}.
    """
    plain_by = {r.index: r for r in plain.requests if not r.error}
    pairs = [(s, plain_by[s.index]) for s in spec.requests if not s.error and s.index in plain_by]
    by_ids = all(s.token_ids is not None and p.token_ids is not None for s, p in pairs)
    mismatches, first = 0, None
    for s, p in pairs:
        a, b = (s.token_ids, p.token_ids) if by_ids else (s.text, p.text)
        if a != b:
            mismatches += 1
            if first is None:
                pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                first = {"request": s.index, "prompt_index": s.prompt_index, "position": pos,
                         "spec": a[pos:pos + 8], "plain": b[pos:pos + 8]}
    return {"outputs_equal": (mismatches == 0) if pairs else None, "compared": len(pairs), "mismatches": mismatches,
            "by": "token_ids" if by_ids else "text", "first_mismatch": first}


def compare_reference(load: LoadResult, reference: list[list[int]]) -> Optional[bool]:
    """Whether every request's output token ids equal `reference[prompt_index]` (draftsmith's own greedy loop);
    None when the server returned no token ids."""
    done = [r for r in load.requests if not r.error]
    if not done or any(r.token_ids is None for r in done):
        return None
    return all(r.token_ids == list(reference[r.prompt_index]) for r in done)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def merge_passes(loads: list[LoadResult]) -> LoadResult:
    """The passes of one level as one load: every request (indices offset by pass, so that request i of pass j on
    one side meets request i of pass j on the other), wall times summed."""
    if not loads:
        raise ValueError("merge_passes needs at least one pass")
    width = max((len(load.requests) for load in loads), default=0)
    requests = [dataclasses.replace(r, index=j * width + r.index) for j, load in enumerate(loads)
                for r in load.requests]
    return LoadResult(concurrency=loads[0].concurrency, request_rate=loads[0].request_rate,
                      wall_s=sum(load.wall_s for load in loads), requests=requests)


def pass_latencies(loads: list[LoadResult]) -> list[list[Optional[float]]]:
    """[pass][request index] end-to-end seconds (None for a failed request) of one side of a cell."""
    out = []
    for load in loads:
        row = [None] * (max((r.index for r in load.requests), default=-1) + 1)
        for r in load.requests:
            row[r.index] = None if r.error else r.e2e_s
        out.append(row)
    return out


MIN_LIVES = 3  # server lives from which their spread enters a cell's interval (with two, t_0.975 is 12.7)


def speedup_interval(speedup: Optional[float], timings: dict) -> Optional[list[float]]:
    """The 95% interval of a cell's throughput speedup from its paired latencies (module docstring), or None: the
    passes resampled, then the requests within them (eval/intervals.py nested_ratio_ci), scaled by
    speedup / latency ratio. When the passes ran on more than one server life (``timings["servers"]``: the server
    pair of each pass; serve.decision_servers, serve.fresh_servers) and there are at least MIN_LIVES of them, the
    interval also holds the spread between lives (eval/intervals.py lives_ci): the wider bound on each side."""
    units = units_from_passes(timings["plain_s"], timings["spec_s"])
    passes = [[(p, s) for p, s in zip(plain, spec) if p is not None and s is not None]
              for plain, spec in zip(timings["plain_s"], timings["spec_s"])]
    ci = nested_ratio_ci(passes)
    if ci is None or speedup is None or not ratio(units):
        return None
    lives = timed_lives(timings)
    between = lives_ci(lives) if lives else None
    if between is not None:
        ci = [min(ci[0], between[0]), max(ci[1], between[1])]
    scale = speedup / ratio(units)
    return [ci[0] * scale, ci[1] * scale]


def timed_lives(timings: dict) -> Optional[list[list[list[tuple[float, float]]]]]:
    """A cell's paired (plain, spec) latencies grouped by server life ([life][pass][pair]) when its passes ran on at
    least MIN_LIVES server lives (``timings["servers"]``), else None: too few lives to estimate their spread."""
    servers = timings.get("servers") or []
    if len(set(servers)) < MIN_LIVES or len(servers) != len(timings["spec_s"]):
        return None
    passes = [[(p, s) for p, s in zip(plain, spec) if p is not None and s is not None]
              for plain, spec in zip(timings["plain_s"], timings["spec_s"])]
    return [[p for p, s in zip(passes, servers) if s == life] for life in dict.fromkeys(servers)]


def lives_of(cell: dict) -> int:
    """How many server lives (starts of its spec server) a cell's passes ran on (``timings["servers"]``)."""
    return len(set((cell.get("timings") or {}).get("servers") or []))


def lives_needed(decision_servers) -> int:
    """The server lives a cell a verdict is taken on must have run on: MIN_LIVES when the A/B gives decision cells
    more lives (`decision_servers` truthy: serve.decision_servers > 0, or serving.json's record of those lives),
    else none asked for."""
    return MIN_LIVES if decision_servers else 0


def lacks_lives(lives: int, *cells: Optional[dict]) -> bool:
    """Whether any of `cells` ran on fewer than `lives` server lives: such a cell's interval does not hold the spread
    between server starts, so a verdict is not taken on it (eval/serving.py asks for its lives)."""
    return any(c is not None and lives_of(c) < lives for c in cells)


def short_of_lives(serving: dict, *cells: Optional[dict]) -> bool:
    """Whether a verdict on `cells` would be taken on fewer server lives than the serving A/B recorded in `serving`
    (its serving.json) gives the cells it decides on (:func:`lives_needed`)."""
    return lacks_lives(lives_needed(serving.get("decision_servers")), *cells)


def passes_reach(cell: dict, max_passes: int, *, new_lives: bool) -> float:
    """At best, the factor by which `cell`'s interval narrows when it takes passes up to `max_passes` (eval/policy.py
    reach; eval/intervals.py narrowing): with `new_lives` (serve.decision_servers) each added pass is a new server
    life, and a cell on MIN_LIVES lives or more has the lives' t-interval, so the lives count; otherwise the
    passes do (optimistic where the lives would start to count: their spread is not known yet). 1.0 when no
    pass is left."""
    passes, more = cell.get("repeats") or 1, max(0, max_passes - (cell.get("repeats") or 1))
    lives = lives_of(cell)
    if new_lives and lives >= MIN_LIVES:
        return narrowing(lives, lives + more, t=True)
    return narrowing(passes, passes + more)


def cell_difference_ci(a: dict, b: dict) -> Optional[list[float]]:
    """The 95% interval of cell `a`'s speedup minus cell `b`'s (two K of one draft, or a candidate and its champion,
    served the same requests): the paired bootstrap over requests (eval/intervals.py difference_ci, each side's
    throughput / latency factor applied), and — when both cells ran on at least MIN_LIVES server lives — the wider
    bound with the interval of their ratio across lives (lives_ratio_ci, taken to a difference at `b`'s speedup:
    s_a - s_b = s_b (s_a / s_b - 1)), so that a difference is not declared on passes that share a server start.
    None when the requests leave nothing to resample."""
    ua, ub = cell_units(a), cell_units(b)
    ci = difference_ci(ua, ub, scale_a=throughput_scale(a), scale_b=throughput_scale(b)) if ua and ub else None
    if ci is None:
        return None
    la, lb = timed_lives(a["timings"]), timed_lives(b["timings"])
    rho = lives_ratio_ci(la, lb) if la and lb else None
    if rho is not None and b.get("speedup"):
        ci = [min(ci[0], b["speedup"] * (rho[0] - 1.0)), max(ci[1], b["speedup"] * (rho[1] - 1.0))]
    return ci


def throughput_scale(cell: dict) -> float:
    """speedup / latency ratio of a cell: the factor from its latency ratio to its throughput speedup."""
    units = cell_units(cell)
    r = ratio(units) if units else 0.0
    return cell["speedup"] / r if r and cell.get("speedup") else 1.0


def make_cell(draft: str, k: Optional[int], spec: LoadResult | list[LoadResult], plain: LoadResult | list[LoadResult],
              counters: Optional[SpecCounters] = None, full_positions: Optional[int] = None) -> dict:
    """One serving.json cell: both sides' statistics (pooled over their passes), their ratios and the speedup's
    interval, vLLM's acceptance and the output comparison. `full_positions`: the draft positions every draft
    reaches when not all K do (1 for prompt lookup, a schedule's smallest K; serve/metrics.py SpecCounters.counts):
    per-position acceptance from there on is unknown (None), not accepted / drafts."""
    spec_passes = spec if isinstance(spec, list) else [spec]
    plain_passes = plain if isinstance(plain, list) else [plain]
    spec, plain = merge_passes(spec_passes), merge_passes(plain_passes)
    s, p = side_stats(spec), side_stats(plain)
    timings = {"plain_s": pass_latencies(plain_passes), "spec_s": pass_latencies(spec_passes)}
    if any(load.server for load in spec_passes):  # the server pair of each pass (its life)
        timings["servers"] = [load.server for load in spec_passes]
    speedup = _ratio(s["output_tokens_per_s"], p["output_tokens_per_s"])
    cell = {"draft": draft, "k": k, "concurrency": spec.concurrency, "request_rate": spec.request_rate,
            "spec": s, "plain": p, "repeats": len(spec_passes),
            "speedup": speedup, "speedup_ci95": speedup_interval(speedup, timings),
            "tpot_ratio": _ratio(s["tpot_ms_p50"], p["tpot_ms_p50"]),
            "ttft_ratio": _ratio(s["ttft_ms_p50"], p["ttft_ms_p50"]), "timings": timings}
    c = counters or SpecCounters()
    cell.update(acceptance_rate=c.acceptance_rate(), per_position_acceptance=c.per_position_acceptance(full_positions),
                mean_draft_tokens=c.draft_tokens / c.drafts if c.drafts else None,
                mean_accepted_tokens=c.mean_accepted_tokens(),
                vllm_counters={"drafts": c.drafts, "draft_tokens": c.draft_tokens,
                               "accepted_tokens": c.accepted_tokens})
    cell.update(compare_outputs(spec, plain))
    return cell


def boundary(points: list[tuple[float, float]]) -> dict:
    """Where speculation stops paying, from (concurrency, speedup) points of one (draft, K).

    Speculation pays where speedup > 1. Scanning up from the lowest concurrency, the boundary is the
    first fall from > 1 to <= 1, interpolated linearly in log2(concurrency).
    -> {"status": "crosses" | "beyond" (pays at every measured level) | "never" (no gain even at the
    lowest), "concurrency" (the interpolated crossing, None unless "crosses"), "pays_up_to" (highest
    measured concurrency below the crossing), "text"}.
    """
    pts = sorted((c, s) for c, s in points if s is not None)
    if not pts:
        return {"status": "unmeasured", "concurrency": None, "pays_up_to": None, "text": "not measured"}
    if pts[0][1] <= 1.0:
        return {"status": "never", "concurrency": None, "pays_up_to": None,
                "text": f"no gain at any measured concurrency (speedup {pts[0][1]:.2f}x at {pts[0][0]:g})"}
    for (c0, s0), (c1, s1) in zip(pts, pts[1:]):
        if s1 <= 1.0:
            t = (s0 - 1.0) / (s0 - s1)
            at = 2 ** (math.log2(c0) + t * (math.log2(c1) - math.log2(c0)))
            return {"status": "crosses", "concurrency": at, "pays_up_to": c0,
                    "text": f"speedup falls to 1x at concurrency ~{at:.1f} (between {c0:g} and {c1:g})"}
    top = pts[-1][0]
    return {"status": "beyond", "concurrency": None, "pays_up_to": top,
            "text": f"beyond the measured range (still {pts[-1][1]:.2f}x at concurrency {top:g})"}


def cell_units(cell: dict):
    """The paired [request][pass] latencies of a cell (eval/intervals.py units), or None (no timings recorded)."""
    timings = cell.get("timings")
    return units_from_passes(timings["plain_s"], timings["spec_s"]) if timings else None


def best_k_per_concurrency(cells: list[dict]) -> list[dict]:
    """Per concurrency level, the K to serve among `cells` (one draft's closed-loop cells): the smallest K whose
    speedup is indistinguishable from the fastest K's (eval/intervals.py choose_k: its interval overlaps the
    fastest K's, with a verdict against 1 as sure; without intervals, the fastest K, ties to the smaller), or K = 0
    (speculation off) when that K does not gain (speedup <= 1).
    -> [{"concurrency", "k", "speedup" (1.0 for "off"), "speedup_ci95" (None for "off"), "indistinguishable" (K),
    "pays": "yes" (interval above 1) | "no" (below) | "unsure" (it straddles 1), "best_speedup",
    "best_speedup_ci95", "best_speedup_k" (the chosen K's figures, also when "off")}] sorted by concurrency."""
    out = []
    for conc in sorted({c["concurrency"] for c in cells}):
        here = {c["k"]: c for c in cells if c["concurrency"] == conc and c["speedup"] is not None}
        if not here:
            out.append({"concurrency": conc, "k": 0, "speedup": 1.0, "speedup_ci95": None, "indistinguishable": [],
                        "pays": "no", "best_speedup": None, "best_speedup_ci95": None, "best_speedup_k": None})
            continue
        units = {k: cell_units(c) for k, c in here.items()}
        if all(units.values()):
            choice = choose_k(units, speeds={k: c["speedup"] for k, c in here.items()},
                              intervals={k: c.get("speedup_ci95") for k, c in here.items()})
        else:  # cells written before intervals: the fastest K
            k = max(here.values(), key=lambda c: (c["speedup"], -c["k"]))["k"]
            choice = {"k": k, "indistinguishable": [k]}
        best = here[choice["k"]]
        v = verdict(best.get("speedup_ci95"), 1.0)
        pays = {ABOVE: "yes", BELOW: "no"}.get(v, "unsure")
        figures = {"best_speedup": best["speedup"], "best_speedup_ci95": best.get("speedup_ci95"),
                   "best_speedup_k": best["k"], "indistinguishable": choice["indistinguishable"], "pays": pays}
        if best["speedup"] <= 1.0:
            out.append({"concurrency": conc, "k": 0, "speedup": 1.0, "speedup_ci95": None, **figures})
        else:
            out.append({"concurrency": conc, "k": best["k"], "speedup": best["speedup"],
                        "speedup_ci95": best.get("speedup_ci95"), **figures})
    return out


def contenders(cells: list[dict]) -> list[int]:
    """The K among one draft's cells at one concurrency that its choice of K could go to on other measurements, sorted:
    the chosen K and those indistinguishable from the best (best_k_per_concurrency), and every K whose own speedup
    interval overlaps the fastest K's whatever its verdict (the lives may make it as sure as the fastest's, or part
    the two intervals). The decision lives measure them all, so that the choice between them is taken on the lives
    of each (a new server start can move one K's speedup by more than two K differ)."""
    here = [c for c in cells if c["k"] is not None and c["speedup"] is not None]
    if not here:
        return []
    choice = best_k_per_concurrency(here)[0]
    out = {choice["best_speedup_k"], *choice["indistinguishable"]}
    lead = max(here, key=lambda c: (c["speedup"], -c["k"]))
    lo, hi = lead.get("speedup_ci95") or (lead["speedup"], lead["speedup"])
    if lead["speedup"] > 1.0:
        out |= {c["k"] for c in here if c.get("speedup_ci95") and c["speedup"] > 1.0
                and c["speedup_ci95"][1] >= lo and c["speedup_ci95"][0] <= hi}
    return sorted(out)


def decision_level(levels: list[int], requested: Optional[int]) -> tuple[int, Optional[str]]:
    """(the measured concurrency a promotion decides at, a note when it is not `requested`); `levels` sorted.

    `requested` is promote.serving_concurrency: unset -> the lowest measured level; not measured -> the nearest
    measured level above it, else the highest."""
    if requested is None:
        return levels[0], (f"promote.serving_concurrency is unset: decided at the lowest measured concurrency, "
                           f"{levels[0]} (measured: {levels}); set it to the concurrency you serve at")
    if requested in levels:
        return requested, None
    above = [c for c in levels if c >= requested]
    if above:
        return above[0], (f"promote.serving_concurrency={requested} was not measured: decided at {above[0]}, the "
                          f"nearest measured concurrency above it (measured: {levels})")
    return levels[-1], (f"promote.serving_concurrency={requested} is above every measured concurrency: decided at the "
                        f"highest, {levels[-1]} (measured: {levels}); add it to serve.concurrency")


def k_bands(best: list[dict]) -> list[dict]:
    """The recommended K per concurrency band from best_k_per_concurrency(): consecutive measured levels with the
    same K merged -> [{"from", "to", "k"}, ..., {"from", "k"}] (the last band open-ended; K 0 = off)."""
    bands: list[dict] = []
    for entry in best:
        if bands and bands[-1]["k"] == entry["k"]:
            bands[-1]["to"] = entry["concurrency"]
        else:
            bands.append({"from": entry["concurrency"], "to": entry["concurrency"], "k": entry["k"]})
    if bands:
        del bands[-1]["to"]
    return bands


def summarize(cells: list[dict]) -> dict:
    """serving.json's ``boundary``: per draft, the boundary of each K and the best K per concurrency.

    -> {draft: {"per_k": [{"k", **boundary(...)}], "best_k": best_k_per_concurrency(...)}}; closed-loop
    cells only (open-loop cells have no concurrency).
    """
    closed = [c for c in cells if c["concurrency"] is not None]
    out = {}
    for draft in dict.fromkeys(c["draft"] for c in closed):
        mine = [c for c in closed if c["draft"] == draft]
        per_k = []
        for k in sorted({c["k"] for c in mine if c["k"] is not None}):
            per_k.append({"k": k, **boundary([(c["concurrency"], c["speedup"]) for c in mine if c["k"] == k])})
        out[draft] = {"per_k": per_k, "best_k": best_k_per_concurrency([c for c in mine if c["k"] is not None])}
    return out


def summary_lines(serving: dict) -> list[str]:
    """End-of-run table lines: per draft and K, the speedup at the lowest and highest concurrency and the boundary."""
    lines = []
    closed = [c for c in serving["cells"] if c["concurrency"] is not None]
    for draft, summary in serving["boundary"].items():
        for entry in summary["per_k"]:
            mine = sorted((c for c in closed if c["draft"] == draft and c["k"] == entry["k"]),
                          key=lambda c: c["concurrency"])
            lo, hi = mine[0], mine[-1]
            lines.append(f"serving {draft} K={entry['k']}: {_x(lo['speedup'], lo.get('speedup_ci95'))} at concurrency "
                         f"{lo['concurrency']}, {_x(hi['speedup'], hi.get('speedup_ci95'))} at {hi['concurrency']}; "
                         f"{entry['text']}")
        bands = ", ".join(f"{b['concurrency']}: {'off' if b['k'] == 0 else 'K=' + str(b['k'])}"
                          for b in summary["best_k"])
        lines.append(f"serving {draft} best K per concurrency: {bands}")
    for sched in (serving.get("scheduled"), serving.get("scheduled_free")):
        if not (sched and sched.get("tracking")):
            continue
        from draftsmith.serve.schedule import describe_schedule

        at = ", ".join(f"{_x(r['speedup'], r['speedup_ci95'])} at {r['concurrency']}" for r in sched["tracking"])
        tracks = {True: "yes", False: "NO", None: "unknown"}[sched.get("tracks")]
        lines.append(f"serving {sched['draft']} scheduled ({describe_schedule(sched['schedule'])}): {at}; tracks the "
                     f"best static K or off within the intervals: {tracks}")
        shortfall = schedule_shortfall(sched)
        if shortfall:
            lines.append(f"  {shortfall}")
    if serving.get("capacity"):
        from draftsmith.eval.capacity import capacity_lines

        lines += capacity_lines(serving["capacity"])
    unequal = [c for c in serving["cells"] if c.get("outputs_equal") is False]
    if unequal:
        lines.append(f"serving: greedy outputs differ with speculation on vs off in {len(unequal)} cell(s) "
                     "(see serving.json first_mismatch)")
    return lines


def schedule_shortfall(scheduled: Optional[dict]) -> Optional[str]:
    """Where the measured K schedule (serving.json's ``"scheduled"``, with its ``tracking`` rows) fell short of the
    best static choice at a level, in words with what to do; None when it tracked, or was not measured.

    A K 0 band is not speculation off: vLLM 0.32 still runs the draft's forward over the target's new tokens
    in a K 0 step, to keep the draft's KV cache in step (vllm/v1/spec_decode/llm_base_proposer.py ``propose``:
    "No draft tokens requested (e.g. Dynamic SD decided K=0). The prefill forward pass above already ran"), so
    above the boundary a schedule costs what the draft costs; only a server without ``--speculative-config``
    serves that load at the plain speed."""
    if not scheduled or scheduled.get("tracks") is not False:
        return None
    from draftsmith.serve.schedule import describe_schedule

    short = [r for r in scheduled.get("tracking") or [] if r.get("agrees") is False]
    against = "; ".join(
        f"{_x(r['speedup'], r['speedup_ci95'])} at concurrency {r['concurrency']} against "
        + ("off (1.00x)" if r["best_static_k"] == 0 else
           f"K={r['best_static_k']} {_x(r['best_static_speedup'], r.get('best_static_ci95'))}")
        for r in short)
    text = (f"the exported K schedule ({describe_schedule(scheduled['schedule'])}) fell short of the best static "
            f"choice: {against}")
    if any(r["best_static_k"] == 0 for r in short):
        text += ("; vLLM runs the draft's forward in a K 0 band too (keeping the draft's KV cache in step), so a K 0 "
                 "band is not speculation off: serve that load from a server without --speculative-config")
    if any(r["best_static_k"] != 0 for r in short):
        text += "; promote.k_schedule=false exports the static K chosen at the serving concurrency instead"
    return text


def _x(value: Optional[float], ci: Optional[list[float]] = None) -> str:
    return format_ci(value, ci)
