"""SortedKeys: the ordered index the RM's cluster, AM launcher and scheduler and the simulator's idle AMs use."""

from __future__ import annotations

import random

from gpurm.rm.state.sortedkeys import SortedKeys


def test_keeps_unique_keys_in_order_through_adds_and_discards() -> None:
    rng = random.Random(7)
    index: SortedKeys[tuple[int, str]] = SortedKeys()
    model: set[tuple[int, str]] = set()
    for _ in range(2000):
        key = (rng.randrange(50), rng.choice("abc"))
        if key in model and rng.random() < 0.5:
            index.discard(key)
            model.discard(key)
        elif key not in model:
            index.add(key)
            model.add(key)
        assert list(index) == sorted(model)
    assert len(index) == len(model) and bool(index) == bool(model)


def test_queries() -> None:
    index: SortedKeys[tuple[int, str]] = SortedKeys()
    assert not index
    for key in [(4, "n2"), (0, "n1"), (8, "n3"), (4, "n0")]:
        index.add(key)
    index.discard((5, "nope"))                  # absent: nothing happens
    assert index.first() == (0, "n1") and index.head(2) == [(0, "n1"), (4, "n0")]
    assert list(index.from_key((4, ""))) == [(4, "n0"), (4, "n2"), (8, "n3")]   # best fit for 4 GPUs
    assert list(index.from_key((9, ""))) == []
    assert (4, "n2") in index and (4, "n9") not in index
    assert index.pop_first() == (0, "n1") and len(index) == 3
