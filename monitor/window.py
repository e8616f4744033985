"""Watching a served draft: windowed speculative-decoding figures from vLLM's ``/metrics``, and the alert rules.

Pure arithmetic over time-stamped snapshots of vLLM's spec-decode counters; reading and summing them
is serve/metrics.py's (``spec_series``, ``series_delta``, ``sum_series``, :class:`SpecCounters`), so the
monitor and the serving A/B count the same way. monitor/poll.py polls a server and feeds :class:`Window`
(``draftsmith-monitor`` and scripts/drift_demo.py); monitor/alert_rules.py writes the same rules for
Prometheus (``draftsmith-registry export-alerts``).

The window. A :class:`Window` of ``W`` seconds keeps the snapshots of the last ``W`` seconds plus the
newest one taken before them (the base), so consecutive polls ``W`` apart still make a window. The
counters' increase over it is the sum of the increases between consecutive snapshots, per series:

1. a series whose value went down between two snapshots was reset (the server restarted): its
   increase over that step is its new value (Prometheus ``increase()`` semantics, ``series_delta``);
   a restart whose counter has climbed past its old value by the next poll cannot be seen (as in
   Prometheus), so poll more often than servers restart;
2. a series that appears (a new engine, a restarted server) counts from 0; one that disappears
   stops counting;
3. the increases are summed over engines (every label but ``position``) into :class:`SpecCounters`.

From the summed increase: ``acceptance_rate`` = accepted / drafted tokens (draftsmith's
``acceptance_rate``: drafted tokens after a rejection count as drafted), ``per_position_acceptance``
= accepted at position i / drafts, ``first_position_acceptance`` = its position 0, ``accepted_per_draft``
= accepted tokens per draft round, ``mean_accepted_tokens`` τ = 1 + that (new tokens per target step
while speculating, as in serving.json), ``drafts_per_s`` = draft rounds / the window's span.

The watched figure (``Rules.figure``, :data:`FIGURES`). With a static K it is ``acceptance_rate``,
compared with the rate the promotion measured at that K. Under a batch-size K schedule (serve/schedule.py)
vLLM drafts a different K at different loads, and accepted / drafted falls as K grows (later positions
are accepted less often), so the window's rate mixes K's in proportions set by the load and cannot be
held against a figure measured at one K. Then the monitor watches ``first_position_acceptance``: every
draft proposes a first token whatever its K, and whether the target accepts it depends on the traffic
and the draft only, so the promotion-time figure at any K (the serving cell's per_position_acceptance[0])
applies; its trials are the drafts (one first token each). Under a schedule ``full_positions`` (the
schedule's smallest K above 0) also bounds ``per_position_acceptance``: positions from it on are None,
since /metrics does not say how many drafts reached them (dividing by all drafts would understate them).

The rules (:func:`check_rules`) on the watched figure, on a window with at least ``min_draft_tokens`` of
its trials (drafted tokens; for the first-position figure, drafts):

- **drift**: the figure below the promotion-time one (``reference``) by more than ``margin``;
  traffic has moved away from what the draft was trained on;
- **floor**: the figure below ``min_acceptance`` (default ``ACCEPTANCE_FLOOR``, 0.5,
  decode/acceptance.py): the rule of thumb below which speculation usually costs more than it saves.
  On the first-position figure the floor is a conservative one: the acceptance rate at any K is at most
  the first-position acceptance, so a first-position figure below the floor means a rate below it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from draftsmith.artifacts.errors import ConfigError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
from draftsmith.serve.metrics import SPEC_COUNTERS, SpecCounters, series_delta, spec_series, sum_series

DEFAULT_MARGIN = 0.05
DEFAULT_MIN_DRAFT_TOKENS = 100  # smaller windows are too noisy to alert on
ACCEPTANCE_RATE, FIRST_POSITION = "acceptance_rate", "first_position_acceptance"
FIGURES = {  # a figure the rules may watch -> how messages name it
    ACCEPTANCE_RATE: "acceptance",
    FIRST_POSITION: "first-position acceptance",
}


@dataclass(frozen=True)
class Snapshot:
    """The spec-decode counter series of one ``/metrics`` text at time `t`."""

    t: float  # seconds on any monotonic clock (the window only takes differences)
    series: dict[tuple, float]  # spec_series(): (name, sorted labels) -> value


def snapshot(text: str, t: float) -> Snapshot:
    """Parse one ``/metrics`` text (prometheus_client's parser, via ``spec_series``) taken at `t`."""
    return Snapshot(t=float(t), series=spec_series(text))


def window_increase(snapshots: list[Snapshot]) -> tuple[dict[tuple, float], int]:
    """(per-series increase summed over consecutive snapshots, number of resets seen) — steps 1 and 2 above."""
    total: dict[tuple, float] = {}
    resets = 0
    for before, after in zip(snapshots, snapshots[1:]):
        resets += sum(1 for key, value in after.series.items() if value < before.series.get(key, 0.0))
        for key, inc in series_delta(before.series, after.series).items():
            total[key] = total.get(key, 0.0) + inc
    return total, resets


@dataclass
class WindowStats:
    """The spec-decode figures over one window (see the module docstring)."""

    span_s: float  # first to last snapshot of the window
    snapshots: int
    counters: SpecCounters = field(default_factory=SpecCounters)  # increases, summed over engines
    engines: int = 0  # label sets (but position) of the drafts counter in the newest snapshot
    resets: int = 0  # series seen going down inside the window
    full_positions: Optional[int] = None  # positions every draft reaches (a schedule's smallest K); None: all

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.counters.acceptance_rate()

    @property
    def per_position_acceptance(self) -> list[Optional[float]]:
        return self.counters.per_position_acceptance(self.full_positions)

    @property
    def first_position_acceptance(self) -> Optional[float]:
        return self.counters.first_position_acceptance()

    def figure(self, name: str) -> Optional[float]:
        """The value of the figure `name` (a key of :data:`FIGURES`) over the window."""
        return getattr(self, name)

    def trials(self, name: str) -> float:
        """What the figure `name` is a share of: drafted tokens (acceptance_rate), or drafts (first position)."""
        return self.counters.drafts if name == FIRST_POSITION else self.counters.draft_tokens

    @property
    def mean_accepted_tokens(self) -> Optional[float]:
        return self.counters.mean_accepted_tokens()

    @property
    def accepted_per_draft(self) -> Optional[float]:
        return self.counters.accepted_tokens / self.counters.drafts if self.counters.drafts else None

    @property
    def drafts_per_s(self) -> Optional[float]:
        return self.counters.drafts / self.span_s if self.span_s > 0 else None

    def as_dict(self) -> dict:
        """The figures as plain JSON values (one JSONL record's worth)."""
        c = self.counters
        return {"acceptance_rate": self.acceptance_rate, "per_position_acceptance": self.per_position_acceptance,
                "first_position_acceptance": self.first_position_acceptance,
                "mean_accepted_tokens": self.mean_accepted_tokens, "accepted_per_draft": self.accepted_per_draft,
                "drafts_per_s": self.drafts_per_s, "drafts": c.drafts, "draft_tokens": c.draft_tokens,
                "accepted_tokens": c.accepted_tokens, "span_s": self.span_s, "snapshots": self.snapshots,
                "engines": self.engines, "resets": self.resets}


def window_stats(snapshots: list[Snapshot], full_positions: Optional[int] = None) -> WindowStats:
    """The figures over `snapshots` (time order), summed over engines, resets handled; `full_positions`: see
    :class:`WindowStats` (None: a static K)."""
    if not snapshots:
        return WindowStats(span_s=0.0, snapshots=0, full_positions=full_positions)
    increase, resets = window_increase(snapshots)
    drafts = SPEC_COUNTERS["drafts"]
    engines = {tuple(kv for kv in labels if kv[0] != "position")
               for (name, labels) in snapshots[-1].series if name == drafts}
    return WindowStats(span_s=snapshots[-1].t - snapshots[0].t, snapshots=len(snapshots),
                       counters=sum_series(increase), engines=len(engines), resets=resets,
                       full_positions=full_positions)


class Window:
    """A sliding window of `seconds`: :meth:`add` a snapshot, get the figures over the window. `full_positions`:
    the positions every draft reaches under a batch-size K schedule (its smallest K above 0; None: a static K)."""

    def __init__(self, seconds: float, full_positions: Optional[int] = None):
        if not seconds > 0:
            raise ConfigError(f"--window must be > 0 seconds, got {seconds}")
        self.seconds = float(seconds)
        self.full_positions = full_positions
        self.snapshots: list[Snapshot] = []

    def add(self, snap: Snapshot) -> WindowStats:
        """Add `snap` (not older than the newest one), drop what fell out of the window, return its figures."""
        if self.snapshots and snap.t < self.snapshots[-1].t:
            raise ValueError(f"snapshot at t={snap.t} is older than the window's newest ({self.snapshots[-1].t})")
        self.snapshots.append(snap)
        cutoff = snap.t - self.seconds
        before = [i for i, s in enumerate(self.snapshots) if s.t <= cutoff]
        if before:  # keep the newest snapshot at or before the cutoff as the window's base
            del self.snapshots[:before[-1]]
        return window_stats(self.snapshots, self.full_positions)


# -- alert rules ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rules:
    """Alert thresholds on the watched `figure`: drift below `reference` - `margin` (when a reference is known),
    and the floor."""

    reference: Optional[float] = None  # the promoted version's measured value of `figure`
    margin: float = DEFAULT_MARGIN
    min_acceptance: float = ACCEPTANCE_FLOOR
    min_draft_tokens: int = DEFAULT_MIN_DRAFT_TOKENS
    reference_label: str = "the promotion-time acceptance"  # how messages name the reference
    figure: str = ACCEPTANCE_RATE  # the window figure the rules watch (FIGURES; module docstring)

    def __post_init__(self):
        if self.figure not in FIGURES:
            raise ConfigError(f"the watched figure must be one of {sorted(FIGURES)}, got {self.figure!r}")
        for flag, value in (("--margin", self.margin), ("--min-acceptance", self.min_acceptance)):
            if not (0.0 <= value <= 1.0) or math.isnan(value):
                raise ConfigError(f"{flag} must be in [0, 1], got {value}")
        if self.reference is not None and not 0.0 <= self.reference <= 1.0:
            raise ConfigError(f"the reference acceptance must be in [0, 1], got {self.reference} "
                              f"({self.reference_label})")
        if self.min_draft_tokens < 0:
            raise ConfigError(f"--min-draft-tokens must be >= 0, got {self.min_draft_tokens}")

    @property
    def drift_threshold(self) -> Optional[float]:
        """reference - margin, or None without a reference."""
        return None if self.reference is None else self.reference - self.margin

    @property
    def figure_label(self) -> str:
        """How messages name the watched figure ("acceptance", "first-position acceptance")."""
        return FIGURES[self.figure]


@dataclass(frozen=True)
class Alert:
    """One rule the window broke: `rule` is "drift" or "floor"."""

    rule: str
    value: float  # the window's watched figure (Rules.figure: the acceptance rate unless a K schedule is served)
    threshold: float
    message: str

    def as_dict(self) -> dict:
        return {"rule": self.rule, "value": self.value, "threshold": self.threshold, "message": self.message}


def status(stats: WindowStats, rules: Rules) -> str:
    """What the window allows: "warming up" (one snapshot), "idle" (nothing drafted), "low sample" (fewer than
    rules.min_draft_tokens trials of the watched figure), else "ok" or "alert" per :func:`check_rules`."""
    if stats.snapshots < 2:
        return "warming up"
    if not stats.counters.draft_tokens:
        return "idle"
    if stats.trials(rules.figure) < rules.min_draft_tokens:
        return "low sample"
    return "alert" if check_rules(stats, rules) else "ok"


def check_rules(stats: WindowStats, rules: Rules) -> list[Alert]:
    """The drift and floor alerts of a window on the watched figure (none on a window with fewer than
    min_draft_tokens of its trials: drafted tokens, or drafts for the first-position figure)."""
    value = stats.figure(rules.figure)
    if value is None or stats.trials(rules.figure) < max(rules.min_draft_tokens, 1):
        return []
    alerts, what = [], rules.figure_label
    drift = rules.drift_threshold
    if drift is not None and value < drift:
        alerts.append(Alert("drift", value, drift, (
            f"window {what} {value:.3f} < {drift:.3f} = {rules.reference_label} {rules.reference:.3f} - margin "
            f"{rules.margin:g}: live traffic has drifted from what the draft was trained on")))
    if value < rules.min_acceptance:
        alerts.append(Alert("floor", value, rules.min_acceptance, (
            f"window {what} {value:.3f} < --min-acceptance {rules.min_acceptance:g}: below it speculation usually "
            "costs more than it saves")))
    return alerts


def recommendation(rules: set[str] | list[str], retrain_command: Optional[str] = None) -> list[str]:
    """What to do when the rules named in `rules` ("drift", "floor") fire, as lines: disable speculation (floor),
    and retrain on recent traffic with `retrain_command` (the exact draftsmith command when the production
    draft is known)."""
    if not rules:
        return []
    retrain = ("retrain on recent traffic: save recent prompts as JSONL ({\"prompt\": ...} per line) and run "
               + (f"`{retrain_command}`" if retrain_command else
                  "`draftsmith data.prompts=recent.jsonl pair.draft=<production draft> pair.target=<target>`")
               + "; the champion gate promotes the retrained draft only if it beats production")
    if "floor" in rules:
        return ["disable speculation now: restart vLLM without --speculative-config (plain decoding is likely "
                "faster at this acceptance)", "then " + retrain]
    return [retrain + " (acceptance is still above the floor: speculation may still pay, check the speedup)"]
