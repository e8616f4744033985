"""Promotion gates: may this draft replace the registry's current production draft? A pure function."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from decode.errors import ConfigError


@dataclass
class Gates:
    """Thresholds a candidate must clear (the promote stage's config)."""

    min_acceptance_rate: float = 0.5  # at the best K
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
        candidate: {"best_k", "speedup", "acceptance_rate", "greedy_match", ...} of the candidate.
        champion: the same for the current production draft on the same eval set (measured beside the
            candidate, or recorded when it was promoted), or None.
        champion_label: how reasons name the champion, e.g. "production v3" (default: the production draft).
    Returns:
        {"promote": bool, "reasons": [...] (every failed gate, or why it passed), "gates": ...,
        "candidate": ..., "champion": ...}: what promotion.json records, accepted or not.
    """
    for key in ("best_k", "speedup", "acceptance_rate", "greedy_match"):
        if key not in candidate:
            raise ValueError(f"candidate metrics lack {key!r}: pass the 'summary' entry of an eval metrics.json")
    failed = []
    if candidate["acceptance_rate"] < gates.min_acceptance_rate:
        failed.append(f"acceptance rate {candidate['acceptance_rate']:.3f} < min_acceptance_rate {gates.min_acceptance_rate}")
    if candidate["speedup"] < gates.min_speedup:
        failed.append(f"speedup {candidate['speedup']:.3f} at K={candidate['best_k']} < min_speedup {gates.min_speedup}")
    if gates.require_greedy_match and candidate["greedy_match"] != 1.0:
        failed.append(f"greedy_match {candidate['greedy_match']} != 1.0: speculative greedy output differed from plain "
                      "decoding, which points to a broken pair or engine")
    if champion is not None and candidate["speedup"] < champion["speedup"] + gates.champion_margin:
        failed.append(f"speedup {candidate['speedup']:.3f} does not beat {champion_label or 'the production draft'}'s "
                      f"{champion['speedup']:.3f} by the margin {gates.champion_margin}")
    beats = f"; beats {champion_label or 'production'} ({champion['speedup']:.3f})" if champion is not None else ""
    passed = ["all gates passed" + beats]
    return {"promote": not failed, "reasons": failed or passed, "gates": asdict(gates),
            "candidate": candidate, "champion": champion}
