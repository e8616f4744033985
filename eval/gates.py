"""Promotion gates: may this draft replace the registry's current production draft? A pure function on intervals."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
from draftsmith.eval.intervals import ABOVE, BELOW, format_ci, verdict


@dataclass
class Gates:
    """Thresholds a candidate must clear (the promote stage's config)."""

    min_acceptance_rate: float = ACCEPTANCE_FLOOR  # decides only where no speedup was measured (0.5, decode/acceptance.py)
    min_speedup: float = 1.1  # the lower bound of the measured speedup's 95% interval must reach it, at the best K
    require_greedy_match: bool = True  # greedy_match must be 1.0
    champion_margin: float = 0.02  # the interval of (candidate - production) speedup must clear it (same eval set)
    free_margin: float = 0.0  # the interval of (candidate - best training-free method) speedup must clear it: a
    # trained draft is worth serving only where it beats speculation that needs no training (eval/serve baselines)

    def __post_init__(self):
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ConfigError(f"promote.min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")
        if self.min_speedup <= 0:
            raise ConfigError(f"promote.min_speedup must be > 0, got {self.min_speedup}")


PROMOTED, REFUSED, INCONCLUSIVE = "promoted", "refused", "inconclusive"
PASS, FAIL, UNSURE = "pass", "fail", "unsure"


def _from_verdict(v: str) -> str:
    return {ABOVE: PASS, BELOW: FAIL}.get(v, UNSURE)


def decide(candidate: dict, gates: Gates, champion: dict | None = None, champion_label: str | None = None,
           difference_ci95: list[float] | None = None, free: dict | None = None) -> dict:
    """The promotion decision for one candidate summary (eval metrics.json "summary" entry), taken on intervals.

    Args:
        candidate: {"best_k", "speedup", "speedup_ci95", "acceptance_rate", "greedy_match", ...} of the candidate.
            When it was taken from the serving A/B (draftsmith/promote.py), it also holds "serving":
            {"concurrency", "best_speedup", "best_speedup_k", "outputs_unequal": [cells named], ...}; "best_k" 0
            there means speculation does not pay at that concurrency for any K ("off"), which fails in place of
            the speedup gate.
        champion: the same for the current production draft on the same eval set (measured beside the
            candidate, or recorded when it was promoted), on the same basis (batch 1, or the serving A/B at
            the same concurrency), or None.
        champion_label: how reasons name the champion, e.g. "production v3" (default: the production draft).
        difference_ci95: the 95% interval of candidate speedup - champion speedup when both were measured side
            by side in this run (eval/intervals.py difference_ci); None: the champion's figure is a recorded one,
            and the candidate's own interval is compared with champion speedup + margin.
        free: the best training-free method measured beside the candidate on the same basis (n-gram prompt lookup:
            eval.baselines / serve.baselines; or vLLM's suffix decoding), {"name", "best_k", "pays" (False: its speedup's interval is wholly
            at or below 1 there), "speedup", "speedup_ci95", "difference_ci95" (candidate - it, paired; None when it
            does not pay or has no timings)}, or None (none measured): the "training_free" gate asks whether the draft beats it by more
            than ``free_margin`` on the interval of their difference, so that "no draft needed" is an answer.

    Each gate passes, fails or is unsure. The speedup gate passes when the interval's lower bound reaches
    ``min_speedup``, fails when its upper bound is below it, and is unsure when it straddles it (or there is no
    interval); the champion gate the same with the difference and ``champion_margin``. A measured speedup is not
    vetoed by a proxy: ``min_acceptance_rate`` decides only where no speedup was measured (``rule`` says which
    rule decided). Any failed gate refuses; else any unsure gate makes the decision **inconclusive** (not
    promoted: never on a lucky pass); else promoted.
    Returns:
        {"promote": bool, "decision": "promoted" | "refused" | "inconclusive", "rule", "reasons": [...] (every
        failed and unsure gate, or why it passed), "checks": [{"gate", "result", "reason"}], "gates", "candidate",
        "champion", "difference_ci95"}: what promotion.json records, accepted or not.
    """
    for key in ("best_k", "speedup", "acceptance_rate", "greedy_match"):
        if key not in candidate:
            raise ValueError(f"candidate metrics lack {key!r}: pass the 'summary' entry of an eval metrics.json")
    serving = candidate.get("serving")
    off = serving is not None and candidate["best_k"] == 0
    where = f"K={candidate['best_k']}" + (f", concurrency {serving['concurrency']}" if serving else "")
    ci = candidate.get("speedup_ci95")
    measured = bool(candidate["speedup"])
    shown = format_ci(candidate["speedup"], ci)
    passes = candidate.get("repeats")
    more = ("; measure more: raise serve.max_repeats (with serve.interleave), serve.repeats or serve.max_prompts"
            if serving else "; measure more: raise eval.max_prompts (the prompts' spread) or eval.max_repeats / "
            "eval.time_budget_s (the machine's noise)")
    if ci is None and candidate.get("repeats") is None and candidate["speedup"]:
        more = "; it was measured before draftsmith recorded intervals: run eval (and serve) again"
    checks = []

    def check_(gate: str, result: str, reason: str) -> None:
        checks.append({"gate": gate, "result": result, "reason": reason})

    if off:
        best_ci = serving.get("best_speedup_ci95")
        if best_ci is not None and best_ci[1] >= gates.min_speedup:  # the best K's interval still reaches the bar
            check_("speedup", UNSURE, "inconclusive: " + off_reason(serving) + f", but its 95% interval "
                   f"[{best_ci[0]:.2f}, {best_ci[1]:.2f}] reaches min_speedup {gates.min_speedup}{more}")
        else:
            check_("speedup", FAIL, off_reason(serving))
        rule = "serving A/B: no K pays at this concurrency"
    elif measured:
        result = _from_verdict(verdict(ci, gates.min_speedup))
        rule = "speedup interval"
        after = f" after {passes} pass{'es' if passes != 1 else ''}" if passes else ""
        if result == PASS:
            check_("speedup", PASS, f"speedup {shown} at {where}: its 95% interval clears min_speedup {gates.min_speedup}")
        elif result == FAIL:
            check_("speedup", FAIL, f"speedup {shown} at {where} < min_speedup {gates.min_speedup} (its whole 95% "
                                    "interval is below it)")
        else:
            why = "has no 95% interval (too few runs to estimate one)" if ci is None else \
                f"its 95% interval straddles min_speedup {gates.min_speedup}"
            check_("speedup", UNSURE, f"inconclusive: speedup {shown} at {where} {why}{after}"
                                      f"{more}; not promoted on an uncertain gain")
    else:
        rule = "acceptance rule of thumb (no speedup measured)"
        rate = candidate["acceptance_rate"]
        if rate < gates.min_acceptance_rate:
            check_("acceptance", FAIL, f"no speedup measured; acceptance rate {rate:.3f} < min_acceptance_rate "
                                       f"{gates.min_acceptance_rate}")
        else:
            check_("acceptance", PASS, f"no speedup measured; acceptance rate {rate:.3f} >= min_acceptance_rate "
                                       f"{gates.min_acceptance_rate}")
    if gates.require_greedy_match and candidate["greedy_match"] != 1.0:
        check_("greedy_match", FAIL, f"greedy_match {candidate['greedy_match']} != 1.0: speculative greedy output "
                                     "differed from plain decoding, which points to a broken pair or engine")
    if gates.require_greedy_match and serving and serving.get("outputs_unequal"):
        check_("greedy_match", FAIL, "vLLM's greedy outputs differ with speculation on vs off in "
               + "; ".join(serving["outputs_unequal"]) + ": this points to a broken pair or engine (serving.json "
               "first_mismatch)")
    label = champion_label or "the production draft"
    if champion is not None and not off:
        mine = format_ci(candidate["speedup"], ci, unit="", digits=3)
        theirs = f"{label}'s {format_ci(champion['speedup'], champion.get('speedup_ci95'), unit='', digits=3)}"
        if not measured:  # the acceptance rule decided: only the point figures can be compared
            result = PASS if candidate["speedup"] >= champion["speedup"] + gates.champion_margin else FAIL
            paired = ""
        elif difference_ci95 is not None:
            result = _from_verdict(verdict(difference_ci95, gates.champion_margin))
            paired = (f" (difference {candidate['speedup'] - champion['speedup']:+.3f} [{difference_ci95[0]:+.3f}, "
                      f"{difference_ci95[1]:+.3f}], measured side by side)")
        else:  # the candidate's own interval against the champion's figure
            result = _from_verdict(verdict(ci, champion["speedup"] + gates.champion_margin))
            paired = ""
        if result == PASS:
            check_("champion", PASS, f"speedup {mine} beats {theirs} by more than the margin {gates.champion_margin}"
                                     + paired)
        elif result == FAIL:
            check_("champion", FAIL, f"speedup {mine} does not beat {theirs} by the margin {gates.champion_margin}"
                                     + paired)
        else:
            check_("champion", UNSURE, f"inconclusive: speedup {mine} vs {theirs}: the 95% interval straddles the "
                                       f"margin {gates.champion_margin}{paired}{more}")
    if free is not None and not off and measured:
        check_("training_free", *free_check(candidate, free, gates.free_margin, more))
    failed = [c["reason"] for c in checks if c["result"] == FAIL]
    unsure = [c["reason"] for c in checks if c["result"] == UNSURE]
    decision = REFUSED if failed else (INCONCLUSIVE if unsure else PROMOTED)
    beats = f"; beats {champion_label or 'production'} ({champion['speedup']:.3f})" if champion is not None else ""
    at = f" in the serving A/B at {where}" if serving else ""
    passed = ["all gates passed" + at + beats]
    return {"promote": decision == PROMOTED, "decision": decision, "rule": rule,
            "reasons": failed + unsure if decision != PROMOTED else passed, "checks": checks, "gates": asdict(gates),
            "candidate": candidate, "champion": champion, "difference_ci95": difference_ci95, "training_free": free}


def free_check(candidate: dict, free: dict, margin: float, more: str = "") -> tuple[str, str]:
    """(result, reason) of the training-free gate: the candidate's speedup minus the best training-free method's,
    on the interval of their paired difference (``free["difference_ci95"]``), against `margin`. A method that does
    not pay where the decision is taken (``pays`` False: its interval wholly at or below 1) is no rival: the speedup
    gate already asks for more than speculation off."""
    name, k = free["name"], free.get("best_k")
    theirs = format_ci(free["speedup"], free.get("speedup_ci95"))
    if not free.get("pays", bool(k)):
        return PASS, f"{name} does not pay here ({theirs} at its best K): nothing free to beat"
    mine = format_ci(candidate["speedup"], candidate.get("speedup_ci95"))
    if free.get("short_lives"):  # the A/B could not give both cells their server lives (serve.max_repeats)
        return UNSURE, (f"inconclusive: speedup {mine} vs {name}'s {theirs} (K={k}, no training): "
                        f"{free['short_lives']}{more}")
    diff = free.get("difference_ci95")
    if diff is None:  # no paired timings: the candidate's own interval against its figure
        result = _from_verdict(verdict(candidate.get("speedup_ci95"), free["speedup"] + margin))
        shown = ""
    else:
        result = _from_verdict(verdict(diff, margin))
        shown = (f" (difference {candidate['speedup'] - free['speedup']:+.3f} [{diff[0]:+.3f}, {diff[1]:+.3f}], "
                 "measured side by side)")
    if result == PASS:
        return PASS, f"speedup {mine} beats {name} (K={k}, {theirs}), which needs no training{shown}"
    if result == FAIL:
        return FAIL, (f"serve {name} with K={k}: {theirs}; the trained draft ({mine}) adds nothing measurable over "
                      f"speculation that needs no training{shown}")
    return UNSURE, (f"inconclusive: speedup {mine} vs {name}'s {theirs} (K={k}, no training): the interval of the "
                    f"difference straddles {margin}{shown}{more}")


def off_reason(serving: dict) -> str:
    """Why a draft is not served at the serving A/B's concurrency: no K makes speculation pay there."""
    conc, best, k = serving["concurrency"], serving.get("best_speedup"), serving.get("best_speedup_k")
    if best is None:
        return f"at concurrency {conc} the serving A/B measured no speedup for any K: serve without speculation"
    slower = "slower than" if best < 1.0 else "no faster than"
    return (f"at concurrency {conc} speculation is {slower} plain decoding for every K (best speedup {best:.2f} at "
            f"K={k}): serve without speculation")
