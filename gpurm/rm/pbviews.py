"""The protobuf views the RM answers with: a job (with env values hidden from those who may not see them), the
cluster view, the queue table. Pure functions of the core's records and `now`; the daemon calls them."""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm import convert
from gpurm.rm.core import RMCore
from gpurm.rm.model import Job

HIDDEN = "(hidden)"        # an env value shown to someone who is not the job's owner or an admin


def cluster_view(core: RMCore, epoch: int, now: float) -> pb.ClusterView:
    nodes = sorted(core.cluster.nodes.values(), key=lambda n: n.node_id)
    return pb.ClusterView(version=core.cluster.version, time_ms=convert.ms(now), epoch=epoch,
                          nodes=[convert.node_view_to_pb(n, core.elastic.reclaimable(n.node_id)) for n in nodes])


def job(core: RMCore, record: Job, usage: Mapping[str, str], *, full: bool = True,
        preemptible_jobs: set[str] | None = None, private: bool = True,
        rightsize: Mapping[str, str] | None = None) -> pb.Job:
    """`private`: whether the asker may see env values (else each shows as HIDDEN). `full`: every attempt's
    learners (else only the last attempt's). `usage`: the latest usage summary by container id; `rightsize`: the
    latest phase summary by container id."""
    live = core.job_containers(record.job_id)
    if preemptible_jobs is None and not record.state.terminal:
        preemptible_jobs = core.preemptible_jobs()
    preemptible = record.job_id in (preemptible_jobs or set())
    msg = convert.job_to_pb(record, gpus_held=sum(c.gpus for c in live), live_containers=len(live),
                            preemptible=preemptible)
    msg.waiting_reason = core.why_waiting(record)
    if not private:
        for name in msg.spec.env:
            msg.spec.env[name] = HIDDEN
    if full:
        for attempt in msg.attempts:
            for learner in attempt.learners:
                learner.usage = usage.get(learner.container_id, learner.usage)
                if rightsize:
                    learner.rightsize = rightsize.get(learner.container_id, "")
                if attempt is msg.attempts[-1] and not record.state.terminal:
                    learner.preemptible = preemptible
    else:
        for attempt in msg.attempts[:-1]:
            del attempt.learners[:]
    return msg


def queues(core: RMCore) -> pb.ListQueuesResponse:
    capacity = core.cluster.capacity
    book = core.queues
    shares = book.shares(capacity)
    stats = core.queue_stats()
    out = []
    for q in book.tree.walk():
        running, queued = stats.get(q.path, (0, 0))
        used = book.used.get(q.path, 0)
        starving = book.starvation.get(q.path)
        since = min((t for t in ((starving.min_since, starving.fair_since) if starving else ()) if t), default=0)
        out.append(pb.QueueInfo(
            path=q.path, weight=q.weight, min_gpus=q.min_gpus,
            max_gpus=-1 if q.max_gpus is None else q.max_gpus, steady_share=shares.steady.get(q.path, 0),
            instantaneous_share=shares.instantaneous.get(q.path, 0), used_gpus=math.floor(used), used=used,
            pending_gpus=math.floor(max(0.0, book.demand.get(q.path, 0) - used)),
            pending=max(0.0, book.demand.get(q.path, 0) - used), running_jobs=running, queued_jobs=queued,
            leaf=q.leaf, preemptible=q.effective_preemptible,
            policy=q.effective_policy.value if q.leaf else "",
            max_running_jobs=-1 if q.max_running_jobs is None else q.max_running_jobs,
            starved_since_ms=convert.ms(since)))
    return pb.ListQueuesResponse(queues=out, capacity=capacity)
