"""Where a job stands for the time-ranked policies (las, gittins, srtf): its `priority.Standing`, cached.

Ranking las / srtf jobs is asked for often (every scheduling pass, every in-queue look), so three caches are kept
here, each dropped by the core when what it derives from changes:
- per job, (GPUs, started) of its started live learners (`runs_changed` drops it whenever one of its containers
  starts, is added or ends);
- the Standing of a job that runs nothing, which only changes with its attained service and idle time (keyed on
  those);
- the waiting rank of a job running nothing and the rank of a running one (until the time that rank may worsen).

Pure: the caller passes `now`; the job and container records are the core's (shared dicts, read only here).
"""

from __future__ import annotations

from gpurm.common.model import Container, ContainerKind, Job
from gpurm.queues.tree import Policy
from gpurm.rm.sched import priority
from gpurm.rm.sched.history import Features, History


class Standings:
    def __init__(self, live_by_job: dict[str, dict[str, Container]],
                 las_thresholds: tuple[float, ...] = priority.LAS_THRESHOLDS_GPU_S,
                 history: History | None = None) -> None:
        self.live_by_job = live_by_job     # the core's index: job id -> its live containers
        self.las_thresholds = las_thresholds   # GPU-seconds where a las job drops a level (RMSettings)
        self.history = history if history is not None else History()   # learned from finished jobs (gittins)
        self._features: dict[str, Features] = {}
        self._runs: dict[str, tuple[tuple[int, float], ...]] = {}
        self._idle_standing: dict[str, tuple[tuple[float, float, float, float], priority.Standing]] = {}
        self._idle_rank: dict[str, tuple[Policy, int, priority.Standing, tuple[float, float, int], float]] = {}
        self._run_rank: dict[str, tuple[tuple[tuple[int, float], ...], Policy, int, tuple[float, float], float,
                                        float]] = {}

    def runs_changed(self, job_id: str) -> None:
        """A job's learners came, started or went: its runs, and its waiting rank, are computed afresh."""
        self._runs.pop(job_id, None)
        self._idle_rank.pop(job_id, None)     # its service, idle time or promotion may be about to change

    def forget(self, job_id: str) -> None:
        """The job finished: nothing of it is asked for again."""
        self._idle_standing.pop(job_id, None)
        self._idle_rank.pop(job_id, None)
        self._run_rank.pop(job_id, None)
        self._features.pop(job_id, None)

    def features(self, job: Job) -> Features:
        """What the job's history group is decided by (fixed for a job's life)."""
        f = self._features.get(job.job_id)
        if f is None:
            f = self._features[job.job_id] = Features(job.queue, job.user, job.spec.name, job.spec.gpu_amount)
        return f

    def _runs_of(self, job: Job) -> tuple[tuple[int, float], ...]:
        runs = self._runs.get(job.job_id)
        if runs is None:
            runs = self._runs[job.job_id] = tuple(
                (c.gpus, c.started) for c in self.live_by_job.get(job.job_id, {}).values()
                if c.kind is ContainerKind.LEARNER and c.started)
        return runs

    def running_gpus(self, job: Job) -> int:
        """GPUs the job's started learners hold (cached with its runs)."""
        return sum(g for g, _ in self._runs_of(job))

    def standing(self, job: Job, now: float) -> priority.Standing:
        runs = self._runs.get(job.job_id)
        if runs is None:
            runs = self._runs_of(job)
        if not runs:
            # Running nothing: its standing does not change with the clock (shared; nobody mutates a Standing).
            key = (job.attained_gpu_s, job.idle_since, job.expected_gpu_s, job.las_base_gpu_s)
            cached = self._idle_standing.get(job.job_id)
            if cached is not None and cached[0] == key:
                return cached[1]
            attained = job.attained_gpu_s
            served = attained - job.las_base_gpu_s
            s = priority.Standing(
                job.job_id, job.seq, job.spec.gpus, attained_gpu_s=served,
                executed_s=served / max(job.spec.gpus, 1), waiting_since=job.idle_since,
                remaining_gpu_s=max(0.0, job.expected_gpu_s - attained), running_since=-1.0,
                features=self.features(job))
            self._idle_standing[job.job_id] = (key, s)
            return s
        attained = job.attained_gpu_s + sum(g * (now - started) for g, started in runs)
        served = attained - job.las_base_gpu_s
        return priority.Standing(
            job.job_id, job.seq, job.spec.gpus, attained_gpu_s=served, executed_s=served / max(job.spec.gpus, 1),
            waiting_since=job.idle_since, remaining_gpu_s=max(0.0, job.expected_gpu_s - attained),
            running_since=min(started for _, started in runs), features=self.features(job))

    def _version(self, policy: Policy) -> int:
        """What a cached rank depends on besides the job's runs: for gittins every Gittins table of the history;
        for the others the whole cluster's table alone. Those ranks do not read it: it is when their caches have
        always been dropped, and srtf's cached running ranks (safe bounds, never brought up to date otherwise)
        depend on that refresh: kept fresh at every look instead, the golden srtf replay preempted 4,498 times
        instead of 2,494 and its average JCT rose 19% (remaining times cross each other all the time)."""
        return self.history.version if policy is Policy.GITTINS else self.history.whole_version

    def waiting_rank(self, job: Job, policy: Policy) -> tuple[priority.Standing, tuple[float, float, int], float]:
        """A job running nothing: its Standing, its rank, and when it starts to rank as starved (cached: none of
        them changes until its learners change, which drops the entry)."""
        cached = self._idle_rank.get(job.job_id)
        version = self._version(policy)
        if cached is not None and cached[0] is policy and cached[1] == version:
            return cached[2], cached[3], cached[4]
        s = self.standing(job, 0.0)
        key, starve_at = priority.waiting_rank(policy, s, self.las_thresholds, self.history)
        self._idle_rank[job.job_id] = (policy, version, s, key, starve_at)
        return s, key, starve_at

    def running_rank(self, job: Job, policy: Policy, now: float) -> tuple[tuple[float, float], float, float]:
        """A running job: (its rank as in-queue preemption weighs it (`priority.preempt_rank`), the earliest time
        that may worsen, when its run started; -1 if none started). Cached while its learners stay as they are,
        until that time. (An srtf rank only improves as the job runs, so an older one is a safe bound; see _version
        for when it is refreshed.)"""
        runs = self._runs.get(job.job_id)
        cached = self._run_rank.get(job.job_id)
        version = self._version(policy)
        if cached is not None and runs is not None and cached[0] is runs and cached[1] is policy \
                and cached[2] == version and now < cached[4]:
            return cached[3], cached[4], cached[5]
        s = self.standing(job, now)
        if s.running_since < 0:
            return (0.0, 0.0), float("inf"), -1.0
        k = priority.rank(policy, now, self.las_thresholds, self.history)(s)
        out = (priority.preempt_rank(policy, k),
               priority.rank_changes_at(policy, s, now, self.las_thresholds, self.history), s.running_since)
        self._run_rank[job.job_id] = (self._runs[job.job_id], policy, version, *out)
        return out
