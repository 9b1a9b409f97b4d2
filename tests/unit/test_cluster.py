"""The cluster model: free-GPU indexes and NVLink-aware GPU picking."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord, choose_in_islands, nvlink_islands
from gpurm.rm.state.cluster import Cluster, Node, NodeState

NVLINK, SYSTEM = 1, 6


def make_node(node_id: str, gpus: int = 8, rack: str = "r1", islands: int = 1) -> Node:
    size = gpus // islands
    recs = {}
    for i in range(gpus):
        links = [(j, NVLINK if j // size == i // size else SYSTEM, 18 if j // size == i // size else 0)
                 for j in range(gpus) if j != i]
        recs[i] = GpuRecord(index=i, links=links)
    return Node(node_id=node_id, host="h", port=1, rack=rack, ib_domain=rack, gpus=recs)


def test_islands_from_links() -> None:
    node = make_node("n", 8, islands=2)
    assert nvlink_islands(node.gpus.values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_choose_prefers_the_tightest_island() -> None:
    islands = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert choose_in_islands([1, 2, 3, 4, 5, 6, 7], islands, 3) == [1, 2, 3]   # island 0 has exactly 3 free
    assert choose_in_islands([0, 1, 2, 3, 4, 5, 6, 7], islands, 4) == [0, 1, 2, 3]
    assert choose_in_islands([2, 3, 4, 5, 6, 7], islands, 5) == [2, 4, 5, 6, 7]  # spans: whole island 1 first
    assert choose_in_islands([0, 1], islands, 3) is None
    assert choose_in_islands([0, 1, 2, 5], islands, 2, preferred=[2, 5]) == [2, 5]


def test_index_tracks_free_gpus_best_fit_first() -> None:
    c = Cluster()
    for nid, rack in (("a", "r1"), ("b", "r1"), ("c", "r2")):
        c.upsert(make_node(nid, rack=rack))
    c.allocate("a", [0, 1, 2, 3, 4, 5], "x")      # a: 2 free
    c.allocate("b", [0, 1], "y")                  # b: 6 free
    assert [n.node_id for n in c.nodes_with_free(2)] == ["a", "b", "c"]
    assert [n.node_id for n in c.nodes_with_free(3)] == ["b", "c"]
    assert [n.node_id for n in c.nodes_with_free(3, rack="r1")] == ["b"]
    c.release("a", [0, 1, 2, 3, 4, 5], "x")
    assert c.free("a") == 8 and c.free_gpus == 8 + 6 + 8


def test_lost_node_offers_nothing_and_unhealthy_gpu_is_not_free() -> None:
    c = Cluster()
    c.upsert(make_node("a"))
    c.set_gpu_health("a", 3, False, "XID 79")
    assert c.free("a") == 7 and 3 not in c.nodes["a"].free_indices()
    c.set_state("a", NodeState.LOST)
    assert c.free("a") == 0 and list(c.nodes_with_free(1)) == []
    assert c.capacity == 0


def test_double_allocation_is_refused() -> None:
    c = Cluster()
    c.upsert(make_node("a"))
    c.allocate("a", [0], "x")
    try:
        c.allocate("a", [0], "y")
    except ValueError as exc:
        assert "already held by x" in str(exc)
    else:
        raise AssertionError("a GPU was granted twice")
