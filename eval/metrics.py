"""The eval metrics, aggregated from decode stats: pure functions, no timing of their own.

One record describes one (draft, K, temperature) cell measured on a set of prompts, with plain
(autoregressive) and speculative runs of the same prompts side by side. One name per quantity,
the same in metrics.json, report.md, the end-of-run table and the README (docs/ARCHITECTURE.md,
"Metrics"):

- ``acceptance_rate``: accepted / drafted draft tokens ("acceptance rate"; the promote gate's);
- ``token_acceptance`` α: accepted / tested draft tokens ("token acceptance"), the α of the
  speedup formula (1 - α^(K+1)) / ((1 - α)(K c + c_v)) in eval/theory.py;
- ``expected_acceptance``: mean sum_x min(p, q) over drafted positions (sampling cells);
- ``mean_accepted_tokens`` τ: new tokens per target verification forward.

Token acceptance and the per-position acceptance carry 95% intervals (``token_acceptance_ci95``,
``per_position_acceptance_ci95``): the cluster bootstrap of eval/intervals.py over the prompts, each keeping its
passes, of the (accepted, tested) counts. The tokens of one prompt are not independent draws: on SmolLM2 a dozen
prompts of 64 tokens read α to about ±0.10, 64 prompts to about ±0.035 (BENCHMARKS.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR, AcceptanceCounts
from draftsmith.decode.stats import DecodeStats, SpeculativeStats
from draftsmith.eval.intervals import Interval, Units, format_ci, ratio_ci, units_from_passes
from draftsmith.eval.theory import predicted_speedup


@dataclass
class CellRecord:
    """Metrics of one (draft, K, temperature) cell; the names are defined in the module docstring."""

    k: int
    temperature: float
    acceptance_rate: float  # accepted / drafted
    token_acceptance: float  # α = accepted / tested, the α of predicted_speedup
    expected_acceptance: float | None  # mean sum min(p, q) over drafted positions (sampling cells)
    mean_accepted_tokens: float  # τ
    per_position_acceptance: list[float]
    speedup: float  # plain / speculative wall time; 0.0 when no speculative time was measured
    speedup_ci95: Interval  # its 95% interval (paired bootstrap over prompts and repeats: eval/intervals.py)
    repeats: int  # passes over the prompts (speculative and plain side by side in each)
    predicted_speedup: float
    baseline: dict  # ttft_ms, tpot_ms, tokens_per_s of plain decoding
    speculative: dict  # the same for speculative decoding
    greedy_match: float | None  # share of prompts with identical outputs (greedy only)
    target_forwards: int
    draft_forwards: int
    in_loop: dict | None = None  # in_loop_costs(): c, c_v and the predicted speedup as the decode paid them
    token_acceptance_ci95: Interval = None  # α's 95% interval (bootstrap over prompts: acceptance_intervals)
    per_position_acceptance_ci95: list[Interval] | None = None  # per position i = 1..K, the same way


def in_loop_costs(alpha: float, k: int, baseline: list[DecodeStats], spec: list[SpeculativeStats]) -> dict | None:
    """The cost ratios as the decodes themselves paid them, and the speedup they predict.

    c = mean draft step / mean plain step and c_v = mean verification forward / mean plain step, the steps
    taken from the runs (the plain runs' time per output token; the speculative runs' rounds after the first:
    decode/loop.py), so that machine drift between a cost timing and the decodes does not enter. ``other`` is
    the share of those rounds' time outside the draft steps and the verification forward (verification,
    crops, bookkeeping); ``predicted_speedup`` the formula's value at these costs, which the measured
    decode-phase speedup should approach (the prefill, the same for both, is in the measured one too).
    None when no plain step or no timed round was measured.
    """
    steps = sum(b.new_tokens - 1 for b in baseline if b.new_tokens > 1)
    rounds = sum(s.timed_rounds for s in spec)
    forwards = sum(s.timed_draft_forwards for s in spec)
    if not steps or not rounds or not forwards:
        return None
    step = sum(b.total_s - b.ttft_s for b in baseline if b.new_tokens > 1) / steps
    if step <= 0:
        return None
    c = sum(s.draft_s for s in spec) / forwards / step
    c_v = sum(s.verify_s for s in spec) / rounds / step
    rounds_s = sum(s.rounds_s for s in spec)
    forwards_s = sum(s.draft_s + s.verify_s for s in spec)
    other = 1 - forwards_s / rounds_s if rounds_s > 0 else 0.0
    return {"c": c, "c_v": c_v, "other": other, "plain_step_ms": step * 1e3,
            "predicted_speedup": predicted_speedup(alpha, k, c, c_v)}


def _latency(stats: list[DecodeStats]) -> dict:
    """Median TTFT and TPOT in ms, and tokens/s over all runs (total tokens / total time)."""
    total_s = sum(s.total_s for s in stats)
    return {
        "ttft_ms": statistics.median(s.ttft_s for s in stats) * 1e3,
        "tpot_ms": statistics.median(s.tpot_s for s in stats if s.new_tokens > 1) * 1e3
        if any(s.new_tokens > 1 for s in stats) else 0.0,
        "tokens_per_s": sum(s.new_tokens for s in stats) / total_s if total_s > 0 else 0.0,
    }


def acceptance_summary(k: int, spec: list[SpeculativeStats]) -> dict:
    """Acceptance figures pooled over speculative runs of one K (counts summed, then divided: decode/acceptance.py).

    Undefined figures (nothing drafted) are 0.0; ``expected_acceptance`` is None unless every run sampled.
    Returns the figures of :meth:`AcceptanceCounts.figures` (per-position over K), target_forwards, draft_forwards.
    """
    if any(s.k != k for s in spec):
        raise ValueError(f"speculative runs with k={sorted({s.k for s in spec})} given for a cell with k={k}")
    no_runs = [SpeculativeStats(k=k, overlap_sum=0.0)]  # zero counts, whose figures are 0.0 (as they always were)
    figures = AcceptanceCounts.pooled(s.counts() for s in spec or no_runs).figures(undefined=0.0)
    return {
        **figures,  # acceptance_rate, token_acceptance, expected_acceptance, mean_accepted_tokens (no prefill token)
        "per_position_acceptance": (figures["per_position_acceptance"] + [0.0] * k)[:k],
        "target_forwards": sum(s.target_forwards for s in spec),
        "draft_forwards": sum(s.draft_forwards for s in spec),
    }


def acceptance_intervals(spec: list[SpeculativeStats], prompts: int) -> tuple[Interval, list[Interval]]:
    """95% intervals of token acceptance α and of the acceptance at each draft position (1..K) -> (α's, [per
    position]); an interval is None where it cannot be estimated (fewer than two prompts that tested a token there,
    or a count the producer does not keep).

    `spec`: the speculative runs of one cell, pass-major over `prompts` prompts (run j is prompt j % `prompts`).
    Each is a ratio of summed counts, accepted / tested and accepted_i / drafted_i, so the speedup's paired cluster
    bootstrap (eval/intervals.py :func:`ratio_ci`) applies as it is: prompts are the units, resampled with their
    passes (greedy passes repeat the same counts, so only the prompts' spread is left). A prompt that tested nothing
    at a position (prompt lookup finding no match, a round cut short) adds nothing to that ratio and is left out of
    its resampling, where it would only draw empty samples."""
    if prompts >= 1 and len(spec) % prompts:
        raise ValueError(f"{len(spec)} speculative runs are not whole passes over {prompts} prompts")
    counts = [s.counts() for s in spec]
    k = max((len(c.drafted_per_position) for c in counts), default=0)
    if prompts < 2:  # one prompt's tokens are no sample of the prompts (greedy passes repeat its counts)
        return None, [None] * k

    def interval(pair) -> Interval:
        pairs = [pair(c) for c in counts]
        if any(num is None or den is None for num, den in pairs):
            return None
        passes = [pairs[i:i + prompts] for i in range(0, len(pairs), prompts)]
        units = units_from_passes([[num for num, _ in p] for p in passes], [[den for _, den in p] for p in passes])
        units = [unit for unit in units if sum(den for _, den in unit) > 0]
        return ratio_ci(units) if len(units) >= 2 else None

    alpha = interval(lambda c: (c.accepted, None if c.rejected is None else c.accepted + c.rejected))
    positions = [interval(lambda c, i=i: (_position(c.accepted_per_position, i), _position(c.drafted_per_position, i)))
                 for i in range(k)]
    return alpha, positions


def _position(xs: list[float], i: int) -> float:
    return xs[i] if i < len(xs) else 0.0


def cell_record(k: int, temperature: float, baseline: list[DecodeStats], spec: list[SpeculativeStats],
                c: float, c_v: float, outputs_equal: list[bool] | None = None, units: Units | None = None,
                repeats: int = 1) -> CellRecord:
    """Aggregate the runs of one cell.

    Args:
        baseline / spec: stats of the plain and speculative runs over the same prompts (every repeat).
        c / c_v: measured cost ratios for the predicted speedup (decode/timing.py).
        outputs_equal: per prompt (and repeat), whether speculative output == plain output (greedy runs).
        units: the paired wall times [prompt][repeat] -> (plain_s, spec_s) the interval is taken over; None:
            baseline[i] and spec[i] are one pair each (same lengths), each its own prompt.
        repeats: the passes over the prompts these runs are.
    Speedup = total plain wall time / total speculative wall time over the same prompts; its interval: the
    paired bootstrap of eval/intervals.py.
    """
    if not baseline or not spec:
        raise ValueError("a cell needs at least one baseline and one speculative run")
    acc = acceptance_summary(k, spec)
    spec_s = sum(s.total_s for s in spec)
    if units is None:
        units = [[(b.total_s, s.total_s)] for b, s in zip(baseline, spec)] if len(baseline) == len(spec) else []
    alpha_ci, position_cis = acceptance_intervals(spec, len(units) or len(spec))
    return CellRecord(
        k=k, temperature=temperature, **acc,
        speedup=sum(s.total_s for s in baseline) / spec_s if spec_s > 0 else 0.0,
        speedup_ci95=ratio_ci(units) if spec_s > 0 else None, repeats=repeats,
        predicted_speedup=predicted_speedup(acc["token_acceptance"], k, c, c_v),
        baseline=_latency(baseline), speculative=_latency(spec),
        greedy_match=(sum(outputs_equal) / len(outputs_equal)) if outputs_equal else None,
        in_loop=in_loop_costs(acc["token_acceptance"], k, baseline, spec),
        token_acceptance_ci95=alpha_ci, per_position_acceptance_ci95=(position_cis + [None] * k)[:k],
    )


def slowdown_warning(record: CellRecord) -> str | None:
    """A warning when the draft would likely slow serving down, or None.

    A measured speedup decides: warn when it is below 1, and never when it is 1 or more, whatever
    the acceptance rate (a cheap draft can pay off at a low acceptance rate). Only when no speedup
    was measured (``speedup`` None or 0: no timed speculative run) does the rule of thumb apply:
    warn when the acceptance rate is below ``ACCEPTANCE_FLOOR`` (0.5, decode/acceptance.py).
    """
    where = f"K={record.k}, temperature {record.temperature}: "
    advice = "; consider turning speculation off or retraining it."
    if record.speedup:
        if record.speedup >= 1.0:
            return None
        measured = format_ci(record.speedup, record.speedup_ci95, unit="")
        sure = record.speedup_ci95 is not None and record.speedup_ci95[1] < 1.0
        return (where + f"measured speedup {measured} < 1 (acceptance rate {record.acceptance_rate:.2f}): this draft "
                + ("slowed decoding down here" if sure else "may have slowed decoding down here (its interval reaches 1)")
                + " and would likely slow serving down" + advice)
    if record.acceptance_rate < ACCEPTANCE_FLOOR:
        return (where + f"no speedup measured; acceptance rate {record.acceptance_rate:.2f} < {ACCEPTANCE_FLOOR}: "
                "this draft would likely make serving slower" + advice)
    return None
