"""The node registry: agents registering (a fresh session, the node's description, allocations the RM holds kept),
heartbeats (liveness, GPU and node health, an unreachable agent tried again), expiry, loss and draining. It owns
the node records' lifecycle in the cluster model; what a node's containers did (reports, losses) is the core's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from gpurm.common.model import Container
from gpurm.rm.state.cluster import SHARED, Cluster, Node, NodeState
from gpurm.rm.state.messages import ErrorCode, NodeRegistration, RequestError

log = logging.getLogger(__name__)

UNREACHABLE_HOLD_S = 10.0    # an agent that failed an AM start gets no AM for this long while it beats


class NodeRegistry:
    def __init__(self, cluster: Cluster, node_changed: Callable[[str], None],
                 reachable_again: Callable[[float], None]) -> None:
        self.cluster = cluster
        self.node_changed = node_changed          # a node record to persist
        self.reachable_again = reachable_again    # an agent that failed an AM start beats again: AMs may go there

    @staticmethod
    def healthy_state(node: Node, healthy: bool) -> NodeState:
        if node.drain:
            return NodeState.DRAINING
        return NodeState.RUNNING if healthy else NodeState.UNHEALTHY

    def admit(self, reg: NodeRegistration, session: str, now: float, live: Iterable[Container],
              expiry_s: float = 0.0) -> Node:
        """Add or re-add a node under a new session; the GPUs live containers hold there stay allocated.
        `expiry_s`: the expiry its registration reply names, which an agent that does not follow later replies'
        terms keeps (Node.pinned_expiry_s)."""
        old = self.cluster.nodes.get(reg.node_id)
        node = Node(node_id=reg.node_id, host=reg.host, port=reg.port, rack=reg.rack,
                    ib_domain=reg.ib_domain or reg.rack, gpus={g.index: g for g in reg.gpus}, cpus=reg.cpus,
                    memory_mib=reg.memory_mib, last_heartbeat=now, session=session,
                    agent_instance=reg.agent_instance, agent_version=reg.agent_version,
                    drain=old.drain if old else False, health_report=reg.health_report,
                    metrics_port=reg.metrics_port, container_engine=reg.container_engine,
                    gpu_passing=reg.gpu_passing, images=set(reg.images),
                    pinned_expiry_s=0.0 if reg.follows_interval else expiry_s)
        node.state = self.healthy_state(node, reg.healthy)
        # Allocations the RM holds on this node survive re-registration.
        for c in live:
            if c.node_id == reg.node_id:
                for i in c.gpu_indices:
                    if c.share_milli:
                        node.allocated[i] = SHARED
                        node.shared.setdefault(i, {})[c.container_id] = c.share_milli
                    else:
                        node.allocated[i] = c.container_id
        self.cluster.upsert(node)
        self.node_changed(node.node_id)
        return node

    def beat(self, node_id: str, session: str, now: float, healthy: bool = True, health_report: str = "",
             gpu_health: Iterable[tuple[int, bool, str]] = ()) -> Node | None:
        """A heartbeat: the node, or None when the agent must register again (unknown, old session, lost)."""
        node = self.cluster.nodes.get(node_id)
        if node is None or node.session != session or node.state is NodeState.LOST:
            return None
        node.last_heartbeat = now
        if node.unreachable_since is not None and now - node.unreachable_since > UNREACHABLE_HOLD_S:
            node.unreachable_since = None        # it beats: try it again for AMs
            self.reachable_again(now)
        for index, ok, reason in gpu_health:
            gpu = node.gpus.get(index)
            if gpu is not None and (gpu.healthy, gpu.health_reason) != (ok, reason):
                log.warning("node %s: GPU %d %s", node_id, index, "healthy again" if ok else f"unhealthy: {reason}")
                self.cluster.set_gpu_health(node_id, index, ok, reason)
                self.node_changed(node_id)
        if node.health_report != health_report or node.state is not self.healthy_state(node, healthy):
            node.health_report = health_report
            if node.state is not NodeState.DECOMMISSIONED:
                self.cluster.set_state(node_id, self.healthy_state(node, healthy))
            self.node_changed(node_id)
        return node

    def images_changed(self, node_id: str, session: str, added: Iterable[str], removed: Iterable[str],
                       limit: int) -> None:
        """A heartbeat's image deltas (image locality), for the node's current session; at most `limit` kept."""
        node = self.cluster.nodes.get(node_id)
        if node is None or node.session != session:
            return
        before = len(node.images)
        gone = set(removed)
        node.images -= gone
        for name in added:
            if len(node.images) >= limit:
                break
            node.images.add(name)
        if gone or len(node.images) != before:
            self.cluster.touch(node_id)        # the view shows them; nothing to store (agents report them again)

    def late(self, now: float, limit_s: float, resyncing: bool = False) -> list[str]:
        """Nodes not heard from for longer than `limit_s`, or than their own pinned expiry when that is longer
        (an agent that keeps the terms it registered with; lost and decommissioned ones aside). `resyncing`: an
        RM restart's grace is on, and nodes that have not registered since (no session) are spared."""
        return [node.node_id for node in self.cluster.nodes.values()
                if node.state not in (NodeState.LOST, NodeState.DECOMMISSIONED)
                and now - node.last_heartbeat > limit_s and now - node.last_heartbeat > node.pinned_expiry_s
                and not (resyncing and not node.session)]

    def counted(self) -> int:
        """The servers the heartbeat interval is paced for: every node not LOST or decommissioned (a node known
        from the store before its agent is back included: it is expected)."""
        return sum(1 for node in self.cluster.nodes.values()
                   if node.state is not NodeState.LOST and node.state is not NodeState.DECOMMISSIONED)

    def lose(self, node_id: str, why: str) -> None:
        """The node is LOST: its session ends; it must register again."""
        node = self.cluster.nodes[node_id]
        log.warning("node %s is LOST: %s", node_id, why)
        self.cluster.set_state(node_id, NodeState.LOST)
        node.health_report = why
        node.session = ""
        self.node_changed(node_id)

    def drain(self, node_id: str, undrain: bool) -> Node:
        node = self.cluster.nodes.get(node_id)
        if node is None:
            raise RequestError(ErrorCode.NOT_FOUND, f"node_id: no node {node_id!r}; see `gpurm nodes`")
        node.drain = not undrain
        if node.state in (NodeState.RUNNING, NodeState.DRAINING, NodeState.UNHEALTHY):
            self.cluster.set_state(node_id, NodeState.DRAINING if node.drain else NodeState.RUNNING)
        self.node_changed(node_id)
        return node
