"""Confidence intervals for speedups and the verdicts taken on them: pure functions, no timing of their own.

A speedup is a ratio of summed times measured side by side: plain / speculative wall time over the
same prompts (the batch-1 eval), or plain / speculative request latency over the same requests (the
serving A/B). Its samples are *paired*: per unit (a prompt, or a request of the serving schedule) and
per repeat (a whole pass over the units), one ``(plain, spec)`` pair measured together. The
interval is a **paired cluster bootstrap**: resample the units with replacement, each keeping all its
repeats (the cluster: its plain and speculative times summed over the passes), and recompute
sum(plain) / sum(spec), ``n_boot`` times (seeded: the same samples give the same interval); with a
single unit its repeats are resampled instead. A unit's sum carries the machine's noise (it shrinks
as passes are added) and the units' spread the prompt-to-prompt one. Resampling the repeats inside
each resampled unit as well would count the noise twice (its intervals cover the true speedup more
often than 95%). The plain percentile interval is too narrow with few units, so its percentiles
are *expanded* for the sample size (Hesterberg 2015, "What teachers should know about the bootstrap",
section 3.4): the tail probability is Φ(−sqrt(n / (n − 1)) · t_{0.975, n−1}) instead of 0.025, n the
number of units (of repeats when there is one unit). ``python scripts/bench_intervals.py`` measures how
often the plain and the expanded intervals cover a true speedup.

Degenerate cases: a single pair (one unit, one repeat) has no spread to resample, so its interval is
``None`` ("unknown": a verdict on it is inconclusive); identical pairs give a zero-width interval.

A serving pass is a unit of its own (a slow spell slows every request of the pass together), so a serving
cell's interval resamples its passes and then the requests within them (:func:`nested_ratio_ci`); with a
single pass only the requests, and the pass-to-pass noise is left out.

A *verdict* compares an interval with a bar: ``above`` when the lower bound is at or above it,
``below`` when the upper bound is below it, else ``straddles`` (``unknown`` without an interval).
A candidate and its champion, measured on the same units, are compared by the interval of their *difference*,
resampling the units jointly (the pairing by prompt removes the prompts' common spread): :func:`difference_ci`.
The best K of a draft is chosen on the K's own intervals (:func:`choose_k`: the smallest K whose interval
overlaps the fastest K's), a rule that does not follow the noise.
"""

from __future__ import annotations

import math
import random
from typing import Optional, Sequence

Pair = tuple[float, float]  # (plain, spec) measured side by side
Units = list[list[Pair]]  # [unit][repeat] -> (plain, spec)
Interval = Optional[list[float]]  # [lo, hi], or None when it cannot be estimated

N_BOOT = 2000
ABOVE, BELOW, STRADDLES, UNKNOWN = "above", "below", "straddles", "unknown"


def units_from_passes(plain: Sequence[Sequence[Optional[float]]],
                      spec: Sequence[Sequence[Optional[float]]]) -> Units:
    """[pass][unit] arrays of plain and spec times (as metrics.json and serving.json store them) -> [unit][pass]
    pairs; a pair with a missing side (None: a failed request) is left out, and a unit with no pair left stays as
    an empty list, so that unit i is the same prompt (request) in every cell built from the same schedule."""
    if len(plain) != len(spec):
        raise ValueError(f"{len(plain)} plain passes but {len(spec)} speculative passes")
    width = max((len(p) for p in [*plain, *spec]), default=0)
    units: Units = [[] for _ in range(width)]
    for p_pass, s_pass in zip(plain, spec):
        for i in range(width):
            a = p_pass[i] if i < len(p_pass) else None
            b = s_pass[i] if i < len(s_pass) else None
            if a is not None and b is not None:
                units[i].append((float(a), float(b)))
    return units


def ratio(units: Units) -> float:
    """sum(plain) / sum(spec) over every pair (0.0 when no speculative time was measured)."""
    num = sum(p for unit in units for p, _ in unit)
    den = sum(s for unit in units for _, s in unit)
    return num / den if den > 0 else 0.0


def _pairs(units: Units) -> int:
    return sum(len(u) for u in units)


def _sums(units: Units) -> list[tuple[float, float]]:
    """Each unit's pairs summed over its repeats: the clusters the bootstrap resamples (empty units left out)."""
    return [(sum(p for p, _ in unit), sum(s for _, s in unit)) for unit in units if unit]


def _clusters(units: Units) -> list[tuple[float, float]]:
    """What is resampled: the units (their repeats summed), or with a single unit its repeats."""
    full = [u for u in units if u]
    return _sums(full) if len(full) > 1 else list(full[0])


def _resample(clusters: list[tuple[float, float]], rng: random.Random) -> tuple[float, float]:
    num = den = 0.0
    for _ in range(len(clusters)):
        p, s = clusters[rng.randrange(len(clusters))]
        num += p
        den += s
    return num, den


# Student's t 0.975 quantiles by degrees of freedom (larger df: interpolated in 1/df towards the normal's 1.96)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """Student's t 0.975 quantile for `df` >= 1 degrees of freedom (table, linear in 1/df between its rows)."""
    if df in _T975:
        return _T975[df]
    rows = sorted(_T975)
    if df > rows[-1]:
        lo, hi, t_lo, t_hi = rows[-1], math.inf, _T975[rows[-1]], 1.959964
    else:
        lo = max(r for r in rows if r < df)
        hi = min(r for r in rows if r > df)
        t_lo, t_hi = _T975[lo], _T975[hi]
    w = (1 / lo - 1 / df) / (1 / lo - (0 if hi == math.inf else 1 / hi))
    return t_lo + (t_hi - t_lo) * w


def narrowing(n: int, after: int, *, t: bool = False) -> float:
    """The factor by which a 95% interval over `n` independent units (prompts' passes, server lives) narrows at
    `after` units of the same spread: sqrt(n / after), times t975(after - 1) / t975(n - 1) for a t-interval
    (`t`, n >= 2); 1.0 when `after` <= `n`. What more passes could at best do to an interval: the policy's
    reach (eval/policy.py)."""
    if after <= n:
        return 1.0
    factor = math.sqrt(n / after)
    return factor * t975(after - 1) / t975(n - 1) if t and n >= 2 else factor


def expanded_tail(n: int) -> float:
    """The tail probability of the expanded percentile interval for `n` >= 2 units (0.025 as n grows)."""
    z = math.sqrt(n / (n - 1)) * t975(n - 1)
    return 0.5 * (1 + math.erf(-z / math.sqrt(2)))


def _percentiles(values: list[float], tail: float) -> list[float]:
    xs = sorted(values)

    def at(q: float) -> float:  # linear interpolation between order statistics (numpy's default)
        pos = (len(xs) - 1) * q
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return [at(tail), at(1.0 - tail)]


def _tail(units: Units) -> float:
    full = [u for u in units if u]
    n = len(full) if len(full) > 1 else len(full[0])
    return expanded_tail(n)


def ratio_ci(units: Units, *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """The 95% interval of :func:`ratio` by the paired cluster bootstrap, its percentiles expanded for the
    number of units (module docstring); None with fewer than two pairs."""
    if _pairs(units) < 2:
        return None
    rng, clusters = random.Random(seed), _clusters(units)
    draws = []
    for _ in range(n_boot):
        num, den = _resample(clusters, rng)
        draws.append(num / den if den > 0 else 0.0)
    return _percentiles(draws, _tail(units))


def difference_ci(a: Units, b: Units, *, n_boot: int = N_BOOT, seed: int = 0, scale_a: float = 1.0,
                  scale_b: float = 1.0) -> Interval:
    """The 95% interval of scale_a * ratio(a) - scale_b * ratio(b) for two cells measured on the same units (unit i
    of `a` and of `b` is the same prompt or request), the units both cells have resampled jointly, each cell's
    repeats of a unit kept together (with a single common unit: repeat i of both cells taken together). `scale_*`:
    a factor on each cell's ratio (a serving cell's throughput / latency ratio). None when fewer than two common
    units (or, for one unit, unequal repeats) leave nothing to resample."""
    common = [i for i in range(min(len(a), len(b))) if a[i] and b[i]]
    if len(common) > 1:
        ca, cb = _sums([a[i] for i in common]), _sums([b[i] for i in common])
    elif len(common) == 1 and len(a[common[0]]) == len(b[common[0]]) > 1:
        ca, cb = list(a[common[0]]), list(b[common[0]])
    else:
        return None
    rng = random.Random(seed)
    draws = []
    for _ in range(n_boot):
        num_a = den_a = num_b = den_b = 0.0
        for _ in range(len(ca)):
            i = rng.randrange(len(ca))
            num_a, den_a = num_a + ca[i][0], den_a + ca[i][1]
            num_b, den_b = num_b + cb[i][0], den_b + cb[i][1]
        draws.append(scale_a * (num_a / den_a if den_a > 0 else 0.0) - scale_b * (num_b / den_b if den_b > 0 else 0.0))
    return _percentiles(draws, expanded_tail(len(ca)))


def nested_ratio_ci(passes: list[list[Pair]], *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """The 95% interval of sum(plain) / sum(spec) over passes of paired requests, when a pass is a unit of its own
    (a serving pass: a slow spell of the machine slows every request of that pass together): resample the passes,
    then the requests within each chosen pass; the percentiles expanded for the number of requests. With one pass,
    the requests alone (the pass's own noise is then not measured). None with fewer than two pairs."""
    passes = [p for p in passes if p]
    if sum(len(p) for p in passes) < 2:
        return None
    if len(passes) == 1:
        return ratio_ci([[pair] for pair in passes[0]], n_boot=n_boot, seed=seed)
    rng = random.Random(seed)
    draws = []
    for _ in range(n_boot):
        num = den = 0.0
        for _ in range(len(passes)):
            chosen = passes[rng.randrange(len(passes))]
            for _ in range(len(chosen)):
                p, s = chosen[rng.randrange(len(chosen))]
                num, den = num + p, den + s
        draws.append(num / den if den > 0 else 0.0)
    return _percentiles(draws, expanded_tail(max(2, min(len(p) for p in passes))))


def lives_ci(lives: list[list[list[Pair]]]) -> Interval:
    """The 95% interval of a ratio measured on several server lives (each a start of the servers: its passes of
    paired requests), from the spread of the lives' own ratios: g x exp(+-t_{0.975, n-1} s / sqrt(n)), g the
    geometric mean of the lives' ratios and s the standard deviation of their logs (a random effect per start;
    each life weighs the same, whatever its number of passes). A server start changes a cell's figures
    by more than two passes inside one life show, and with a handful of lives a bootstrap over them would
    understate that spread. None with fewer than two lives."""
    ratios = _life_logs(lives)
    if len(ratios) < 2:
        return None
    n = len(ratios)
    mean = sum(ratios) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return [math.exp(mean - half), math.exp(mean + half)]


def lives_ratio_ci(a: list[list[list[Pair]]], b: list[list[list[Pair]]]) -> Interval:
    """The 95% interval of ratio(a) / ratio(b) for two cells each measured on its own server lives (as
    :func:`lives_ci`; a life of `a` and one of `b` are different server starts, so nothing pairs them): Welch's
    t-interval on the difference of the lives' mean log ratios, exp'd — g_a / g_b x exp(+-t_{0.975, df} x
    sqrt(s_a^2 / n_a + s_b^2 / n_b)), df by Welch-Satterthwaite (rounded down). None unless both cells have two
    lives or more."""
    la, lb = _life_logs(a), _life_logs(b)
    if len(la) < 2 or len(lb) < 2:
        return None
    mean_a, mean_b = sum(la) / len(la), sum(lb) / len(lb)
    va = sum((r - mean_a) ** 2 for r in la) / (len(la) - 1) / len(la)
    vb = sum((r - mean_b) ** 2 for r in lb) / (len(lb) - 1) / len(lb)
    centre = mean_a - mean_b
    if va + vb == 0:
        return [math.exp(centre), math.exp(centre)]
    df = (va + vb) ** 2 / (va ** 2 / (len(la) - 1) + vb ** 2 / (len(lb) - 1))
    half = t975(max(1, int(df))) * math.sqrt(va + vb)
    return [math.exp(centre - half), math.exp(centre + half)]


def _life_logs(lives: list[list[list[Pair]]]) -> list[float]:
    """log(sum(plain) / sum(spec)) of each life (its passes pooled); lives with nothing timed are left out."""
    out = []
    for life in lives:
        num = sum(p for one in life for p, _ in one)
        den = sum(s for one in life for _, s in one)
        if num > 0 and den > 0:
            out.append(math.log(num / den))
    return out


def verdict(ci: Interval, bar: float) -> str:
    """``above`` (lower bound >= bar), ``below`` (upper bound < bar), ``straddles``, or ``unknown`` (no interval)."""
    if ci is None:
        return UNKNOWN
    lo, hi = ci
    if lo >= bar:
        return ABOVE
    if hi < bar:
        return BELOW
    return STRADDLES


def format_ci(value: Optional[float], ci: Interval, unit: str = "x", digits: int = 2) -> str:
    """'1.10x [1.02, 1.18]' (the point estimate and its interval); 'n/a' without a value, no brackets without a ci."""
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}{unit}"
    return text if ci is None else f"{text} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def choose_k(cells: dict[int, Units], *, bars: Sequence[float] = (1.0,), seed: int = 0,
             speeds: Optional[dict] = None, intervals: Optional[dict] = None) -> dict:
    """The best K of one draft by a rule that does not follow the noise.

    `cells`: K -> the units of that K's cell (all measured on the same prompts). The *leader* is the K with
    the highest point speedup. Another K is *indistinguishable* from it when its own 95% interval overlaps the
    leader's — a K is passed over only when its whole interval lies below the fastest K's — **and** its interval
    gives a verdict at least as sure as the leader's against every bar in `bars` (above > straddles or unknown >
    below: a K that is merely too noisy to tell apart — "unsure" where the leader clearly pays — does not qualify,
    one that clearly pays where the leader is unsure does), and, when the leader pays (speedup > 1), its speedup is
    above 1 too. A K without an interval is not indistinguishable. The chosen K is the **smallest**
    indistinguishable K (it costs the least draft compute, and at higher load the least wasted verification).

    Why the intervals' overlap and not the interval of the paired difference: the difference tells two close K
    apart only some of the time, so the K chosen would follow the noise from one eval to the next (on vLLM each K
    also runs on server starts of its own, whose effect does not pair between K); the overlap's choice holds.
    `speeds` / `intervals` (K -> value): a serving cell's throughput speedup and its own interval, in place of what
    the units give.
    -> {"k", "leader", "indistinguishable": [K...] (sorted, the leader included), "rule"}.
    """
    if not cells:
        raise ValueError("choose_k needs at least one K")
    speed = dict(speeds) if speeds else {k: ratio(u) for k, u in cells.items()}
    own_ci = dict(intervals) if intervals is not None else {k: ratio_ci(u, seed=seed) for k, u in cells.items()}
    leader = max(speed, key=lambda k: (speed[k], -k))
    lead_ci = own_ci[leader]
    tied = [leader]
    for k in cells:
        if k == leader:
            continue
        own = own_ci[k]
        close = own is not None and lead_ci is not None and own[1] >= lead_ci[0] and own[0] <= lead_ci[1]
        sure = all(_SURENESS[verdict(own, bar)] >= _SURENESS[verdict(lead_ci, bar)] for bar in bars)
        if close and sure and (speed[k] > 1.0 or speed[leader] <= 1.0):
            tied.append(k)
    tied.sort()
    return {"k": tied[0], "leader": leader, "indistinguishable": tied,
            "rule": "the smallest K whose speedup is indistinguishable from the best K's (its 95% interval overlaps "
                    "the best K's, a verdict as sure against the bars)" if len(tied) > 1
            else "the K with the highest speedup"}


_SURENESS = {BELOW: 0, STRADDLES: 1, UNKNOWN: 1, ABOVE: 2}  # how sure a verdict is that the bar is cleared
