"""The serving A/B's statistics: pure functions over load results and vLLM's counters.

One *cell* is (draft, K, concurrency): the same requests served with speculation on (``spec``) and
off (``plain``), side by side. Names (one per quantity, as in serving.json and the report):

- ``output_tokens_per_s``: output tokens of the level / its wall time (first send -> last response);
- ``requests_per_s``: finished requests / wall time;
- ``ttft_ms_p50/p95``, ``tpot_ms_p50/p95``, ``e2e_ms_p50/p95``: percentiles over requests;
- ``speedup``: spec / plain ``output_tokens_per_s`` (> 1: speculation pays at this concurrency);
- ``tpot_ratio``: spec / plain ``tpot_ms_p50`` (< 1: speculation makes each token faster);
- ``acceptance_rate``: vLLM's accepted / drafted tokens over the cell (counter differences),
  the same quantity as draftsmith's ``acceptance_rate``; ``per_position_acceptance``: accepted at
  position i / drafts; ``mean_accepted_tokens``: 1 + accepted / drafts;
- ``outputs_equal``: every request's greedy output identical with speculation on and off;
- the *boundary* of a (draft, K): the concurrency at which ``speedup`` falls to 1 (interpolated
  linearly in log2(concurrency) between the measured levels around the crossing).
"""

from __future__ import annotations

import math
from typing import Optional

from draftsmith.serve.metrics import SpecCounters
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


def make_cell(draft: str, k: Optional[int], spec: LoadResult, plain: LoadResult,
              counters: Optional[SpecCounters] = None) -> dict:
    """One serving.json cell: both sides' statistics, their ratios, vLLM's acceptance and the output comparison."""
    s, p = side_stats(spec), side_stats(plain)
    cell = {"draft": draft, "k": k, "concurrency": spec.concurrency, "request_rate": spec.request_rate,
            "spec": s, "plain": p,
            "speedup": _ratio(s["output_tokens_per_s"], p["output_tokens_per_s"]),
            "tpot_ratio": _ratio(s["tpot_ms_p50"], p["tpot_ms_p50"]),
            "ttft_ratio": _ratio(s["ttft_ms_p50"], p["ttft_ms_p50"])}
    c = counters or SpecCounters()
    cell.update(acceptance_rate=c.acceptance_rate(), per_position_acceptance=c.per_position_acceptance(),
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


def best_k_per_concurrency(cells: list[dict]) -> list[dict]:
    """Per concurrency level, the K with the highest speedup among `cells` (one draft's closed-loop cells), or
    K = 0 (speculation off) when no K gains (speedup <= 1); ties go to the smaller K.
    -> [{"concurrency", "k", "speedup"} sorted by concurrency] (speedup 1.0 for "off")."""
    out = []
    for conc in sorted({c["concurrency"] for c in cells}):
        here = [c for c in cells if c["concurrency"] == conc and c["speedup"] is not None]
        best = max(here, key=lambda c: (c["speedup"], -c["k"]), default=None)
        if best is None or best["speedup"] <= 1.0:
            out.append({"concurrency": conc, "k": 0, "speedup": 1.0})
        else:
            out.append({"concurrency": conc, "k": best["k"], "speedup": best["speedup"]})
    return out


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
            lines.append(f"serving {draft} K={entry['k']}: {_x(lo['speedup'])} at concurrency {lo['concurrency']}, "
                         f"{_x(hi['speedup'])} at {hi['concurrency']}; {entry['text']}")
        bands = ", ".join(f"{b['concurrency']}: {'off' if b['k'] == 0 else 'K=' + str(b['k'])}"
                          for b in summary["best_k"])
        lines.append(f"serving {draft} best K per concurrency: {bands}")
    unequal = [c for c in serving["cells"] if c.get("outputs_equal") is False]
    if unequal:
        lines.append(f"serving: greedy outputs differ with speculation on vs off in {len(unequal)} cell(s) "
                     "(see serving.json first_mismatch)")
    return lines


def _x(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
