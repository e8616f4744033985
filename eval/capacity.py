"""Capacity at a latency target: the highest measured concurrency that meets a p95 latency SLO, and the
throughput there, with speculation on (``spec``) vs off (``plain``), from serving.json's cells.

A team sizing a fleet asks "at p95 TPOT <= 50 ms, how many concurrent requests does one server take, at
how many tokens/s, and does speculation raise that?". Pure functions over the closed-loop cells of
eval/serving_stats.py (one per (draft, K, concurrency), each with a ``spec`` and a ``plain`` side).

Meeting the target. A side of a cell *meets* the target when it has no failed requests (``errors`` == 0)
and its ``tpot_ms_p95 <= slo_tpot_ms`` and ``ttft_ms_p95 <= slo_ttft_ms`` (only the targets that are
set; a missing percentile of a set target does not meet it). Should one concurrency level hold several
cells of the same (draft, K), the level meets only if all of them do, at the lowest of their throughputs.

Capacity: the *monotone* rule. Latency grows with load, so a level that passes above a failing lower
level is taken to be noise, not capacity: the capacity of a side is the highest measured concurrency
such that it **and every measured level below it** meet the target (None when the lowest level
already fails). Levels above the capacity that still met the target are listed in ``passes_above``, so
the noise is visible rather than silently dropped.

Plain (speculation off) is the same server for every draft and K; each (draft, K) entry's plain figures
come from that (draft, K)'s own cells' ``plain`` sides: with ``serve.interleave`` (the default) each cell's
plain passes were measured beside its own spec server, so they differ a little from row to row (machine
noise); with ``serve.interleave=false`` one plain run is shared and they are identical.

``gain`` = spec capacity ``output_tokens_per_s`` / plain capacity ``output_tokens_per_s`` (the two may sit
at different concurrencies); None when either side meets the target at no level (or plain's is 0).

``best`` per draft: the K whose spec side has the highest throughput at the target (ties: the smaller K),
compared with the off figure, which is the highest plain capacity throughput among that draft's entries
(they are the same server; taking the highest asks speculation to beat the best off measurement).
K = 0 ("off") wins when the off figure is >= the best spec figure (K = 0 is the smallest K, so ties go
to off, as in serving_stats.best_k_per_concurrency) or when no K meets the target; ``gain`` is then 1.0.
When spec meets the target but off meets it nowhere, ``gain`` is None. ``best`` is None when neither
spec at any K nor plain meets the target.

:func:`capacity_at_slo` returns (JSON-serialisable)::

    {"slo": {"tpot_ms_p95": float | None, "ttft_ms_p95": float | None},
     "rule": "monotone",
     "drafts": {draft: {
         "per_k": [{"k", "levels": [measured concurrencies, ascending],
                    "spec": {"concurrency", "output_tokens_per_s", "tpot_ms_p95", "ttft_ms_p95"} | None,
                    "plain": {the same} | None,
                    "gain": float | None,
                    "passes_above": {"spec": [levels above the capacity that met the target],
                                     "plain": [...]}}],                    # ascending K
         "best": {"k" (0 = off), "concurrency", "output_tokens_per_s", "gain"} | None}}}

or None when neither target is set. Drafts appear in the order of their first cell; cells without a
concurrency (open loop) or without a K are left out, and a draft with none left is absent.
:func:`capacity_lines` gives the end-of-run lines, :func:`capacity_markdown` the report.md section.
"""

from __future__ import annotations

from typing import Optional

RULE = "monotone"
NOT_MET = "does not meet the target at any measured concurrency"


def _check_target(name: str, value) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of milliseconds, got {value!r}")
    return float(value)


def side_meets(side: Optional[dict], *, slo_tpot_ms: Optional[float] = None,
               slo_ttft_ms: Optional[float] = None) -> bool:
    """Whether one side (spec or plain) of a cell meets the p95 targets that are set: no errors, and each
    set target's percentile present and <= the target."""
    if not side or side.get("errors", 0) > 0:
        return False
    for target, key in ((slo_tpot_ms, "tpot_ms_p95"), (slo_ttft_ms, "ttft_ms_p95")):
        if target is not None and (side.get(key) is None or side[key] > target):
            return False
    return True


def _side_capacity(levels: list, sides_at: dict, **slo) -> tuple[Optional[dict], list]:
    """The monotone capacity of one side over ascending `levels` ({level: [side dicts]}): -> (the record at the
    capacity or None, the levels above it that met the target)."""
    capacity, passes_above, broken = None, [], False
    for level in levels:
        sides = sides_at[level]
        ok = all(side_meets(s, **slo) for s in sides)
        if ok and not broken:
            worst = min(sides, key=lambda s: s.get("output_tokens_per_s") or 0.0)
            capacity = {"concurrency": level, "output_tokens_per_s": worst.get("output_tokens_per_s"),
                        "tpot_ms_p95": max(s.get("tpot_ms_p95") for s in sides)
                        if all(s.get("tpot_ms_p95") is not None for s in sides) else None,
                        "ttft_ms_p95": max(s.get("ttft_ms_p95") for s in sides)
                        if all(s.get("ttft_ms_p95") is not None for s in sides) else None}
        elif ok:
            passes_above.append(level)
        else:
            broken = True
    return capacity, passes_above


def _tput(record: Optional[dict]) -> Optional[float]:
    return None if record is None else record.get("output_tokens_per_s")


def _gain(spec: Optional[dict], plain: Optional[dict]) -> Optional[float]:
    a, b = _tput(spec), _tput(plain)
    return a / b if a is not None and b else None


def _best(per_k: list[dict]) -> Optional[dict]:
    met = [e for e in per_k if e["spec"] is not None]
    top = max(met, key=lambda e: (_tput(e["spec"]) or 0.0, -e["k"]), default=None)
    plains = [e["plain"] for e in per_k if e["plain"] is not None]
    off = max(plains, key=lambda p: (_tput(p) or 0.0, -p["concurrency"]), default=None)
    if top is None and off is None:
        return None
    if off is not None and (top is None or (_tput(off) or 0.0) >= (_tput(top["spec"]) or 0.0)):
        return {"k": 0, "concurrency": off["concurrency"], "output_tokens_per_s": _tput(off), "gain": 1.0}
    return {"k": top["k"], "concurrency": top["spec"]["concurrency"], "output_tokens_per_s": _tput(top["spec"]),
            "gain": _gain(top["spec"], off)}


def capacity_at_slo(cells: list[dict], *, slo_tpot_ms: Optional[float] = None,
                    slo_ttft_ms: Optional[float] = None) -> Optional[dict]:
    """Per draft and K, the highest measured concurrency meeting the p95 targets (monotone rule) and the
    throughput there, speculation on and off, their gain and the best K per draft; None when neither target
    is set. See the module docstring for the rules and the return shape. Raises ValueError on a target
    that is not a positive number."""
    slo = {"slo_tpot_ms": _check_target("slo_tpot_ms", slo_tpot_ms),
           "slo_ttft_ms": _check_target("slo_ttft_ms", slo_ttft_ms)}
    if slo["slo_tpot_ms"] is None and slo["slo_ttft_ms"] is None:
        return None
    closed = [c for c in cells if c.get("concurrency") is not None and c.get("k") is not None]
    drafts = {}
    for draft in dict.fromkeys(c["draft"] for c in closed):
        mine = [c for c in closed if c["draft"] == draft]
        per_k = []
        for k in sorted({c["k"] for c in mine}):
            at_k = [c for c in mine if c["k"] == k]
            levels = sorted({c["concurrency"] for c in at_k})
            entry = {"k": k, "levels": levels}
            passes = {}
            for side in ("spec", "plain"):
                sides_at = {lv: [c.get(side) for c in at_k if c["concurrency"] == lv] for lv in levels}
                entry[side], passes[side] = _side_capacity(levels, sides_at, **slo)
            entry["gain"] = _gain(entry["spec"], entry["plain"])
            entry["passes_above"] = passes
            per_k.append(entry)
        drafts[draft] = {"per_k": per_k, "best": _best(per_k)}
    return {"slo": {"tpot_ms_p95": slo["slo_tpot_ms"], "ttft_ms_p95": slo["slo_ttft_ms"]}, "rule": RULE,
            "drafts": drafts}


def _slo_text(slo: dict) -> str:
    parts = [f"{name} <= {slo[key]:g} ms" for name, key in (("TPOT", "tpot_ms_p95"), ("TTFT", "ttft_ms_p95"))
             if slo.get(key) is not None]
    return "p95 " + " and ".join(parts)


def _at(record: Optional[dict], concurrency_word: bool = True) -> str:
    if record is None:
        return NOT_MET
    tput = record.get("output_tokens_per_s")
    tok = "n/a tok/s" if tput is None else f"{tput:.0f} tok/s"
    return f"{'concurrency ' if concurrency_word else ''}{record['concurrency']:g}, {tok}"


def _x(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _noise(entry: dict) -> str:
    notes = [f"{'spec' if side == 'spec' else 'off'} also meets it at {', '.join(f'{lv:g}' for lv in levels)} "
             "above a failing level" for side, levels in entry["passes_above"].items() if levels]
    return f" [{'; '.join(notes)}]" if notes else ""


def _best_text(best: Optional[dict]) -> str:
    if best is None:
        return f"neither on nor off {NOT_MET}"
    if best["k"] == 0:
        return f"off (concurrency {best['concurrency']:g}, {best['output_tokens_per_s']:.0f} tok/s)"
    gain = "off does not meet the target" if best["gain"] is None else _x(best["gain"])
    return (f"K={best['k']} (concurrency {best['concurrency']:g}, {best['output_tokens_per_s']:.0f} tok/s; "
            f"{gain})")


def capacity_lines(capacity: Optional[dict]) -> list[str]:
    """End-of-run lines: one per draft x K ("capacity at p95 TPOT <= 50 ms: trained K=2: concurrency 8,
    310 tok/s (off: 4, 220 tok/s; 1.41x)"), then each draft's best; [] for None."""
    if capacity is None:
        return []
    head = f"capacity at {_slo_text(capacity['slo'])}"
    lines = []
    for draft, summary in capacity["drafts"].items():
        for e in summary["per_k"]:
            off = "off: " + (NOT_MET if e["plain"] is None else _at(e["plain"], concurrency_word=False))
            if e["gain"] is not None:
                off += f"; {_x(e['gain'])}"
            lines.append(f"{head}: {draft} K={e['k']}: {_at(e['spec'])} ({off}){_noise(e)}")
        lines.append(f"{head}: {draft} best: {_best_text(summary['best'])}")
    return lines


def capacity_markdown(capacity: Optional[dict]) -> str:
    """The capacity figures as a report.md section (a table per draft x K and the best per draft); "" for None."""
    if capacity is None:
        return ""
    lines = ["", "## Capacity at a latency target", "",
             f"Target: {_slo_text(capacity['slo'])} (no failed requests). Capacity = the highest measured "
             "concurrency such that it and every measured level below it meet the target; tokens/s are "
             "output tokens/s at that level. Off (no speculation) is the same server for every draft and K, measured "
             "beside each row's spec server. Gain = tokens/s on / off at the respective capacities.", "",
             "| draft | K | concurrency on | tokens/s on | concurrency off | tokens/s off | gain | note |",
             "|---|---|---|---|---|---|---|---|"]

    def cols(record):
        if record is None:
            return "not met", "-"
        t = record.get("output_tokens_per_s")
        return f"{record['concurrency']:g}", "-" if t is None else f"{t:.1f}"

    for draft, summary in capacity["drafts"].items():
        for e in summary["per_k"]:
            (sc, st), (pc, pt) = cols(e["spec"]), cols(e["plain"])
            note = _noise(e).strip(" []") or ""
            lines.append(f"| {draft} | {e['k']} | {sc} | {st} | {pc} | {pt} | "
                         f"{'-' if e['gain'] is None else _x(e['gain'])} | {note} |")
    lines.append("")
    lines += [f"- {draft} best at the target: {_best_text(s['best'])}" for draft, s in capacity["drafts"].items()]
    return "\n".join(lines) + "\n"
