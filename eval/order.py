"""The order in which measurements taken side by side run (pure function).

A round of a side-by-side measurement runs several "sides" back to back — plain decoding and one speculative run
per draft x K, at batch 1 per prompt (eval/runner.py) or per concurrency level on vLLM (eval/serving.py) — and
each speculative side is compared with the plain side of its round. If the machine's speed drifts during a round,
a side that always runs before the plain one is measured in a different moment from one that always runs after
it. :func:`interleaved` rotates the order from round to round and reverses it every other round, so that over any
two rounds with the same rotation each side runs as often before every other side as after it (the offsets in
time cancel, whatever the number of sides), and no side always follows the same one.
"""

from __future__ import annotations


def interleaved(n: int, *, rotate: int, reverse: bool) -> list[int]:
    """The indices ``0 .. n-1`` of the sides in the order they run: rotated left by `rotate`, then reversed when
    `reverse`. ``interleaved(3, rotate=0, reverse=False) == [0, 1, 2]``, ``interleaved(3, rotate=0,
    reverse=True) == [2, 1, 0]``, ``interleaved(3, rotate=1, reverse=False) == [1, 2, 0]``; with two sides the
    two orders alternate. Raises ValueError for ``n < 1``."""
    if n < 1:
        raise ValueError(f"interleaved: need at least one side, got n={n}")
    order = [(i + rotate) % n for i in range(n)]
    return order[::-1] if reverse else order
