"""vLLM's batch-size K schedule from the K the serving A/B measured per concurrency band (pure functions).

The serving A/B measures the best K at a few concurrency levels; the promote stage merges them into
bands, version.json's ``"k_by_concurrency"``: ``[{"from": 1, "to": 4, "k": 4}, {"from": 8, "to": 8,
"k": 2}, {"from": 16, "k": 0}]`` (``from``/``to`` are measured levels, the last band has no ``to``,
K 0 = speculation off). vLLM 0.32 takes the same knowledge as ``"num_speculative_tokens_per_batch_size":
[[start, end, K], ...]`` in ``--speculative-config`` (vllm/v1/spec_decode/dynamic/utils.py): inclusive
batch-size ranges, sorted, non-overlapping, the first starting at 1; every K capped by
``num_speculative_tokens``; a gap or the sizes past the last range take the K of the range before.

:func:`batch_size_schedule` turns the bands into such a schedule, :func:`schedule_k` is the
``num_speculative_tokens`` to serve it with, :func:`check_schedule` applies vLLM's rules (plus ours:
integers, and at least one K above 0), :func:`describe_schedule` writes it as one line. Standard library only.
"""

from __future__ import annotations

import math

Schedule = list[list[int]]  # [[start, end, K], ...], batch sizes inclusive


def batch_size_schedule(bands: list[dict]) -> Schedule:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from version.json's ``k_by_concurrency`` bands.

    The rule:

    - between two measured levels ``a < b`` whose K differ (``a`` the last level of one band, ``b`` the
      first of the next), the K switches at their geometric mean: the band of ``a`` extends to
      ``floor(sqrt(a * b))`` and the next band starts one above (levels 1 and 8 switch after 2; 4 and 8
      after 5; 8 and 16 after 11). Batch sizes between two measurements are closer, in ratio, to the one
      the rule gives them to, which is how load scales;
    - the first band starts at batch size 1, even when the lowest measured level is higher;
    - the last band ends at its last measured level (its ``to``, else its ``from``) or where the
      geometric rule began it, whichever is higher; vLLM carries its K forward to every larger batch;
    - adjacent bands with equal K are merged first (the schedule then has one range per K change).

    ``[{"from": 1, "to": 4, "k": 4}, {"from": 8, "to": 8, "k": 2}, {"from": 16, "k": 0}]`` gives
    ``[[1, 5, 4], [6, 11, 2], [12, 16, 0]]``. The result is contiguous from 1, so it is valid for
    vLLM whatever ``--max-num-seqs`` is (:func:`check_schedule`); an all-off table gives an all-off
    schedule (which nothing can serve: :func:`check_schedule` refuses it).

    Raises ValueError, naming the band, for an empty or non-list table, a band without an integer
    ``from`` >= 1 or ``k`` >= 0, a ``to`` below its ``from``, a band other than the last without ``to``,
    or bands not in increasing order of concurrency.
    """
    merged = _merge_equal(_checked_bands(bands))
    schedule: Schedule = []
    start = 1
    for band, following in zip(merged, merged[1:] + [None]):
        last_level = band["to"]
        if following is None:
            end = max(start, last_level)
        else:
            end = math.isqrt(last_level * following["from"])  # floor(sqrt(a*b)), exact in integers
        schedule.append([start, end, band["k"]])
        start = end + 1
    return schedule


def _checked_bands(bands) -> list[dict]:
    """The bands as {"from", "to", "k"} ints (the last band's missing "to" = its "from"); ValueError naming the band."""
    if not isinstance(bands, list) or not bands:
        raise ValueError(f"k_by_concurrency must be a non-empty list of {{'from', 'to', 'k'}} bands, got {bands!r}")
    out, previous = [], None
    for i, band in enumerate(bands):
        where = f"k_by_concurrency band {i + 1} ({band!r})"
        if not isinstance(band, dict):
            raise ValueError(f"{where} is not a mapping with 'from', 'to' and 'k'")
        start, k = band.get("from"), band.get("k")
        if not _is_int(start) or start < 1:
            raise ValueError(f"{where}: 'from' must be a concurrency level >= 1")
        if not _is_int(k) or k < 0:
            raise ValueError(f"{where}: 'k' must be an integer >= 0 (0 = speculation off)")
        end = band.get("to")
        if end is None:
            if i != len(bands) - 1:
                raise ValueError(f"{where}: only the last band may omit 'to' (it is open-ended)")
            end = start
        elif not _is_int(end) or end < start:
            raise ValueError(f"{where}: 'to' must be an integer >= its 'from' {start}")
        if previous is not None and start <= previous:
            raise ValueError(f"{where}: bands must be sorted by concurrency without overlap: 'from' {start} is not "
                             f"above the previous band's last level {previous}")
        out.append({"from": start, "to": end, "k": k})
        previous = end
    return out


def _merge_equal(bands: list[dict]) -> list[dict]:
    """Adjacent bands with equal K as one band (from the first's "from" to the last's "to")."""
    merged: list[dict] = []
    for band in bands:
        if merged and merged[-1]["k"] == band["k"]:
            merged[-1]["to"] = band["to"]
        else:
            merged.append(dict(band))
    return merged


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_schedule(schedule) -> Schedule:
    """`schedule` as a list of [start, end, K] int lists when vLLM 0.32 accepts it and it speculates somewhere.

    vLLM's rules (validate_and_normalize_dynamic_sd_schedule): a non-empty list of 3-item entries, positive
    ranges with start <= end, K >= 0, sorted and non-overlapping, the first starting at 1 (gaps are allowed:
    vLLM carries the previous K across them). Ours on top: integers only (vLLM would truncate 2.5 to 2), the
    entries already in order (vLLM sorts them silently), and at least one K above 0 (an all-off schedule has
    nothing to speculate with: serve the target without a draft). ValueError naming the entry otherwise.
    """
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError(f"num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, K], "
                         f"got {schedule!r}")
    out: Schedule = []
    previous_end = 0
    for i, entry in enumerate(schedule):
        where = f"num_speculative_tokens_per_batch_size entry {i + 1} ({entry!r})"
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(_is_int(x) for x in entry):
            raise ValueError(f"{where} must be three integers [start, end, K]")
        start, end, k = entry
        if start < 1 or end < start:
            raise ValueError(f"{where}: the batch-size range must have 1 <= start <= end")
        if k < 0:
            raise ValueError(f"{where}: K must be >= 0 (0 = speculation off)")
        if start <= previous_end:
            raise ValueError(f"{where}: ranges must be sorted and non-overlapping (start {start} is not above the "
                             f"previous end {previous_end})")
        if i == 0 and start != 1:
            raise ValueError(f"{where}: the first range must start at batch size 1 (vLLM needs a K for every size)")
        out.append([start, end, k])
        previous_end = end
    if schedule_k(out) == 0:
        raise ValueError(f"num_speculative_tokens_per_batch_size {out} has K 0 (off) at every batch size: nothing to "
                         "speculate with; serve the target without a draft (no --speculative-config)")
    return out


def schedule_k(schedule: Schedule) -> int:
    """The largest K of `schedule`: vLLM's ``num_speculative_tokens`` for it (every band's K is capped by it)."""
    return max((int(entry[2]) for entry in schedule), default=0)


def speculated_ks(schedule: Schedule) -> list[int]:
    """The distinct K above 0 of `schedule`, ascending: the draft lengths vLLM proposes under it."""
    return sorted({int(entry[2]) for entry in schedule if int(entry[2]) > 0})


def describe_schedule(schedule: Schedule) -> str:
    """One line, e.g. ``batch 1-2: K=4; 3-11: K=2; >=12: off`` (the last range open-ended, as vLLM serves it);
    one range: ``K=2 at every batch size``."""
    if len(schedule) == 1:
        k = schedule[0][2]
        return f"{'off' if k == 0 else f'K={k}'} at every batch size"
    parts = []
    for i, (start, end, k) in enumerate(schedule):
        span = f">={start}" if i == len(schedule) - 1 else (str(start) if start == end else f"{start}-{end}")
        parts.append(f"{span}: {'off' if k == 0 else f'K={k}'}")
    return "batch " + "; ".join(parts)
