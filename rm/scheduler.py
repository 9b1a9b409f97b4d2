"""The scheduler core: turns the AMs' outstanding asks into grants of specific GPUs. Pure: no clock, no I/O.

A pass walks the apps with outstanding asks in scheduling order and grants every ask that fits, one container
at a time, updating the cluster's indexes as it goes. The AM chooses servers (its asks name nodes); the
scheduler only decides who gets what is free, and in which order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpurm.rm.cluster import Cluster, pick_gpus


@dataclass
class Ask:
    """`count` containers of `gpus` GPUs each, on `node_id` (or anywhere, narrowed by `rack`)."""

    gpus: int
    count: int = 1
    node_id: str = ""
    rack: str = ""
    preferred: tuple[int, ...] = ()

    def matches(self, node_id: str, rack: str, gpus: int) -> bool:
        if gpus != self.gpus or self.count <= 0:
            return False
        if self.node_id:
            return self.node_id == node_id
        return not self.rack or self.rack == rack


@dataclass
class App:
    """What the scheduler needs to know of one job with a running AM."""

    job_id: str
    queue: str
    user: str
    seq: int                      # submission order
    asks: list[Ask] = field(default_factory=list)
    held_gpus: int = 0

    @property
    def demand(self) -> int:
        return sum(a.gpus * a.count for a in self.asks)


@dataclass
class Grant:
    job_id: str
    container_id: str
    node_id: str
    gpu_indices: list[int]
    preemptible: bool = False


def subtract_grants(asks: list[Ask], grants: Iterable[tuple[str, str, int]]) -> list[Ask]:
    """Asks minus grants the AM has not seen yet (node, rack, gpus): an AM's asks never count them twice."""
    out = [Ask(a.gpus, a.count, a.node_id, a.rack, a.preferred) for a in asks]
    for node_id, rack, gpus in grants:
        # A node-specific ask is the closer match; fall back to a rack or anywhere ask.
        for a in sorted(out, key=lambda a: (not a.node_id, not a.rack)):
            if a.matches(node_id, rack, gpus):
                a.count -= 1
                break
    return [a for a in out if a.count > 0]


def order_fifo(apps: Iterable[App]) -> list[App]:
    return sorted(apps, key=lambda a: a.seq)


class Scheduler:
    """Grants asks against the cluster. `order` decides who goes first (queues refine it)."""

    def __init__(self, cluster: Cluster, order: Callable[[Iterable[App]], list[App]] = order_fifo) -> None:
        self.cluster = cluster
        self.order = order

    def schedule(self, apps: Iterable[App], new_container_id: Callable[[str], str]) -> list[Grant]:
        grants: list[Grant] = []
        for app in self.order([a for a in apps if a.asks]):
            for ask in app.asks:
                while ask.count > 0:
                    grant = self._grant_one(app, ask, new_container_id)
                    if grant is None:
                        break
                    grants.append(grant)
                    ask.count -= 1
                    app.held_gpus += ask.gpus
            app.asks = [a for a in app.asks if a.count > 0]
        return grants

    def _grant_one(self, app: App, ask: Ask, new_id: Callable[[str], str]) -> Grant | None:
        if ask.node_id:
            node = self.cluster.nodes.get(ask.node_id)
            candidates = [node] if node is not None else []
        else:
            candidates = list(self.cluster.nodes_with_free(ask.gpus, ask.rack or None))
        for node in candidates:
            indices = pick_gpus(node, ask.gpus, ask.preferred)
            if indices is None:
                continue
            cid = new_id(app.job_id)
            self.cluster.allocate(node.node_id, indices, cid)
            return Grant(app.job_id, cid, node.node_id, indices)
        return None
