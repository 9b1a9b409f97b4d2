"""Recovery from the store: the records an earlier RM wrote are loaded into a fresh core, and what is derived
from them (GPU allocations, jobs with an AM or waiting for one, the queue book's usage, demand and admissions)
is rebuilt from the records alone, so a restart and a rollback after a failed write (rm/storage/persist.py) end in the
same state. Nodes come back as last seen with a full expiry period to re-register; the core gives AMs and grants
a fresh clock from the time of the restore.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from gpurm.common.model import Container, ContainerKind, Job
from gpurm.rm.state.amlaunch import AMLauncher
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.containers import ContainerIndex
from gpurm.rm.state.heartbeats import META_KEY as BEAT_META_KEY
from gpurm.rm.state.queuebook import QueueBook


def load(jobs: Iterable[Job], containers: Iterable[Container], nodes: Iterable[Node], now: float,
         into_jobs: dict[str, Job], submit_ids: dict[str, str], index: ContainerIndex, cluster: Cluster) -> None:
    """The records, and the GPUs their live containers hold."""
    for job in jobs:
        into_jobs[job.job_id] = job
        if job.submit_id:
            submit_ids[job.submit_id] = job.job_id
    index.load(containers)
    for node in nodes:
        node.last_heartbeat = now
        node.session = ""
        node.allocated = {}          # rebuilt below from the live containers
        node.shared = {}
        cluster.upsert(node)
    for c in index.live.values():
        if c.node_id in cluster.nodes:
            cluster.hold(c.node_id, c.gpu_indices, c.container_id, c.share_milli)


def readmit(jobs: dict[str, Job], live: dict[str, Container], ams: AMLauncher, am_up: Callable[[Job], None]) -> None:
    """Each unfinished job either has a live AM container (`am_up`) or waits for a new AM."""
    for job in jobs.values():
        if job.state.terminal:
            continue
        if job.am_container and job.am_container in live:
            am_up(job)
        else:
            job.am_container = ""
            ams.want(job)


def stored_interval(meta: dict[str, str]) -> float:
    """The heartbeat interval the previous RM last named (0: none stored, or not a number)."""
    try:
        value = float(meta.get(BEAT_META_KEY, "0"))
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def counters(meta: dict[str, str]) -> tuple[int, int]:
    """(next job sequence, next container sequence) as stored."""
    return int(meta.get("next_job_seq", "1")), int(meta.get("next_container_seq", "1"))


def rebuild_queue_book(book: QueueBook, jobs: dict[str, Job], containers: dict[str, Container]) -> None:
    """Derive usage, demand and admissions from the records (after a restore or a config change)."""
    for job in jobs.values():
        if job.state.terminal:
            continue
        book.want(job.queue, job.spec.gpu_amount)
        if job.admitted:
            book.activate(job.queue, 1)
    for c in containers.values():
        owner = jobs.get(c.job_id)
        if c.phase.live and c.kind is ContainerKind.LEARNER and owner is not None:
            book.charge(owner.queue, owner.user, c.amount)
    book.invalidate()
