"""Promotion gates: may this draft replace the registry's current production draft? A pure function."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR


@dataclass
class Gates:
    """Thresholds a candidate must clear (the promote stage's config)."""

    min_acceptance_rate: float = ACCEPTANCE_FLOOR  # at the best K (0.5, decode/acceptance.py)
    min_speedup: float = 1.1  # measured, at the best K
    require_greedy_match: bool = True  # greedy_match must be 1.0
    champion_margin: float = 0.02  # must beat the production draft's speedup by this much (same eval set)

    def __post_init__(self):
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ConfigError(f"promote.min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")
        if self.min_speedup <= 0:
            raise ConfigError(f"promote.min_speedup must be > 0, got {self.min_speedup}")


def decide(candidate: dict, gates: Gates, champion: dict | None = None, champion_label: str | None = None) -> dict:
    """The promotion decision for one candidate summary (eval metrics.json "summary" entry).

    Args:
        candidate: {"best_k", "speedup", "acceptance_rate", "greedy_match", ...} of the candidate. When it was
            taken from the serving A/B (draftsmith/promote.py), it also holds "serving": {"concurrency",
            "best_speedup", "best_speedup_k", "outputs_unequal": [cells named], ...}; "best_k" 0 there means
            speculation loses at that concurrency for every K ("off"), which fails in place of the speedup gate.
        champion: the same for the current production draft on the same eval set (measured beside the
            candidate, or recorded when it was promoted), on the same basis (batch 1, or the serving A/B at
            the same concurrency), or None.
        champion_label: how reasons name the champion, e.g. "production v3" (default: the production draft).
    Returns:
        {"promote": bool, "reasons": [...] (every failed gate, or why it passed), "gates": ...,
        "candidate": ..., "champion": ...}: what promotion.json records, accepted or not.
    """
    for key in ("best_k", "speedup", "acceptance_rate", "greedy_match"):
        if key not in candidate:
            raise ValueError(f"candidate metrics lack {key!r}: pass the 'summary' entry of an eval metrics.json")
    serving = candidate.get("serving")
    off = serving is not None and candidate["best_k"] == 0
    where = f"K={candidate['best_k']}" + (f", concurrency {serving['concurrency']}" if serving else "")
    failed = []
    if candidate["acceptance_rate"] < gates.min_acceptance_rate:
        failed.append(f"acceptance rate {candidate['acceptance_rate']:.3f} < min_acceptance_rate {gates.min_acceptance_rate}")
    if off:
        failed.append(off_reason(serving))
    elif candidate["speedup"] < gates.min_speedup:
        failed.append(f"speedup {candidate['speedup']:.3f} at {where} < min_speedup {gates.min_speedup}")
    if gates.require_greedy_match and candidate["greedy_match"] != 1.0:
        failed.append(f"greedy_match {candidate['greedy_match']} != 1.0: speculative greedy output differed from plain "
                      "decoding, which points to a broken pair or engine")
    if gates.require_greedy_match and serving and serving.get("outputs_unequal"):
        failed.append("vLLM's greedy outputs differ with speculation on vs off in "
                      + "; ".join(serving["outputs_unequal"])
                      + ": this points to a broken pair or engine (serving.json first_mismatch)")
    if champion is not None and not off and candidate["speedup"] < champion["speedup"] + gates.champion_margin:
        failed.append(f"speedup {candidate['speedup']:.3f} does not beat {champion_label or 'the production draft'}'s "
                      f"{champion['speedup']:.3f} by the margin {gates.champion_margin}")
    beats = f"; beats {champion_label or 'production'} ({champion['speedup']:.3f})" if champion is not None else ""
    at = f" in the serving A/B at {where}" if serving else ""
    passed = ["all gates passed" + at + beats]
    return {"promote": not failed, "reasons": failed or passed, "gates": asdict(gates),
            "candidate": candidate, "champion": champion}


def off_reason(serving: dict) -> str:
    """Why a draft is not served at the serving A/B's concurrency: no K makes speculation pay there."""
    conc, best, k = serving["concurrency"], serving.get("best_speedup"), serving.get("best_speedup_k")
    if best is None:
        return f"at concurrency {conc} the serving A/B measured no speedup for any K: serve without speculation"
    slower = "slower than" if best < 1.0 else "no faster than"
    return (f"at concurrency {conc} speculation is {slower} plain decoding for every K (best speedup {best:.2f} at "
            f"K={k}): serve without speculation")
