"""Fair shares: hand-computed cases and properties (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpurm.queues.fairshare import ShareNode, compute_real_shares, compute_shares


def q(path: str, weight: float = 1.0, min_gpus: int = 0, max_gpus: int | None = None,
      children: list[ShareNode] | None = None, demand: int = 1) -> ShareNode:
    return ShareNode(path, weight, min_gpus, max_gpus, children or [], demand)


def steady(capacity: int, *children: ShareNode) -> dict[str, int]:
    shares = compute_shares(q("root", children=list(children)), capacity)
    return {k: v for k, v in shares.steady.items() if k != "root"}


def test_equal_weights() -> None:
    assert steady(10, q("root.a"), q("root.b")) == {"root.a": 5, "root.b": 5}


def test_three_to_one() -> None:
    assert steady(12, q("root.a", 3), q("root.b", 1)) == {"root.a": 9, "root.b": 3}


def test_binding_min_share() -> None:
    # max(R, 8) + R = 10 -> R = 2
    assert steady(10, q("root.a", min_gpus=8), q("root.b")) == {"root.a": 8, "root.b": 2}


def test_binding_max_cap() -> None:
    assert steady(10, q("root.a", max_gpus=2), q("root.b")) == {"root.a": 2, "root.b": 8}


def test_everybody_capped_leaves_gpus_unassigned() -> None:
    assert steady(10, q("root.a", max_gpus=2), q("root.b", max_gpus=3)) == {"root.a": 2, "root.b": 3}


def test_weight_zero_gets_only_what_is_left() -> None:
    assert steady(10, q("root.a"), q("root.z", 0)) == {"root.a": 10, "root.z": 0}
    assert steady(10, q("root.a", max_gpus=6), q("root.z", 0)) == {"root.a": 6, "root.z": 4}
    assert steady(10, q("root.a"), q("root.z", 0, min_gpus=3)) == {"root.a": 7, "root.z": 3}


def test_minimums_above_capacity_are_scaled() -> None:
    assert steady(8, q("root.a", min_gpus=8), q("root.b", min_gpus=8)) == {"root.a": 4, "root.b": 4}


def test_nested_queues_split_their_parents_share() -> None:
    research = q("root.research", 3, children=[q("root.research.nlp"), q("root.research.vision")])
    shares = steady(16, research, q("root.prod", 1))
    assert shares == {"root.research": 12, "root.research.nlp": 6, "root.research.vision": 6, "root.prod": 4}


def test_instantaneous_share_ignores_idle_queues() -> None:
    root = q("root", children=[q("root.a"), q("root.b"), q("root.c", demand=0)])
    s = compute_shares(root, 12)
    assert [s.steady[p] for p in ("root.a", "root.b", "root.c")] == [4, 4, 4]
    assert [s.instantaneous[p] for p in ("root.a", "root.b", "root.c")] == [6, 6, 0]


def test_idle_subtree_gives_its_share_away() -> None:
    research = q("root.research", 3, children=[q("root.research.nlp", demand=0)])
    s = compute_shares(q("root", children=[research, q("root.prod")]), 16)
    assert s.instantaneous["root.prod"] == 16 and s.instantaneous["root.research.nlp"] == 0


def test_integer_rounding_sums_to_capacity() -> None:
    shares = steady(10, q("root.a"), q("root.b"), q("root.c"))
    assert shares == {"root.a": 4, "root.b": 3, "root.c": 3}


# ---------------------------------------------------------------- properties

sibling = st.builds(
    lambda w, mn, mx: (w, mn, mx),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 7.5]),
    st.integers(0, 40),
    st.one_of(st.none(), st.integers(0, 120)),
)


def build(specs: list[tuple[float, int, int | None]]) -> list[ShareNode]:
    out = []
    for i, (w, mn, mx) in enumerate(specs):
        out.append(q(f"root.q{i:02d}", w, mn if mx is None else min(mn, mx), mx))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(sibling, min_size=1, max_size=8), st.integers(1, 500))
def test_properties_of_sibling_shares(specs: list[tuple[float, int, int | None]], capacity: int) -> None:
    nodes = build(specs)
    shares = steady(capacity, *nodes)
    ints = [shares[n.path] for n in nodes]
    total_max = sum(n.max_gpus if n.max_gpus is not None else 10**9 for n in nodes)
    if total_max >= capacity and (any(n.weight > 0 for n in nodes) or
                                  sum(n.min_gpus for n in nodes) >= capacity or
                                  any(n.max_gpus is None for n in nodes)):
        assert sum(ints) == capacity
    for n, s in zip(nodes, ints, strict=True):
        assert s >= 0
        if n.max_gpus is not None:
            assert s <= n.max_gpus
    if sum(n.min_gpus for n in nodes) <= capacity:
        for n, s in zip(nodes, ints, strict=True):
            assert s >= n.min_gpus


@settings(max_examples=300, deadline=None)
@given(st.lists(sibling, min_size=2, max_size=6), st.integers(1, 300), st.integers(0, 5),
       st.sampled_from([0.5, 1.0, 4.0]))
def test_more_weight_never_gives_less_share(specs: list[tuple[float, int, int | None]], capacity: int,
                                            which: int, extra: float) -> None:
    nodes = build(specs)
    i = which % len(nodes)
    before = compute_real_shares(float(capacity), nodes)[i]
    nodes[i].weight += extra
    after = compute_real_shares(float(capacity), nodes)[i]
    assert after >= before - 1e-6
    # The integer share moves with the real one, within rounding.
    assert abs(steady(capacity, *nodes)[nodes[i].path] - after) < 1.0 + 1e-6


@pytest.mark.parametrize("capacity", [0, 1])
def test_tiny_capacities(capacity: int) -> None:
    assert sum(steady(capacity, q("root.a"), q("root.b")).values()) == capacity
