"""The cluster as AMs plan on it: an `am.placement.View` of the RM's cluster model, kept up to date from the
servers that changed (not rebuilt from all of them). The simulator's AMs plan on it; the RM's own placement
questions (does a waiting job fit now, where would a reservation go) read it; the daemon publishes the same facts
per server (rm/server/viewcache.py) and each AM builds this view from them (am/view.py).

What a server shows: its healthy GPUs, the free ones, and of those the ones held for a reservation
(rm/sched/reservations.py) apart, so that only the reservation's holder and a job that would vacate them in time
plan on them (`View.for_job`). GPUs held by elastic growth count as free to plan on (the RM takes them back for a
waiting gang).
"""

from __future__ import annotations

from gpurm.am.placement import ServerView, View
from gpurm.common.gpus import choose_in_islands
from gpurm.rm.sched.elastic import ElasticBook
from gpurm.rm.sched.reservations import Reservations
from gpurm.rm.state.cluster import Cluster, Node


def server_view(node: Node, elastic: ElasticBook, reservations: Reservations) -> ServerView:
    """One server as every AM sees it."""
    reclaim = elastic.reclaimable(node.node_id) if elastic.on_node else []
    free = sorted({*node.free_indices(), *reclaim}) if reclaim else node.free_indices()
    islands = tuple(tuple(i) for i in node.islands)
    holder = reservations.on_node.get(node.node_id)
    if holder is None:
        return ServerView(node.node_id, node.rack, node.healthy_gpus, tuple(free), islands, node.ib_domain,
                          tuple(reclaim))
    r = reservations.by_job[holder]
    need = r.parts.get(node.node_id, 0)
    held = free if len(free) <= need else (choose_in_islands(free, [list(i) for i in node.islands], need) or [])
    kept = set(held)
    return ServerView(node.node_id, node.rack, node.healthy_gpus, tuple(i for i in free if i not in kept), islands,
                      node.ib_domain, tuple(i for i in reclaim if i not in kept), tuple(held), holder, r.start)


class PlanView:
    """The cluster view at the cluster model's current version."""

    def __init__(self, cluster: Cluster, elastic: ElasticBook, reservations: Reservations) -> None:
        self.cluster = cluster
        self.elastic = elastic
        self.reservations = reservations
        self._view: View | None = None
        self._version = -1
        self._servers: dict[str, ServerView] = {}

    def current(self) -> View:
        cluster = self.cluster
        if self._view is not None and cluster.version == self._version:
            return self._view
        changed = []
        added = False
        for node_id in sorted(cluster.take_plan_changed()):
            node = cluster.nodes.get(node_id)
            if node is None:
                continue
            added = added or node_id not in self._servers
            sv = self._servers[node_id] = server_view(node, self.elastic, self.reservations)
            changed.append(sv)
        if self._view is None or added:
            self._view = View(self._servers[k] for k in sorted(self._servers))
        else:
            self._view = self._view.updated(changed)    # the same View, built from the changes alone
        self._version = cluster.version
        return self._view


def reserved_server(node: Node, elastic: ElasticBook, reservations: Reservations) -> ServerView | None:
    """The node's planning view where a reservation holds GPUs on it (what the daemon publishes), else None."""
    if node.node_id not in reservations.on_node:
        return None
    return server_view(node, elastic, reservations)
