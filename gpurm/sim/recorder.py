"""`Recorder`: what a replay records as it goes, for sim/metrics.py to sum up: the allocation timeline (GPUs
held per leaf queue after each settle, and which queues were below their fair share), and every job's
`JobResult` (when it finishes, is refused at submit, or is still unfinished when the events run out)."""

from __future__ import annotations

from gpurm.common.model import JobState
from gpurm.rm.state.core import RMCore
from gpurm.sim.clock import ORIGIN
from gpurm.sim.clusterview import SharedView
from gpurm.sim.metrics import JobResult, Timeline
from gpurm.sim.simam import SimAM
from gpurm.sim.trace import TraceJob


class Recorder:
    def __init__(self, core: RMCore, views: SharedView, timed: bool, leaves: list[str]) -> None:
        self.core = core
        self.views = views
        self.timed = timed              # the `placement` run-time model: run_s and slowdowns were measured
        self.results: list[JobResult] = []
        self.rejected: list[str] = []
        self.timeline = Timeline(times=[], allocated=[], per_queue={q: [] for q in leaves})
        self._last_used: tuple[float, ...] | None = None

    def record_usage(self, now: float) -> None:
        """After a settle: which queues wait below their share, and each leaf's GPUs when they changed."""
        book = self.core.queues
        shares = book.shares(self.core.cluster.capacity)
        self.timeline.mark_below(now - ORIGIN, book.waiting(shares), book.below_guarantee(shares))
        used = book.used
        leaves = list(self.timeline.per_queue)
        snapshot = tuple(used.get(q, 0) for q in leaves)
        if snapshot == self._last_used:
            return
        self._last_used = snapshot
        self.timeline.times.append(now - ORIGIN)
        self.timeline.allocated.append(sum(snapshot))
        for q, v in zip(leaves, snapshot, strict=True):
            self.timeline.per_queue[q].append(v)

    def rejected_at_submit(self, tj: TraceJob) -> None:
        """The queue config refused the job: it never runs."""
        self.rejected.append(tj.job_id)
        self.results.append(JobResult(tj.job_id, tj.queue, tj.gpus, tj.submit_s, None, None, tj.duration_s,
                                      0, 0, 0, 0, 0, 0.0, "REJECTED"))

    def finished(self, am: SimAM, now: float) -> None:
        self.results.append(self.result(am, now))

    def result(self, am: SimAM, now: float | None) -> JobResult:
        """The job's row as the RM's records and the AM's run have it; `now` None: it did not finish."""
        job = self.core.jobs[am.job_id]
        attempts = job.attempts
        last = attempts[-1] if attempts else None
        preemptions = sum(1 for a in attempts if a.failure.name == "PREEMPTED")
        retries = sum(1 for a in attempts if a.counts_as_failure) - (1 if job.state is JobState.FAILED else 0)
        view = self.views.current()
        return JobResult(
            job_id=am.trace.job_id, queue=am.trace.queue, gpus=am.trace.gpus, submit_s=am.trace.submit_s,
            start_s=None if am.first_start is None else am.first_start - ORIGIN,
            finish_s=None if now is None else now - ORIGIN, duration_s=am.trace.duration_s, attempts=len(attempts),
            preemptions=preemptions, retries=max(0, retries),
            servers=len(last.learners) if last is not None and last.learners else 0,
            fewest_servers=view.fewest_servers(am.trace.gpus), gpu_seconds_served=job.attained_gpu_s,
            state=job.state.name if now is not None else "UNFINISHED", sensitivity=am.sensitivity,
            run_s=am.run_s if self.timed else am.progress_s,
            slowdown=am.slow_s / am.run_s if self.timed and am.run_s > 0 else 1.0,
            lost_preemption_gpu_s=am.lost_preemption_gpu_s, lost_failure_gpu_s=am.lost_failure_gpu_s)

    def unfinished(self, ams: dict[str, SimAM], pending: dict[str, TraceJob]) -> None:
        """The events ran out: rows for the jobs whose AMs still live, and for those still waiting for one."""
        for am in list(ams.values()):
            if not am.done:
                self.results.append(self.result(am, None))
        for tj in pending.values():
            self.results.append(JobResult(tj.job_id, tj.queue, tj.gpus, tj.submit_s, None, None, tj.duration_s, 0, 0,
                                          0, 0, 0, 0.0, "UNFINISHED"))
