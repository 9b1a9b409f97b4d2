"""The view cache (rm/server/viewcache.py): the full view cut from once-encoded node entries parses to exactly the view
built afresh, after changes re-encodes only what changed, and a delta names the nodes changed since the last."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.proto import gpurm_pb2 as pb
from gpurm.queues.tree import default_tree
from gpurm.rm.server import pbviews
from gpurm.rm.server.viewcache import ViewCache, length_delimited
from gpurm.rm.state.core import NodeRegistration, RMCore, RMSettings


def core_with(nodes: int) -> RMCore:
    core = RMCore(RMSettings(), default_tree())
    for i in range(nodes):
        core.register_node(NodeRegistration(node_id=f"n{i:02d}", host="h", port=1, rack=f"r{i % 3}",
                                            ib_domain=f"r{i % 3}", gpus=[GpuRecord(index=g) for g in range(4)],
                                            containers=[]), f"s{i}", 0.0)
    return core


def test_the_cut_view_is_the_view_built_afresh_before_and_after_changes() -> None:
    core = core_with(12)
    cache = ViewCache()
    assert pb.ClusterView.FromString(cache.full(core, 7, 1.0)) == pbviews.cluster_view(core, 7, 1.0)
    core.submit(JobSpec(gpus=1, command=["x"]), "alice", 2.0)      # its AM goes to a node: that node changes
    core.drain("n05", False, 2.0)
    core.cluster.version += 1
    core.cluster.changed.add("n05")
    assert pb.ClusterView.FromString(cache.full(core, 7, 3.0)) == pbviews.cluster_view(core, 7, 3.0)


def test_a_delta_names_the_nodes_changed_since_the_last_and_the_full_view_does_not_eat_them() -> None:
    core = core_with(5)
    cache = ViewCache()
    assert cache.take_delta(core) == [f"n{i:02d}" for i in range(5)], "a new core: every node"
    assert cache.take_delta(core) == []
    core.cluster.changed.update({"n03", "n01"})
    cache.full(core, 1, 1.0)                  # an AM registering takes the full view in between
    assert cache.take_delta(core) == ["n01", "n03"]
    delta = pb.ClusterView.FromString(pb.ClusterView(delta=True).SerializeToString() + cache.entries(["n01"]))
    assert [n.node_id for n in delta.nodes] == ["n01"]


def test_a_length_delimited_field_is_what_protobuf_writes() -> None:
    for n in (1, 42, 127, 128, 300, 70000):      # (proto3 writes no empty string)
        assert length_delimited(9, b"a" * n) == pb.RegisterAMResponse(am_token="a" * n).SerializeToString()
    view = pb.ClusterView(version=3, nodes=[pb.NodeView(node_id=f"n{i}") for i in range(500)])
    reply = pb.RegisterAMResponse(am_token="t").SerializeToString() + length_delimited(6, view.SerializeToString())
    assert pb.RegisterAMResponse.FromString(reply) == pb.RegisterAMResponse(am_token="t", view=view)
