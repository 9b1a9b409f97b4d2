"""The node registry (rm/state/nodes.py) on its own: sessions, health, expiry, loss and draining."""

from __future__ import annotations

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.model import Container, ContainerKind
from gpurm.rm.state.cluster import Cluster, NodeState
from gpurm.rm.state.messages import NodeRegistration, RequestError
from gpurm.rm.state.nodes import UNREACHABLE_HOLD_S, NodeRegistry


class Rig:
    def __init__(self) -> None:
        self.cluster = Cluster()
        self.changed: list[str] = []
        self.retried: list[float] = []
        self.nodes = NodeRegistry(self.cluster, self.changed.append, self.retried.append)

    def reg(self, node_id: str = "n1", healthy: bool = True) -> NodeRegistration:
        return NodeRegistration(node_id, "h", 1, "r1", "", [GpuRecord(i) for i in range(4)], healthy=healthy)


def test_a_registration_keeps_the_allocations_the_rm_holds_and_the_drain() -> None:
    rig = Rig()
    rig.nodes.admit(rig.reg(), "s1", 0.0, [])
    rig.nodes.drain("n1", undrain=False)
    held = Container("c1", "job-1", ContainerKind.LEARNER, "n1", [2, 3], 1, 0.0)
    node = rig.nodes.admit(rig.reg(), "s2", 5.0, [held])
    assert node.allocated == {2: "c1", 3: "c1"} and node.drain and node.state is NodeState.DRAINING
    assert (node.session, node.ib_domain) == ("s2", "r1")
    assert rig.changed == ["n1", "n1", "n1"]


def test_a_beat_from_an_old_session_or_a_lost_node_asks_for_registration() -> None:
    rig = Rig()
    rig.nodes.admit(rig.reg(), "s1", 0.0, [])
    assert rig.nodes.beat("n1", "old", 1.0) is None
    assert rig.nodes.beat("nx", "s1", 1.0) is None
    assert rig.nodes.beat("n1", "s1", 1.0) is not None
    rig.nodes.lose("n1", "missed beats")
    assert rig.cluster.nodes["n1"].session == "" and rig.nodes.beat("n1", "s1", 2.0) is None


def test_health_changes_are_recorded_once() -> None:
    rig = Rig()
    rig.nodes.admit(rig.reg(), "s1", 0.0, [])
    rig.changed.clear()
    rig.nodes.beat("n1", "s1", 1.0, gpu_health=[(1, False, "XID 79")])
    assert not rig.cluster.nodes["n1"].gpus[1].healthy and rig.changed == ["n1"]
    rig.nodes.beat("n1", "s1", 2.0, gpu_health=[(1, False, "XID 79")])
    assert rig.changed == ["n1"]
    rig.nodes.beat("n1", "s1", 3.0, healthy=False, health_report="ERROR disk")
    assert rig.cluster.nodes["n1"].state is NodeState.UNHEALTHY and rig.changed == ["n1", "n1"]


def test_an_unreachable_agent_is_tried_again_once_it_keeps_beating() -> None:
    rig = Rig()
    node = rig.nodes.admit(rig.reg(), "s1", 0.0, [])
    node.unreachable_since = 10.0
    rig.nodes.beat("n1", "s1", 10.0 + UNREACHABLE_HOLD_S)
    assert rig.retried == [] and node.unreachable_since == 10.0
    rig.nodes.beat("n1", "s1", 11.0 + UNREACHABLE_HOLD_S)
    assert rig.retried == [11.0 + UNREACHABLE_HOLD_S] and node.unreachable_since is None


def test_late_nodes_and_draining() -> None:
    rig = Rig()
    rig.nodes.admit(rig.reg("n1"), "s1", 0.0, [])
    rig.nodes.admit(rig.reg("n2"), "s2", 4.0, [])
    assert rig.nodes.late(6.0, 5.0) == ["n1"]
    rig.nodes.lose("n1", "late")
    assert rig.nodes.late(60.0, 5.0) == ["n2"]
    assert rig.nodes.drain("n2", undrain=False).state is NodeState.DRAINING
    assert rig.nodes.drain("n2", undrain=True).state is NodeState.RUNNING
    with pytest.raises(RequestError):
        rig.nodes.drain("nx", undrain=False)
