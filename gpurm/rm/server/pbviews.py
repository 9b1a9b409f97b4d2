"""The protobuf views the RM answers with: a job (with env values hidden from those who may not see them), the
cluster view, the queue table. Pure functions of the core's records and `now`; the daemon calls them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from gpurm.common.model import Job, JobState
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.forecast.records import Forecast
from gpurm.rm.server import convert, paging
from gpurm.rm.state import views
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import ErrorCode, RequestError
from gpurm.rm.state.planview import reserved_server

HIDDEN = "(hidden)"        # an env value shown to someone who is not the job's owner or an admin

# A waiting job's start forecast, if any (rm/forecast/worker.py: Forecaster.get), and its horizon.
Forecasts = tuple[Callable[[str], Forecast | None], float]


def forecast_to_pb(f: Forecast, horizon_s: float) -> pb.StartForecast:
    """A forecast in Unix milliseconds; 0 for a time beyond the horizon."""
    return pb.StartForecast(made_ms=convert.ms(f.made_at), earliest_ms=convert.ms(f.earliest or 0.0),
                            likely_ms=convert.ms(f.likely or 0.0), latest_ms=convert.ms(f.latest or 0.0),
                            horizon_ms=int(horizon_s * 1000))


def _set_forecast(msg: pb.Job, record: Job, forecasts: Forecasts | None) -> None:
    if forecasts is None or record.state not in (JobState.QUEUED, JobState.ALLOCATING):
        return
    get, horizon_s = forecasts
    f = get(record.job_id)
    if f is not None:
        msg.forecast.CopyFrom(forecast_to_pb(f, horizon_s))


def cluster_view(core: RMCore, epoch: int, now: float) -> pb.ClusterView:
    nodes = sorted(core.cluster.nodes.values(), key=lambda n: n.node_id)
    return pb.ClusterView(version=core.cluster.version, time_ms=convert.ms(now), epoch=epoch,
                          nodes=[convert.node_view_to_pb(n, core.elastic.reclaimable(n.node_id),
                                                         reserved_server(n, core.elastic, core.reservations))
                                 for n in nodes])


def job(core: RMCore, record: Job, usage: Mapping[str, str], *, full: bool = True,
        preemptible_jobs: set[str] | None = None, private: bool = True,
        rightsize: Mapping[str, str] | None = None,
        waiting: tuple[bool, int, dict[str, int]] | None = None, forecasts: Forecasts | None = None) -> pb.Job:
    """`private`: whether the asker may see env values (else each shows as HIDDEN). `full`: every attempt's
    learners (else only the last attempt's). `usage`: the latest usage summary by container id; `rightsize`: the
    latest phase summary by container id; `waiting`: an `ams.wait_context()` shared by a listing."""
    live = core.job_containers(record.job_id)
    if preemptible_jobs is None and not record.state.terminal:
        preemptible_jobs = core.preemptible_jobs()
    preemptible = record.job_id in (preemptible_jobs or set())
    msg = convert.job_to_pb(record, gpus_held=sum(c.gpus for c in live), live_containers=len(live),
                            preemptible=preemptible)
    msg.waiting_reason = views.why_waiting(record, core.ams, core.apps, waiting)
    _set_forecast(msg, record, forecasts)
    if not record.state.terminal:
        msg.waiting_reason = views.with_notes(msg.waiting_reason, live)   # e.g. its learners' images being pulled
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


def job_list(core: RMCore, records: Sequence[Job], usage: Mapping[str, str], may_see: Callable[[Job], bool],
             forecasts: Forecasts | None = None) -> list[pb.Job]:
    """A page of jobs as ListJobs shows them (the last attempt's learners only). What each job's view reads of
    the whole cluster (which jobs run on borrowed GPUs, the AM launcher's counts) is computed once per page, and
    only when a job on the page needs it: a page costs O(page), not O(page x jobs)."""
    live = [r for r in records if not r.state.terminal]
    flagged = core.preemptible_jobs() if any(core.live_count(r.job_id) for r in live) else set()
    waiting = core.ams.wait_context() if any(r.job_id not in core.ams.with_am for r in live) else None
    return [job(core, r, usage, full=False, preemptible_jobs=flagged, private=may_see(r), waiting=waiting,
                forecasts=forecasts) for r in records]


def queues(core: RMCore, size: int = 0, after: str | None = None, now: float = 0.0) -> pb.ListQueuesResponse:
    """The queue table in tree order: `size` queues (0: all) after the queue `after` (None: from the root)."""
    capacity = core.cluster.capacity
    book = core.queues
    shares = book.shares(capacity)
    stats = views.queue_stats_of(views.unfinished(core.jobs, core.ams), book.tree)   # O(unfinished jobs)
    walk = list(book.tree.walk())
    start = 0
    if after is not None:
        found = [i for i, q in enumerate(walk) if q.path == after]
        if not found:
            raise RequestError(ErrorCode.FAILED_PRECONDITION,
                               f"page_token: queue {after[:128]} is no longer in the queue tree (the config changed): "
                               "list from the start")
        start = found[0] + 1
    end = len(walk) if size <= 0 else min(len(walk), start + size)
    out = []
    for q in walk[start:end]:
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
            starved_since_ms=convert.ms(since), below_guarantee_s=book.below_guarantee_s.get(q.path, 0.0)))
    more = end < len(walk) and end > start
    by_size = [pb.SizeClassQueueing(size=c.size, started=c.started, mean_s=c.mean_s, p99_s=c.p99_s, waiting=c.waiting,
                                    longest_wait_s=c.longest_wait_s)
               for c in views.queueing_by_size(core.jobs.values(), now)] if after is None else []
    return pb.ListQueuesResponse(queues=out, capacity=capacity, total=len(walk), by_size=by_size,
                                 next_page_token=paging.encode_token(paging.QUEUES, walk[end - 1].path) if more else "",
                                 borrowing=book.tree.borrowing.value, borrowing_preemptions=core.borrow.preemptions)
