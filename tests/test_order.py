"""eval/order.py: the order of side-by-side runs in a round (batch 1 per prompt, serving per level and pass)."""

import itertools

import pytest

from draftsmith.eval.order import interleaved


def test_rotated_then_reversed():
    assert interleaved(3, rotate=0, reverse=False) == [0, 1, 2]
    assert interleaved(3, rotate=0, reverse=True) == [2, 1, 0]
    assert interleaved(3, rotate=1, reverse=False) == [1, 2, 0]
    assert interleaved(3, rotate=4, reverse=True) == [0, 2, 1]  # rotate 4 = rotate 1, reversed
    assert interleaved(1, rotate=7, reverse=True) == [0]
    # two sides alternate, as the plain/spec pair always did
    assert [interleaved(2, rotate=0, reverse=r % 2 == 1) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_two_rounds_cancel_every_sides_offset_from_every_other(n):
    """A forward round and its reversal: each side runs before each other side as often as after it, so a linear
    drift of the machine's speed moves no comparison (a plain cyclic rotation over two rounds of three sides runs
    one K before the plain side both times)."""
    for rotate in range(n):
        rounds = [interleaved(n, rotate=rotate, reverse=rev) for rev in (False, True)]
        for a, b in itertools.combinations(range(n), 2):
            assert sum(r.index(a) - r.index(b) for r in rounds) == 0
        assert all(sorted(r) == list(range(n)) for r in rounds)


def test_no_side_always_follows_the_same_one():
    # over the rounds of four prompts (rotate and reverse as eval/runner.py takes them), side 0 (the plain run)
    # follows more than one other side
    preceding = set()
    for i in range(4):
        order = interleaved(3, rotate=i, reverse=i % 2 == 1)
        at = order.index(0)
        if at:
            preceding.add(order[at - 1])
    assert len(preceding) == 2


def test_no_sides_is_an_error():
    with pytest.raises(ValueError, match="at least one side"):
        interleaved(0, rotate=0, reverse=False)
