"""The AM's cluster view: snapshots and versioned deltas, with gap detection."""

from __future__ import annotations

from gpurm.am.view import ViewFollower
from gpurm.proto import gpurm_pb2 as pb


def node(node_id: str, free: list[int]) -> pb.NodeView:
    return pb.NodeView(node_id=node_id, rack="r", gpus_total=8, free_gpus=free, state=pb.NODE_RUNNING, gpus_healthy=8)


def follower(version: int) -> ViewFollower:
    return ViewFollower("", client=None, initial=pb.ClusterView(version=version, nodes=[node("a", [0, 1]),  # type: ignore[arg-type]
                                                                                        node("b", [])]))


def test_a_delta_replaces_the_changed_nodes() -> None:
    f = follower(10)
    assert f.apply_delta(pb.ClusterView(version=12, base_version=10, delta=True, nodes=[node("b", [3])]))
    assert f.current.version == 12 and f.changed
    assert {n.node_id: list(n.free_gpus) for n in f.current.nodes} == {"a": [0, 1], "b": [3]}


def test_a_delta_based_on_an_older_version_still_applies() -> None:
    # Deltas carry whole node states, so one based before our version is a superset of what we lack.
    f = follower(10)
    assert f.apply_delta(pb.ClusterView(version=15, base_version=7, delta=True, nodes=[node("a", [])]))
    assert f.current.version == 15


def test_a_gap_is_detected() -> None:
    f = follower(10)
    assert not f.apply_delta(pb.ClusterView(version=20, base_version=14, delta=True, nodes=[node("a", [])]))
    assert f.current.version == 10 and not f.changed


def test_old_deltas_and_snapshots_are_ignored() -> None:
    f = follower(10)
    assert f.apply_delta(pb.ClusterView(version=9, base_version=8, delta=True, nodes=[node("a", [])]))
    f.apply_snapshot(pb.ClusterView(version=5, nodes=[]))
    assert f.current.version == 10 and len(f.current.nodes) == 2
    f.apply_snapshot(pb.ClusterView(version=11, nodes=[node("c", [1])]))
    assert [n.node_id for n in f.current.nodes] == ["c"]


def test_views_from_another_epoch_or_far_ahead_are_not_trusted() -> None:
    f = follower(10)
    f.current.epoch = 3
    before = f.current
    # a forged delta at 2^62 and a delta or snapshot from another RM run: refused, the AM resyncs over gRPC
    assert not f.apply_delta(pb.ClusterView(version=2**62, base_version=10, epoch=3, delta=True, nodes=[node("a", [])]))
    assert not f.apply_delta(pb.ClusterView(version=11, base_version=10, epoch=4, delta=True, nodes=[node("a", [])]))
    assert not f.apply_snapshot(pb.ClusterView(version=2, epoch=4, nodes=[]))
    assert not f.apply_snapshot(pb.ClusterView(version=2**62, epoch=3, nodes=[]))
    assert f.current is before and not f.changed
    # what the RM says over gRPC replaces the view, even at a lower version (a restarted RM counts afresh)
    f.replace(pb.ClusterView(version=2, epoch=4, nodes=[node("b", [1])]))
    assert (f.current.epoch, f.current.version, f.changed) == (4, 2, True)
    assert f.apply_delta(pb.ClusterView(version=3, base_version=2, epoch=4, delta=True, nodes=[node("a", [0])]))
    assert [n.node_id for n in f.current.nodes] == ["a", "b"] and f.current.epoch == 4
