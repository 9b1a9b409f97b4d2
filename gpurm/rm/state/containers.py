"""The RM's container records and the indexes over them: all containers, each job's (oldest first), the live
ones (overall, per job, per node, and AMs per node), learner grants not yet seen running, live learners per job,
and live containers under a preemption deadline.

Every change to a live container goes through `index_live` / `unindex_live`, which keep all the indexes in step
and tell the core (`runs_changed`: job id) that a job's learners came, started or went. The records themselves
(phase, exit, deadlines) are changed by the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpurm.common.model import Container, ContainerKind, ContainerPhase


class ContainerIndex:
    def __init__(self, runs_changed: Callable[[str], None]) -> None:
        self.runs_changed = runs_changed
        self.containers: dict[str, Container] = {}
        self.by_job: dict[str, list[str]] = {}    # job id -> its container ids, oldest first
        self.live: dict[str, Container] = {}      # containers not yet ended
        self.live_by_job: dict[str, dict[str, Container]] = {}   # the same, per job
        self.unstarted: dict[str, None] = {}      # learner grants not yet seen running
        self.live_ams: dict[str, dict[str, None]] = {}  # node -> its live AM containers
        self.live_by_node: dict[str, dict[str, Container]] = {}  # node -> its live containers (a node's
        # registration or loss touches only its own)
        self.learners_live: dict[str, int] = {}   # job id -> how many live learner containers it has (if any)
        self.preempting: dict[str, None] = {}     # live containers under a preemption deadline

    def add(self, c: Container) -> None:
        """A new container (a grant, an AM)."""
        self.containers[c.container_id] = c
        self.by_job.setdefault(c.job_id, []).append(c.container_id)
        if c.phase.live:
            self.index_live(c)

    def load(self, containers: Iterable[Container]) -> None:
        """Records from the store: each job's containers ordered by creation."""
        for c in containers:
            self.containers[c.container_id] = c
            self.by_job.setdefault(c.job_id, []).append(c.container_id)
            if c.phase.live:
                self.index_live(c)
        for ids in self.by_job.values():
            ids.sort(key=lambda cid: (self.containers[cid].created, cid))

    def index_live(self, c: Container) -> None:
        self.runs_changed(c.job_id)
        if c.kind is ContainerKind.LEARNER and c.container_id not in self.live:
            self.learners_live[c.job_id] = self.learners_live.get(c.job_id, 0) + 1
        self.live[c.container_id] = c
        self.live_by_job.setdefault(c.job_id, {})[c.container_id] = c
        self.live_by_node.setdefault(c.node_id, {})[c.container_id] = c
        if c.preempt_deadline:
            self.preempting[c.container_id] = None
        if c.kind is ContainerKind.LEARNER and c.phase is ContainerPhase.ALLOCATED:
            self.unstarted[c.container_id] = None
        if c.kind is ContainerKind.AM:
            self.live_ams.setdefault(c.node_id, {})[c.container_id] = None

    def unindex_live(self, c: Container) -> None:
        self.runs_changed(c.job_id)
        self.preempting.pop(c.container_id, None)
        if c.kind is ContainerKind.LEARNER and c.container_id in self.live:
            left = self.learners_live.get(c.job_id, 0) - 1
            if left > 0:
                self.learners_live[c.job_id] = left
            else:
                self.learners_live.pop(c.job_id, None)
        self.live.pop(c.container_id, None)
        self.unstarted.pop(c.container_id, None)
        if c.kind is ContainerKind.AM:
            self.live_ams.get(c.node_id, {}).pop(c.container_id, None)
        mine = self.live_by_job.get(c.job_id)
        if mine is not None:
            mine.pop(c.container_id, None)
            if not mine:
                del self.live_by_job[c.job_id]
        here = self.live_by_node.get(c.node_id)
        if here is not None:
            here.pop(c.container_id, None)
            if not here:
                del self.live_by_node[c.node_id]

    def of_job(self, job_id: str, live_only: bool = True) -> list[Container]:
        if live_only:
            return list(self.live_by_job.get(job_id, {}).values())
        return [self.containers[cid] for cid in self.by_job.get(job_id, ())]

    def on_node(self, node_id: str) -> list[Container]:
        """The live containers on a node (a copy: callers end some of them as they go)."""
        return list(self.live_by_node.get(node_id, {}).values())

    def live_count(self, job_id: str) -> int:
        return len(self.live_by_job.get(job_id, ()))

    def holding(self) -> dict[str, list[Container]]:
        """Live learner containers per job (only jobs that hold GPUs)."""
        return {job_id: [c for c in self.live_by_job[job_id].values() if c.kind is ContainerKind.LEARNER]
                for job_id in self.learners_live}
