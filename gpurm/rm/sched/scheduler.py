"""The scheduler core: turns the AMs' outstanding asks into grants of specific GPUs. Pure: no clock, no I/O.

A pass hands out one container at a time to the neediest queue: from the root down, the child with the lowest
usage / instantaneous share (ties by path), until a leaf; inside the leaf the first job by its policy (`fifo`:
submit order; `las`: least attained GPU-seconds first, ties by submit order). After each grant the usages on
that path change and the order is updated (sorted containers, so the pass never rescans the tree). A job whose
next ask does not fit is set aside for the rest of the pass.

Limits: a grant may not take a queue (or an ancestor) above `max_gpus`, nor a user above `max_gpus_per_user`.
Oversubscription: a queue may use idle GPUs beyond its share (preemption takes them back when their owner needs
them), but while another queue waits below its instantaneous share, a grant beyond the share is refused if it would
leave the job's gang incomplete: no incomplete gang hoards GPUs past its queue's share. GPUs freed by preemption are
reserved for the queue they were taken back for. A container that takes its queue above its steady share is marked
preemptible. The AM chooses servers (asks name nodes); the scheduler decides who gets what is free.

Under a borrowing policy (the queue tree's `borrowing: las | gittins | srtf`, rm/sched/borrowing.py) the steady
share takes the instantaneous one's place above (`QueueBook.between`), and the pass has two parts: first the jobs
that start while their queue is below its steady share (a gang that straddles it included), neediest queue first as
above; then every queue's jobs that would start at or beyond it, cluster-wide in the borrowing policy's order (one
Tiresias queue). This matches who borrows (rm/sched/borrowing.py): the jobs wholly beyond the share.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpurm.queues.tree import Policy, QueueDef
from gpurm.rm.sched.history import History
from gpurm.rm.sched.priority import LAS_THRESHOLDS_GPU_S, Standing, rank
from gpurm.rm.sched.reservations import Reservations
from gpurm.rm.state.cluster import Cluster, pick_gpus
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.sortedkeys import SortedKeys


@dataclass
class Ask:
    """`count` containers of `gpus` GPUs each, on `node_id` (or anywhere, narrowed by `rack`)."""

    gpus: int
    count: int = 1
    node_id: str = ""
    rack: str = ""
    preferred: tuple[int, ...] = ()
    elastic: bool = False         # growth of a running elastic job (rm/sched/elastic.py), not part of its gang
    share_milli: int = 0          # a share of one GPU (thousandths; gpus is 1): see Cluster.place_share

    @property
    def amount(self) -> float:
        """What one container of this ask counts for in its queue's usage."""
        return self.share_milli / 1000 if self.share_milli else float(self.gpus)

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
    standing: Standing | None = None   # for `las` / `srtf` (the core fills it in before a pass)
    blocked: str = ""             # why the last pass could not grant its next ask, when the reason is the RM's

    @property
    def demand(self) -> float:
        return sum(a.amount * a.count for a in self.asks)


@dataclass
class Grant:
    job_id: str
    container_id: str
    node_id: str
    gpu_indices: list[int]
    preemptible: bool = False
    share_milli: int = 0          # a share of its one GPU (thousandths), 0 for whole GPUs

    @property
    def amount(self) -> float:
        return self.share_milli / 1000 if self.share_milli else float(len(self.gpu_indices))


def subtract_grants(asks: list[Ask], grants: Iterable[tuple[str, str, int]]) -> list[Ask]:
    """Asks minus grants the AM has not seen yet (node, rack, gpus): an AM's asks never count them twice."""
    out = [Ask(a.gpus, a.count, a.node_id, a.rack, a.preferred, a.elastic, a.share_milli) for a in asks]
    for node_id, rack, gpus in grants:
        # A node-specific ask is the closer match; fall back to a rack or anywhere ask.
        for a in sorted(out, key=lambda a: (not a.node_id, not a.rack)):
            if a.matches(node_id, rack, gpus):
                a.count -= 1
                break
    return [a for a in out if a.count > 0]


def shaped_asks(asks: list[Ask], share_milli: int) -> list[Ask]:
    """An AM's asks as its job's spec allows them, whatever the AM sent: a job below one GPU (`share_milli` > 0)
    asks for at most one share of that size of one GPU; a whole-GPU job's asks carry no share."""
    if share_milli:
        gang = [a for a in asks if not a.elastic]
        return [Ask(1, 1, gang[0].node_id, gang[0].rack, share_milli=share_milli)] if gang else []
    if any(a.share_milli for a in asks):
        return [Ask(a.gpus, a.count, a.node_id, a.rack, a.preferred, a.elastic) for a in asks]
    return asks


def policy_key(policy: Policy, now: float, thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
               gittins: History | None = None) -> Callable[[App], tuple[float, float, int]]:
    key = rank(policy, now, thresholds, gittins)
    return lambda a: key(a.standing or Standing(a.job_id, a.seq, 0))


class Scheduler:
    def __init__(self, cluster: Cluster, book: QueueBook,
                 las_thresholds: tuple[float, ...] = LAS_THRESHOLDS_GPU_S,
                 history: History | None = None) -> None:
        self.cluster = cluster
        self.book = book
        self.las_thresholds = las_thresholds      # the same levels in-queue preemption ranks by (RMSettings)
        self.history = history                    # what finished jobs taught (the core's): gittins ranks by it
        self.reserved: dict[str, int] = {}
        self.held_from: dict[str, tuple[str, int]] = {}
        self.policy_override: Policy | None = None   # the simulator's --policy: every leaf uses it
        # Reserved GPUs go only to their holder, or to a job expected to end before the holder needs them
        # (rm/sched/reservations.py); when a job is expected to end if started now (the core's estimate).
        self.reservations: Reservations | None = None
        self.expected_end: Callable[[str, float], float] = _never
        self._now = 0.0

    def policy_of(self, leaf: QueueDef) -> Policy:
        return self.policy_override or leaf.effective_policy

    def schedule(self, apps: Iterable[App], new_container_id: Callable[[str], str], now: float = 0.0,
                 reserved: dict[str, int] | None = None,
                 held_from: dict[str, tuple[str, int]] | None = None) -> list[Grant]:
        """One pass. `reserved`: GPUs freed by preemption and held for a queue, per queue; `held_from`: those of
        them in-queue preemption freed, kept from the job they were taken from for the job they were freed for,
        victim -> (that job, GPUs)."""
        self.reserved = dict(reserved or {})
        self.held_from = dict(held_from or {})
        self._now = now
        tree = self.book.tree
        capacity = self.cluster.capacity
        shares = self.book.shares(capacity)
        borrowing = self.book.borrowing
        # The share queues are held to between each other: instantaneous (`fair`), or steady under a borrowing
        # policy, beyond which every grant is ranked by that policy cluster-wide (rm/sched/borrowing.py).
        fair = self.book.between(shares)
        steady = shares.steady
        by_leaf: dict[str, list[App]] = {}
        for app in apps:
            app.blocked = ""
            if app.asks and app.queue in tree.by_path:
                by_leaf.setdefault(app.queue, []).append(app)
        if not by_leaf:
            return []
        queues: dict[str, deque[App]] = {}
        for leaf, members in by_leaf.items():
            members.sort(key=policy_key(self.policy_of(tree.by_path[leaf]), now, self.las_thresholds, self.history))
            queues[leaf] = deque(members)
        # Leaves that want more than they use while below their share: nobody else may go above theirs.
        waiting = set(self.book.short(shares))     # a copy: this pass changes it as queues reach their share
        children: dict[str, SortedKeys[tuple[float, str]]] = {}
        keys: dict[str, tuple[float, str]] = {}

        used = self.book.used

        def key(path: str) -> tuple[float, str]:
            # usage / share: lower is needier (see QueueBook.ratio)
            share = fair.get(path, 0)
            u = used.get(path, 0)
            return ((u / share) if share > 0 else (float("inf") if u else 1e9), path)

        for leaf in queues:
            q: QueueDef | None = tree.by_path[leaf]
            while q is not None and q.parent is not None:
                parent = q.parent.path
                siblings = children.setdefault(parent, SortedKeys())
                if q.path not in keys:
                    keys[q.path] = key(q.path)
                    siblings.add(keys[q.path])
                q = q.parent

        def reposition(leaf: str) -> None:
            q = tree.by_path[leaf]
            while q.parent is not None:
                if q.path in keys:
                    siblings = children[q.parent.path]
                    siblings.discard(keys[q.path])
                    keys[q.path] = key(q.path)
                    siblings.add(keys[q.path])
                q = q.parent

        def retire(leaf: str) -> None:
            q = tree.by_path[leaf]
            while q.parent is not None:
                siblings = children[q.parent.path]
                siblings.discard(keys.pop(q.path))
                if siblings:
                    return
                q = q.parent

        grants: list[Grant] = []
        borrowers: list[App] = []        # under a borrowing policy: the apps that would start beyond the share,
        inside: dict[str, None] = {}     # and those that start inside it (a gang straddling it stays inside)
        while children.get("root"):
            path = children["root"].first()[1]
            while path in children:
                path = children[path].first()[1]
            leaf_q = tree.by_path[path]
            line = queues[path]
            app = line[0]
            if borrowing is not None and app.job_id not in inside \
                    and used.get(path, 0) >= steady.get(path, 0):
                # Beyond its queue's steady share: ranked with every other queue's such jobs, after the guarantees.
                borrowers.append(app)
                line.popleft()
            else:
                if borrowing is not None:
                    inside[app.job_id] = None      # it starts inside the share: its whole gang is served here
                grant = self._grant_next(app, leaf_q, waiting, fair, steady, new_container_id)
                if grant is not None:
                    self._charge(app, path, grant, fair, waiting)
                    if not app.asks:
                        line.popleft()
                    reposition(path)
                    grants.append(grant)
                else:
                    line.popleft()
            if not line:
                retire(path)
        if borrowers and borrowing is not None:
            # Borrowed capacity, as one Tiresias queue: every queue's borrowers in the borrowing policy's order.
            borrowers.sort(key=policy_key(borrowing, now, self.las_thresholds, self.history))
            for app in borrowers:
                leaf_q = tree.by_path[app.queue]
                while app.asks:
                    grant = self._grant_next(app, leaf_q, waiting, fair, steady, new_container_id)
                    if grant is None:
                        break
                    self._charge(app, app.queue, grant, fair, waiting)
                    grants.append(grant)
        return grants

    def _charge(self, app: App, path: str, grant: Grant, fair: dict[str, int], waiting: set[str]) -> None:
        """A grant made: its queue is charged, what was held for it answered."""
        gpus = len(grant.gpu_indices)
        if self.reserved.get(path):
            self.reserved[path] = max(0, self.reserved[path] - gpus)
        if self.held_from:
            self._answered(app.job_id, gpus)
        self.book.charge(path, app.user, grant.amount)
        app.held_gpus += gpus
        if self.book.used[path] >= fair.get(path, 0):
            waiting.discard(path)

    def _grant_next(self, app: App, leaf: QueueDef, waiting: set[str], inst: dict[str, int],
                    steady: dict[str, int], new_id: Callable[[str], str]) -> Grant | None:
        ask = app.asks[0]
        limit = self.book.over_cap(leaf, app.user, ask.amount)
        if limit:
            app.blocked = limit
            return None
        used_after = self.book.used.get(leaf.path, 0) + ask.amount
        incomplete = ask.count > 1 or len(app.asks) > 1          # more of its gang would still be missing
        # A job whose reservation is ready has its whole gang free and held for it: granted in this pass, it leaves
        # no incomplete gang above the share, and refusing it would throw the drain away.
        ready = self._reservation_ready(app.job_id, ask.node_id)
        if incomplete and not ready and used_after > inst.get(leaf.path, 0) and len(waiting) > (leaf.path in waiting):
            others = [p for p in sorted(waiting)[:4] if p != leaf.path][:3]
            app.blocked = (f"queue {leaf.short} would go above its fair share ({inst.get(leaf.path, 0)} GPUs) "
                           f"with an incomplete gang while {', '.join(tree_short(p) for p in others)} wait below "
                           "theirs")
            return None
        held_for_others = sum(self.reserved.values()) - self.reserved.get(leaf.path, 0)
        # (GPUs held for a reservation are no queue's to take back: its holder takes nothing the hold could use.)
        if held_for_others > 0 and not ready and self.cluster.free_gpus - ask.gpus < held_for_others:
            app.blocked = "idle GPUs are held for a queue that preemption took them back for"
            return None
        if self.held_from:
            # Its own queue's hold does not keep GPUs from a victim of in-queue preemption (same queue): this does.
            kept = self.held_from.get(app.job_id)
            if kept is not None and kept[1] and self.cluster.free_gpus - ask.gpus < held_for_others + kept[1]:
                app.blocked = f"idle GPUs it was preempted for are held for {kept[0]}"
                return None
        if ask.share_milli:
            return self._grant_share(app, ask, leaf.effective_preemptible and used_after > steady.get(leaf.path, 0),
                                     new_id)
        if ask.node_id:
            if self.cluster.free(ask.node_id) < ask.gpus:
                return None                    # the usual case on a busy cluster: answered by the index
            node = self.cluster.nodes.get(ask.node_id)
            candidates = [node] if node is not None else []
        else:
            candidates = list(self.cluster.nodes_with_free(ask.gpus, ask.rack or None))
        reservations = self.reservations
        reserved_for = ""
        for node in candidates:
            if reservations is not None and node.node_id in reservations.on_node and not reservations.allows(
                    app.job_id, node.node_id, ask.gpus, self.expected_end(app.job_id, self._now)):
                reserved_for = reservations.on_node[node.node_id]
                continue
            indices = pick_gpus(node, ask.gpus, ask.preferred)
            if indices is None:
                continue
            cid = new_id(app.job_id)
            self.cluster.allocate(node.node_id, indices, cid)
            ask.count -= 1
            if ask.count <= 0:
                app.asks.pop(0)
            preemptible = leaf.effective_preemptible and used_after > steady.get(leaf.path, 0)
            return Grant(app.job_id, cid, node.node_id, indices, preemptible)
        if reserved_for:
            app.blocked = f"the GPUs it could take are reserved for {reserved_for}, which has waited longer for them"
        return None

    def _reservation_ready(self, job_id: str, node_id: str) -> bool:
        """Whether the job holds a reservation whose GPUs are all free, and the ask is for one of its servers."""
        res = self.reservations
        if res is None or not res.by_job:
            return False
        r = res.by_job.get(job_id)
        return r is not None and r.ready_since is not None and node_id in r.parts

    def _grant_share(self, app: App, ask: Ask, preemptible: bool, new_id: Callable[[str], str]) -> Grant | None:
        """A container of a job below one GPU: on a shared GPU with room, else on a free GPU that becomes shared."""
        where = self.cluster.place_share(ask.share_milli, ask.rack, ask.node_id)
        if where is None:
            return None
        node, index = where
        cid = new_id(app.job_id)
        self.cluster.allocate_share(node.node_id, index, ask.share_milli, cid)
        ask.count -= 1
        if ask.count <= 0:
            app.asks.pop(0)
        return Grant(app.job_id, cid, node.node_id, [index], preemptible, ask.share_milli)


    def _answered(self, job_id: str, gpus: int) -> None:
        """`job_id` was granted `gpus`: that much less is kept from the victims of its room."""
        for victim, (for_job, kept) in list(self.held_from.items()):
            if for_job == job_id and gpus > 0:
                take = min(kept, gpus)
                gpus -= take
                self.held_from[victim] = (for_job, kept - take)


def _never(job_id: str, now: float) -> float:
    return float("inf")


def tree_short(path: str) -> str:
    return path.removeprefix("root.")
