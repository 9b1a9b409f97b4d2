"""The live state a forecast replays, as plain records: servers, running and queued jobs, the queue tree, the
scheduler's settings and what the history learned.

Every field is a str, number, tuple or dict of those, and the records are dataclasses of this (interpreted) module:
a snapshot pickles in the pure and the compiled build alike. (The RM's own records are compiled by mypyc in the
real build, and mypyc's frozen dataclasses cannot be unpickled: nothing of them travels to the worker process.)

`take` reads an `RMCore` and is called on the daemon's event loop (and by the simulator between events): it copies,
it computes nothing; the history's groups are copied only when the history learned something since the last take
(`HistoryCache`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpurm.common.jobspec import Placement
from gpurm.common.model import ContainerKind, JobState
from gpurm.queues.tree import Borrowing, Policy, PreemptionSettings, QueueDef, QueueTree
from gpurm.rm.sched.history import Group, History
from gpurm.rm.state.cluster import NodeState
from gpurm.rm.state.core import RMCore


@dataclass(frozen=True)
class SnapNode:
    """A server that offers GPUs: its healthy GPUs (the replay starts it empty and places the running jobs)."""

    node_id: str
    rack: str
    gpus: int


@dataclass(frozen=True)
class SnapJob:
    """A job that has not ended: running (holding its gang) or queued (everything else)."""

    job_id: str
    queue: str                 # the leaf's full path (root.research.nlp)
    user: str
    name: str
    gpus: int
    share_milli: int           # below one GPU: thousandths of a shared GPU (0: whole GPUs)
    seq: int                   # submission order
    submit_time: float
    running: bool
    ran_s: float               # running: seconds its attempt has run; queued: attained / GPUs (a preempted job)
    attained_gpu_s: float      # GPU-seconds served so far, the live attempt's included (las / gittins rank by it)
    placement: str = Placement.PACK.value
    # Its locality settings (timeout_s, backoff_base_s, backoff_max_s, start level, mode); () = the defaults.
    locality: tuple[float, float, float, int, str] | tuple[()] = ()
    servers: tuple[str, ...] = ()   # running: the servers its learners run on (the replay puts it back there)

    @property
    def gpu_amount(self) -> float:
        return self.share_milli / 1000 if self.share_milli else float(self.gpus)


@dataclass(frozen=True)
class SnapSettings:
    """The scheduler's settings the replay needs (RMSettings' and the simulator's policy override)."""

    policy_override: str | None = None
    inqueue_min_run_s: float = 300.0
    las_thresholds_gpu_s: tuple[float, ...] = ()
    reservations: int = 0
    reserve_after_s: float = 0.0
    history_by: str = "full"
    reserve_behind: float = 0.0
    behind_mean_s: float = 0.0            # the one-GPU jobs' recent queueing (rm/sched/behind.py) and how many
    behind_seen: int = 0


# One history group: its key, its run times and its sizes (both sorted).
HistoryGroup = tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class Snapshot:
    now: float
    nodes: tuple[SnapNode, ...]
    jobs: tuple[SnapJob, ...]
    tree: dict[str, Any]                   # tree_to_plain
    settings: SnapSettings
    history: tuple[HistoryGroup, ...] = ()
    history_learned: int = 0

    def queued(self) -> list[SnapJob]:
        return [j for j in self.jobs if not j.running]


# ------------------------------------------------------------------ the queue tree as plain data

def _queue_plain(q: QueueDef) -> dict[str, Any]:
    p = q.preemption
    return {"name": q.name, "path": q.path, "weight": q.weight, "min_gpus": q.min_gpus, "max_gpus": q.max_gpus,
            "max_running_jobs": q.max_running_jobs, "max_gpus_per_user": q.max_gpus_per_user,
            "preemptible": q.preemptible, "policy": q.policy.value if q.policy is not None else None,
            "preemption": (p.min_share_timeout_s, p.fair_share_timeout_s, p.fair_share_threshold, p.grace_s),
            "children": [_queue_plain(c) for c in q.children]}


def _queue_from(d: dict[str, Any]) -> QueueDef:
    mst, fst, thr, grace = d["preemption"]
    return QueueDef(d["name"], d["path"], weight=d["weight"], min_gpus=d["min_gpus"], max_gpus=d["max_gpus"],
                    max_running_jobs=d["max_running_jobs"], max_gpus_per_user=d["max_gpus_per_user"],
                    submit_acl=["*"] if d["path"] == "root" else None, preemptible=d["preemptible"],
                    policy=Policy(d["policy"]) if d["policy"] is not None else None,
                    preemption=PreemptionSettings(mst, fst, thr, grace),
                    children=[_queue_from(c) for c in d["children"]])


def tree_to_plain(tree: QueueTree) -> dict[str, Any]:
    """What the replay needs of a queue tree (ACLs aside: the replay submits as the jobs' own users, unchecked)."""
    p = tree.preemption
    return {"root": _queue_plain(tree.root), "borrowing": tree.borrowing.value,
            "preemption": (p.min_share_timeout_s, p.fair_share_timeout_s, p.fair_share_threshold, p.grace_s)}


def tree_from_plain(d: dict[str, Any]) -> QueueTree:
    mst, fst, thr, grace = d["preemption"]
    return QueueTree(_queue_from(d["root"]), preemption=PreemptionSettings(mst, fst, thr, grace),
                     borrowing=Borrowing(d["borrowing"]))


# ------------------------------------------------------------------ the history

def export_history(history: History) -> tuple[HistoryGroup, ...]:
    return tuple((key, tuple(g.durations), tuple(g.sizes)) for key, g in history.groups.items())


def fill_history(history: History, groups: tuple[HistoryGroup, ...]) -> None:
    """Load exported groups into a fresh `History` (one made with the same conditioning), tables built."""
    for key, durations, sizes in groups:
        g = history.groups[key] = Group(durations=list(durations), sizes=list(sizes))
        last = len(key) == 1          # the whole cluster's group: the key of no feature
        g.rebuild_if_grown(history.min_finished if last else history.min_group)
        if last:
            history.learned = len(sizes)
    history.version += 1
    history.whole_version += 1


@dataclass
class HistoryCache:
    """The history's groups as last exported: copied again only after the history learned more jobs."""

    learned: int = -1
    groups: tuple[HistoryGroup, ...] = field(default_factory=tuple)

    def groups_of(self, history: History) -> tuple[HistoryGroup, ...]:
        if history.learned != self.learned:
            self.groups = export_history(history)
            self.learned = history.learned
        return self.groups


# ------------------------------------------------------------------ taking a snapshot

def take(core: RMCore, now: float, cache: HistoryCache | None = None) -> Snapshot:
    """The core's state at `now`, as plain records. Cheap: one pass over the jobs that have not ended and the
    live containers of the running ones."""
    nodes = tuple(SnapNode(n.node_id, n.rack, n.healthy_gpus) for n in core.cluster.nodes.values()
                  if n.state is NodeState.RUNNING and not n.drain and n.healthy_gpus > 0)
    jobs: list[SnapJob] = []
    for job in core.jobs.values():
        state = job.state
        if state.terminal:
            continue
        spec = job.spec
        gpus = max(spec.gpus, 1)
        attained = job.attained_gpu_s
        running = state is JobState.RUNNING
        ran_s = attained / gpus
        servers: tuple[str, ...] = ()
        if running:
            learners = [c for c in core.live_by_job.get(job.job_id, {}).values()
                        if c.kind is ContainerKind.LEARNER and c.started > 0]
            started = [c.started for c in learners]
            servers = tuple(sorted({c.node_id for c in learners}))
            if started:
                begun = min(started)
                ran_s = max(0.0, now - begun)
                attained += ran_s * (spec.gpu_amount if spec.gpu_share_milli else gpus)
            else:
                running = False       # RUNNING as its AM reported, but no learner has started: still to place
        loc = spec.locality
        jobs.append(SnapJob(job.job_id, job.queue, job.user, spec.name, gpus, spec.gpu_share_milli, job.seq,
                            job.submit_time, running, ran_s, attained, spec.placement.value,
                            (loc.timeout_s, loc.backoff_base_s, loc.backoff_max_s, int(loc.start_level),
                             loc.mode.value), servers))
    s = core.settings
    override = core.scheduler.policy_override
    settings = SnapSettings(override.value if override is not None else None, s.inqueue_min_run_s,
                            tuple(s.las_thresholds_gpu_s), s.reservations, s.reserve_after_s,
                            core.history.conditioning, s.reserve_behind, core.behind.mean_s, core.behind.seen)
    history = cache.groups_of(core.history) if cache is not None else export_history(core.history)
    return Snapshot(now, nodes, tuple(jobs), tree_to_plain(core.queues.tree), settings, history,
                    core.history.learned)
