"""AM launching: which unfinished jobs want an AM, which have one, and where the next AMs go.

Jobs without a running AM wait per queue in launch order (restarts first, then submit order); `launch` starts
AMs on reachable nodes that run none (a cursor goes round the nodes), else on the least loaded ones, within the
cluster-wide and per-queue acquisition caps and the queues' `max_running_jobs`, touching only the jobs it starts
(plus one per queue that cannot start). Starting one (the container, the job's records, the effect for the shell)
is the core's: it is handed back through `start`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from gpurm.common.model import Job, JobState
from gpurm.rm.state.cluster import Cluster
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.sortedkeys import SortedKeys

StartFn = Callable[[Job, str, float], None]     # (job, node id, now): the core starts that job's AM there


class AMLauncher:
    def __init__(self, cluster: Cluster, queues: QueueBook, jobs: dict[str, Job],
                 live_ams: dict[str, dict[str, None]], max_active: int, max_acquiring_per_queue: int,
                 start: StartFn) -> None:
        self.cluster = cluster
        self.queues = queues
        self.jobs = jobs
        self.live_ams = live_ams                   # node -> its live AM containers (the core's index)
        self.max_active = max_active               # AMs acquiring at once, cluster-wide
        self.max_acquiring_per_queue = max_acquiring_per_queue
        self.start = start
        # Unfinished jobs without a running AM, per queue, in launch order: (restarts first, submit order).
        self.needs_am: dict[str, SortedKeys[tuple[int, int, str]]] = {}
        self.with_am: dict[str, None] = {}        # unfinished jobs whose AM container lives (ordered: determinism)
        self.with_am_by_queue: dict[str, dict[str, None]] = {}   # the same, per queue
        self._ring: list[str] = []     # node ids in a fixed order, and a cursor going round them
        self._at = 0
        self._scanned = 0              # nodes the current launch call has looked at

    def up(self, job: Job) -> None:
        """The job's AM container lives."""
        self.with_am[job.job_id] = None
        self.with_am_by_queue.setdefault(job.queue, {})[job.job_id] = None

    def gone(self, job: Job) -> None:
        """The job's AM container ended, or the job did."""
        self.with_am.pop(job.job_id, None)
        self.with_am_by_queue.get(job.queue, {}).pop(job.job_id, None)

    def want(self, job: Job) -> None:
        """The job waits for an AM (a restart of an admitted one goes first)."""
        key = (0 if job.admitted else 1, job.seq, job.job_id)
        self.needs_am.setdefault(job.queue, SortedKeys()).add(key)

    def drop(self, job: Job) -> None:
        """The job no longer waits for an AM."""
        entries = self.needs_am.get(job.queue)
        if entries is not None:
            entries.discard((0, job.seq, job.job_id))
            entries.discard((1, job.seq, job.job_id))

    def counts(self) -> tuple[int, dict[str, int]]:
        """Jobs acquiring GPUs (an AM, not yet running): cluster-wide and per queue."""
        active = 0
        acquiring: dict[str, int] = {}
        for job_id in self.with_am:
            j = self.jobs[job_id]
            if j.state in (JobState.QUEUED, JobState.ALLOCATING):
                active += 1
                acquiring[j.queue] = acquiring.get(j.queue, 0) + 1
        return active, acquiring

    def launch(self, now: float) -> None:
        """Start AMs: a replacement AM for any admitted job whose AM ended (those hold their slot), then queued
        jobs in submission order within the AM limits. Each queue's waiting jobs are kept sorted, so this touches
        only the jobs it starts (plus one per queue that cannot start)."""
        if not any(self.needs_am.values()):
            return
        self._scanned = 0
        by_load: list[tuple[int, str]] | None = None       # built only once no node is free of AMs
        # Counting the acquiring jobs walks every job with an AM; skip it when no limit can bind this call.
        waiting = sum(len(e) for e in self.needs_am.values())
        bound = len(self.with_am) + waiting
        limited = bound >= self.max_active or bound >= self.max_acquiring_per_queue
        active, acquiring = self.counts() if limited else (0, {})
        heads = [(entries.first(), queue) for queue, entries in self.needs_am.items() if entries]
        heapq.heapify(heads)
        while heads:
            key, queue = heapq.heappop(heads)
            entries = self.needs_am[queue]
            job = self.jobs[key[2]]
            if not job.admitted:
                if limited and active >= self.max_active:
                    continue      # only restarts (which sort first) may still start
                if (limited and acquiring.get(queue, 0) >= self.max_acquiring_per_queue) \
                        or self.running_limit(job):
                    continue      # this queue is full: its later jobs wait too
                active += 1
                acquiring[queue] = acquiring.get(queue, 0) + 1
            node_id = self._node_without_am() if by_load is None else None
            if node_id is None:
                if by_load is None:
                    by_load = self._by_load()
                if not by_load:
                    return
                count, node_id = by_load[0]
                heapq.heapreplace(by_load, (count + 1, node_id))
            entries.pop_first()
            self.start(job, node_id, now)
            if entries:
                heapq.heappush(heads, (entries.first(), queue))

    def _node_without_am(self) -> str | None:
        """A reachable node offering work that runs no AM, found by a cursor going round the nodes, so that a
        launch costs O(1) while most nodes run none (the common case on a big cluster), not a scan of the fleet.
        None once a launch call has looked at every node."""
        if len(self.cluster.nodes) - len(self._ring) > len(self._ring) // 8 or not self._ring:
            # Nodes joined: take them in. Only once the ring is 1/8 behind, so a fleet registering costs O(1)
            # per node (the latest few wait for the next rebuild; a full lap falls back to every node anyway).
            self._ring = list(self.cluster.nodes)
            self._at = 0
        while self._scanned < len(self._ring):
            node_id = self._ring[self._at]
            self._at = (self._at + 1) % len(self._ring)
            self._scanned += 1
            node = self.cluster.nodes.get(node_id)
            if node is not None and node.offering and node.unreachable_since is None \
                    and not self.live_ams.get(node_id):
                return node_id
        return None

    def _by_load(self) -> list[tuple[int, str]]:
        """Every usable node as a heap of (AMs it runs, node id): least loaded first."""
        by_load = [(len(self.live_ams.get(n.node_id, ())), n.node_id) for n in self.cluster.nodes.values()
                   if n.offering and n.unreachable_since is None]
        heapq.heapify(by_load)
        return by_load

    def wait_context(self) -> tuple[bool, int, dict[str, int]]:
        """What `queued_reason` reads of the whole cluster: (some node offers room for an AM, jobs acquiring GPUs
        cluster-wide, per queue). A listing computes it once for a page of jobs, not once per job."""
        active, acquiring = self.counts()
        return any(n.offering for n in self.cluster.nodes.values()), active, acquiring

    def queued_reason(self, job: Job, context: tuple[bool, int, dict[str, int]] | None = None) -> str:
        """Why a job has no AM yet (computed when asked, so a long backlog costs nothing while it waits).
        `context`: a `wait_context()` to reuse (else computed here)."""
        offering, active, acquiring = context if context is not None else self.wait_context()
        if not offering:
            return "waiting for a node to run its AM: no node is up"
        if not job.admitted:
            full = self.running_limit(job)
            if full:
                return full
            if acquiring.get(job.queue, 0) >= self.max_acquiring_per_queue:
                ahead = self.ahead(job)
                return (f"waiting behind {acquiring[job.queue]} jobs acquiring GPUs in "
                        f"{job.queue.removeprefix('root.')}" + (f" ({ahead} more queued ahead)" if ahead else ""))
            if active >= self.max_active:
                return f"waiting for an AM slot: {active} jobs are acquiring GPUs cluster-wide"
        return job.waiting_reason or "waiting for its AM to start"

    def ahead(self, job: Job) -> int:
        """Jobs of the job's queue waiting for an AM that were submitted before it (O(log n): two bisections)."""
        entries = self.needs_am.get(job.queue)
        if entries is None:
            return 0
        restarts = entries.rank((0, job.seq, ""))           # restarts (0, seq, id) submitted earlier
        return restarts + entries.rank((1, job.seq, "")) - entries.rank((1, -1, ""))

    def running_limit(self, job: Job) -> str:
        """Why the job's queues admit no more running jobs (`max_running_jobs`), or ""."""
        leaf = self.queues.tree.by_path.get(job.queue)
        for q in leaf.ancestry() if leaf is not None else ():
            if q.max_running_jobs is not None and self.queues.jobs_active.get(q.path, 0) >= q.max_running_jobs:
                return f"queue {q.short} runs its max_running_jobs ({q.max_running_jobs}); waiting for one to end"
        return ""
