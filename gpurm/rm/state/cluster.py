"""The RM's cluster model: nodes, their GPUs and who holds them, with indexes kept up to date on every change
so the scheduler never scans the whole cluster (free GPUs per node, sorted, globally and per rack)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpurm.common.gpus import WHOLE_MILLI, GpuRecord, choose_in_islands, nvlink_islands
from gpurm.rm.state.sortedkeys import SortedKeys

SHARED = "(shared)"   # the holder of a GPU that jobs below one GPU share (Node.shared says who holds what)


class NodeState(enum.Enum):
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    LOST = "LOST"
    DRAINING = "DRAINING"
    DECOMMISSIONED = "DECOMMISSIONED"


@dataclass
class Node:
    node_id: str
    host: str
    port: int
    rack: str
    ib_domain: str
    gpus: dict[int, GpuRecord]
    cpus: int = 0
    memory_mib: int = 0
    state: NodeState = NodeState.RUNNING
    last_heartbeat: float = 0.0
    session: str = ""
    agent_instance: str = ""
    agent_version: str = ""
    allocated: dict[int, str] = field(default_factory=dict)   # GPU index -> container id (or SHARED)
    shared: dict[int, dict[str, int]] = field(default_factory=dict)  # shared GPU index -> container id -> milli
    drain: bool = False
    health_report: str = ""
    islands: list[list[int]] = field(default_factory=list)    # NVLink islands, computed from links
    # When an AM could not be started because the agent did not answer: no AM goes there until the agent
    # registers again or beats well after that (its GPUs stay offered: an AM placing learners there learns it).
    unreachable_since: float | None = None
    metrics_port: int = 0             # the agent's Prometheus exporter on `host` (0: none)
    container_engine: str = ""        # podman | docker: runs image jobs ("" = it does not)
    gpu_passing: str = ""             # cdi | devices | env
    images: set[str] = field(default_factory=set)   # the images its engine holds (image locality; reported anew)
    # An agent that does not follow the heartbeat interval the RM names keeps the terms its registration named: the
    # node is LOST only after that expiry, however short the one in force (0: it follows; rm/state/heartbeats.py)
    pinned_expiry_s: float = 0.0

    @property
    def offering(self) -> bool:
        return self.state is NodeState.RUNNING

    @property
    def healthy_gpus(self) -> int:
        return sum(1 for g in self.gpus.values() if g.healthy)

    def free_indices(self) -> list[int]:
        if not self.offering:
            return []
        return sorted(i for i, g in self.gpus.items() if g.healthy and i not in self.allocated)

    def share_room(self, index: int) -> int:
        """Thousandths of a shared GPU still free (0 for a GPU that is not shared)."""
        holders = self.shared.get(index)
        return WHOLE_MILLI - sum(holders.values()) if holders else 0

    @property
    def free(self) -> int:
        if not self.offering:
            return 0
        return sum(1 for i, g in self.gpus.items() if g.healthy and i not in self.allocated)


def pick_gpus(node: Node, count: int, preferred: Iterable[int] = ()) -> list[int] | None:
    """The GPUs of `node` a container of `count` GPUs gets (see choose_in_islands), or None."""
    return choose_in_islands(node.free_indices(), node.islands, count, preferred)


class Cluster:
    """Nodes by id plus sorted (free GPUs, node id) indexes, globally and per rack."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self._free: dict[str, int] = {}
        self._free_total = 0
        self._by_free: SortedKeys[tuple[int, str]] = SortedKeys()
        self._by_free_rack: dict[str, SortedKeys[tuple[int, str]]] = {}
        self.version = 0
        self.changed: set[str] = set()   # node ids changed since the view was last published
        self.plan_changed: set[str] = set()   # node ids changed since the planning view (planview.py) last looked
        self._capacity: int | None = None  # cached; node, state and health changes reset it
        self._total: int | None = None     # GPUs of nodes not decommissioned: cached the same way
        self.shape_version = 0             # counts node, state and health changes (what servers offer, and where)
        self.releases = 0                  # counts GPU releases (and nodes coming up): "something came free"
        self.shared_nodes: set[str] = set()  # nodes with a shared GPU (place_share looks only there)

    # -- index upkeep
    def _reindex(self, node: Node) -> None:
        old = self._free.get(node.node_id)
        new = node.free
        if old is not None:
            if old == new and node.node_id in self.nodes:
                self._touch(node.node_id)
                return
            self._free_total -= old
            self._by_free.discard((old, node.node_id))
            rack_index = self._by_free_rack.get(node.rack)
            if rack_index is not None:
                rack_index.discard((old, node.node_id))
        self._free[node.node_id] = new
        self._free_total += new
        self._by_free.add((new, node.node_id))
        self._by_free_rack.setdefault(node.rack, SortedKeys()).add((new, node.node_id))
        self._touch(node.node_id)

    def _touch(self, node_id: str) -> None:
        self.version += 1
        self.changed.add(node_id)
        self.plan_changed.add(node_id)

    def touch(self, node_id: str) -> None:
        """Something the views show of the node changed besides its GPUs (a reservation made or ended there, the
        images it holds): publish it."""
        if node_id in self.nodes:
            self._touch(node_id)

    # -- mutation
    def upsert(self, node: Node) -> None:
        """Add a node or replace its description (re-registration keeps its allocations)."""
        old = self.nodes.get(node.node_id)
        if old is not None:
            old_free = self._free.pop(node.node_id, None)
            if old_free is not None:
                self._free_total -= old_free
                self._by_free.discard((old_free, node.node_id))
                rack_index = self._by_free_rack.get(old.rack)
                if rack_index is not None:
                    rack_index.discard((old_free, node.node_id))
        node.islands = nvlink_islands(node.gpus.values())
        self.nodes[node.node_id] = node
        if node.shared:
            self.shared_nodes.add(node.node_id)
        self._capacity = None
        self._total = None
        self.shape_version += 1
        self.releases += 1
        self._reindex(node)

    def set_state(self, node_id: str, state: NodeState) -> None:
        node = self.nodes[node_id]
        if node.state is not state:
            node.state = state
            self._capacity = None
            self._total = None
            self.shape_version += 1
            if node.offering:
                self.releases += 1        # its free GPUs are on offer again
            self._reindex(node)

    def set_gpu_health(self, node_id: str, index: int, healthy: bool, reason: str) -> None:
        node = self.nodes[node_id]
        gpu = node.gpus.get(index)
        if gpu is not None and (gpu.healthy, gpu.health_reason) != (healthy, reason):
            gpu.healthy, gpu.health_reason = healthy, reason
            self._capacity = None
            self._total = None
            self.shape_version += 1
            if healthy:
                self.releases += 1
            self._reindex(node)

    def allocate(self, node_id: str, indices: Iterable[int], container_id: str) -> None:
        node = self.nodes[node_id]
        for i in indices:
            holder = node.allocated.get(i)
            if holder is not None and holder != container_id:
                raise ValueError(f"GPU {i} of {node_id} is already held by {holder}")
            node.allocated[i] = container_id
        self._reindex(node)

    def allocate_share(self, node_id: str, index: int, milli: int, container_id: str) -> None:
        """Give `container_id` `milli` thousandths of GPU `index`: a free GPU becomes shared (no whole-GPU job
        lands on it until its last share ends), or a shared GPU with that much room takes one more."""
        node = self.nodes[node_id]
        holder = node.allocated.get(index)
        holders = node.shared.get(index, {})
        if holder is not None and holder != SHARED:
            raise ValueError(f"GPU {index} of {node_id} is held whole by {holder}")
        room = node.share_room(index) if holders else WHOLE_MILLI
        if container_id not in holders and milli > room:
            raise ValueError(f"GPU {index} of {node_id} has {room} thousandths free, not {milli}")
        node.allocated[index] = SHARED
        node.shared[index] = {**holders, container_id: milli}
        self.shared_nodes.add(node_id)
        self._reindex(node)

    def hold(self, node_id: str, indices: Iterable[int], container_id: str, share_milli: int = 0) -> None:
        """Allocate a container's GPUs as it holds them: whole, or a share of one GPU."""
        if share_milli:
            for i in indices:
                self.allocate_share(node_id, i, share_milli, container_id)
        else:
            self.allocate(node_id, indices, container_id)

    def release(self, node_id: str, indices: Iterable[int], container_id: str) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            return
        for i in indices:
            holder = node.allocated.get(i)
            if holder == container_id:
                del node.allocated[i]
            elif holder == SHARED:
                holders = node.shared.get(i, {})
                holders.pop(container_id, None)
                if not holders:          # its last share ended: a whole GPU again
                    node.shared.pop(i, None)
                    del node.allocated[i]
        if not node.shared:
            self.shared_nodes.discard(node_id)
        self.releases += 1
        self._reindex(node)

    def place_share(self, milli: int, rack: str = "", node_id: str = "") -> tuple[Node, int] | None:
        """Where a share of `milli` goes: the shared GPU with the least room that fits it (best fit keeps room
        whole for bigger shares), else a free GPU on the server with the fewest free (whole GPUs stay together
        for whole-GPU jobs). None when no GPU has the room. `rack` / `node_id` narrow the search."""
        best: tuple[int, str, int] | None = None
        for nid in sorted(self.shared_nodes) if not node_id else [node_id]:
            node = self.nodes.get(nid)
            if node is None or not node.offering or (rack and node.rack != rack):
                continue
            for index in node.shared:
                room = node.share_room(index)
                gpu = node.gpus.get(index)
                if room >= milli and gpu is not None and gpu.healthy and (best is None or room < best[0]):
                    best = (room, nid, index)
        if best is not None:
            return self.nodes[best[1]], best[2]
        if node_id:
            node = self.nodes.get(node_id)
            free = node.free_indices() if node is not None else []
            return (node, free[0]) if node is not None and free else None
        node = next(iter(self.nodes_with_free(1, rack or None)), None)
        if node is None:
            return None
        return node, node.free_indices()[0]

    # -- queries
    def free(self, node_id: str) -> int:
        return self._free.get(node_id, 0)

    def nodes_with_free(self, at_least: int, rack: str | None = None) -> Iterator[Node]:
        """Nodes with at least `at_least` free GPUs, tightest fit first (best fit)."""
        index = self._by_free if rack is None else self._by_free_rack.get(rack)
        if index is None:
            return
        for _, node_id in index.from_key((max(at_least, 1), "")):
            yield self.nodes[node_id]

    @property
    def capacity(self) -> int:
        """GPUs that could serve jobs: healthy GPUs of nodes not lost or decommissioned."""
        if self._capacity is None:
            self._capacity = sum(n.healthy_gpus for n in self.nodes.values()
                                 if n.state not in (NodeState.LOST, NodeState.DECOMMISSIONED))
        return self._capacity

    @property
    def total_gpus(self) -> int:
        if self._total is None:       # (submit and every allocate reply ask: no scan of the fleet each time)
            self._total = sum(len(n.gpus) for n in self.nodes.values() if n.state is not NodeState.DECOMMISSIONED)
        return self._total

    @property
    def free_gpus(self) -> int:
        return self._free_total

    def racks(self) -> list[str]:
        return sorted({n.rack for n in self.nodes.values()})

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed

    def take_plan_changed(self) -> set[str]:
        changed, self.plan_changed = self.plan_changed, set()
        return changed
