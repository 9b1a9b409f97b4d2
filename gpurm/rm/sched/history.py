"""What finished jobs teach the scheduler: the distribution of job sizes and run times, learned from the jobs this
RM (or the simulator) saw end, grouped by what predicts them. Pure: no clock, no I/O.

Every job that ends on its own (succeeded or failed; a killed job's size is cut short) adds a `Finished` record: its
queue, user, name, GPUs and its size (attained GPU-seconds). From those:

- `gittins.index_table` per group: the 2D-Gittins policy ranks a job by its own group's index (rm/sched/priority.py);
- run-time estimates: how much longer a job that has run `a` seconds will run (the mean or a quantile of D - a over
  its group's run times D > a), for reservations and backfill (rm/sched/reservations.py) and forecasts.

Groups. A job belongs to one group per `Conditioning` level, most specific first (default: its user and job name,
then its queue and GPU count, then its GPU count, then all jobs). A question about a job is answered from the most
specific of its groups that holds at least `min_group` finished jobs, so a team's own history wins where there is
enough of it and the whole cluster's speaks otherwise. `Conditioning.NONE` keeps one group: Tiresias' setting.

A prior (rm.yaml `scheduler.history.prior`, `gpurm sim --history-prior`) is a trace of earlier jobs learned before
the first real one, so that a fresh RM ranks and estimates from day one instead of falling back to `las`; the real
jobs outweigh it as they come. The learned records survive an RM restart: the store keeps them (the `finished`
table's rows and the finished jobs still in memory), and `RMCore.restore` relearns them in finish order.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpurm.rm.sched import gittins

MIN_GROUP = 50                 # finished jobs a group needs before it answers (the global group: MIN_FINISHED)
REBUILD_GROWTH = gittins.REBUILD_GROWTH


@dataclass(frozen=True)
class Finished:
    """What one finished job teaches: who ran it, how big it was, how much it attained."""

    queue: str = ""
    user: str = ""
    name: str = ""
    gpus: float = 1.0
    size_gpu_s: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.size_gpu_s / max(self.gpus, 1e-3)


@dataclass(frozen=True)
class Features:
    """What a job's group is decided by (the same fields as `Finished`, without the outcome)."""

    queue: str = ""
    user: str = ""
    name: str = ""
    gpus: float = 1.0


def gpu_class(gpus: float) -> str:
    """GPU counts grouped as the reports do: 1, 2-4, 5-8, 9-16, 17+ (below one GPU: a share)."""
    if gpus < 1:
        return "share"
    if gpus <= 1:
        return "1"
    if gpus <= 4:
        return "2-4"
    if gpus <= 8:
        return "5-8"
    return "9-16" if gpus <= 16 else "17+"


# The conditioning levels, most specific first; each names the features its groups are keyed by.
LEVELS: dict[str, tuple[tuple[str, ...], ...]] = {
    "none": ((),),
    "gpus": (("gpus",), ()),
    "queue": (("queue", "gpus"), ("gpus",), ()),
    "full": (("user", "name"), ("queue", "gpus"), ("gpus",), ()),
}
DEFAULT_CONDITIONING = "full"


def group_keys(f: Features | Finished, conditioning: str) -> tuple[tuple[str, ...], ...]:
    """The keys of the groups a job belongs to, most specific first (the last is the whole cluster's)."""
    out = []
    for fields in LEVELS[conditioning]:
        key = [",".join(fields)]
        for name in fields:
            if name == "gpus":
                key.append(gpu_class(f.gpus))
            else:
                key.append(str(getattr(f, name)))
        out.append(tuple(key))
    return tuple(out)


@dataclass
class Group:
    """One group's run times and sizes (sorted), its Gittins table, and the snapshot of its run times that
    estimates read; the table and the snapshot are rebuilt together, once the group grew by REBUILD_GROWTH (an
    estimate need not move with every job that ends, and a rebuild costs O(n))."""

    durations: list[float] = field(default_factory=list)
    sizes: list[float] = field(default_factory=list)
    table: tuple[float, ...] | None = None
    built_at: int = 0
    snapshot: list[float] = field(default_factory=list)        # `durations` as of the last rebuild
    snapshot_sums: list[float] = field(default_factory=list)   # prefix sums of `snapshot`

    def add(self, duration_s: float, size_gpu_s: float) -> None:
        bisect.insort(self.durations, duration_s)
        bisect.insort(self.sizes, size_gpu_s)

    @property
    def n(self) -> int:
        return len(self.sizes)

    def rebuild_if_grown(self, min_n: int) -> bool:
        """Rebuild the Gittins table (and the estimates' snapshot) once the group is ready and grew by
        REBUILD_GROWTH since the last build."""
        n = self.n
        if n < min_n or (self.table is not None and n - self.built_at < max(1, int(self.built_at * REBUILD_GROWTH))):
            return False
        self.table = gittins.index_table(self.sizes)
        self.snapshot = list(self.durations)
        self.snapshot_sums = list(itertools.accumulate(self.snapshot, initial=0.0))
        self.built_at = n
        return True

    def remaining(self, ran_s: float, quantile: float | None) -> float | None:
        """Run time left for a job that ran `ran_s`: the mean (or `quantile`) of D - ran over the run times D above
        it; None when no job of the group ran that long."""
        durations = self.snapshot
        i = bisect.bisect_right(durations, ran_s)
        alive = len(durations) - i
        if alive <= 0:
            return None
        if quantile is None:
            sums = self.snapshot_sums
            return (sums[-1] - sums[i]) / alive - ran_s
        k = i + min(alive - 1, int(quantile * alive))
        return durations[k] - ran_s


class History:
    """The learned distribution, one `Group` per key; `version` moves whenever a Gittins table was rebuilt."""

    def __init__(self, conditioning: str = DEFAULT_CONDITIONING, min_group: int = MIN_GROUP,
                 min_finished: int = gittins.MIN_FINISHED) -> None:
        if conditioning not in LEVELS:
            raise ValueError(f"conditioning: must be one of {', '.join(LEVELS)}, got {conditioning!r}")
        self.conditioning = conditioning
        self.min_group = min_group
        self.min_finished = min_finished        # the global group's threshold (gittins ranks as las below it)
        self.groups: dict[tuple[str, ...], Group] = {}
        self.version = 0                        # moves whenever any group's table is rebuilt
        self.whole_version = 0                  # moves whenever the whole cluster's table is
        self.learned = 0
        self._keys: dict[Features, tuple[tuple[str, ...], ...]] = {}

    # ------------------------------------------------------------ learning

    def finished(self, record: Finished) -> bool:
        """Learn one finished job; whether the whole cluster's Gittins table was rebuilt. (`version` moves when any
        table was: the ranks of that group's jobs may have moved.)"""
        size = max(0.0, record.size_gpu_s)
        duration = size / max(record.gpus, 1e-3)
        rebuilt = whole = False
        keys = group_keys(record, self.conditioning)
        for key in keys:
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group()
            group.add(duration, size)
            last = key == keys[-1]
            if group.rebuild_if_grown(self.min_finished if last else self.min_group):
                rebuilt = True
                whole = whole or last
        self.learned += 1
        if rebuilt:
            self.version += 1
        if whole:
            self.whole_version += 1
        return whole

    def learn_all(self, records: Iterable[Finished]) -> None:
        for r in records:
            self.finished(r)

    # ------------------------------------------------------------ questions

    def keys(self, f: Features) -> tuple[tuple[str, ...], ...]:
        k = self._keys.get(f)
        if k is None:
            if len(self._keys) > 100_000:
                self._keys.clear()
            k = self._keys[f] = group_keys(f, self.conditioning)
        return k

    def group_for(self, f: Features) -> Group | None:
        """The most specific group of `f` that is ready to answer (None: too little history anywhere)."""
        keys = self.keys(f)
        last = keys[-1]
        for key in keys:
            g = self.groups.get(key)
            if g is not None and g.n >= (self.min_finished if key == last else self.min_group):
                return g
        return None

    @property
    def ready(self) -> bool:
        """Whether the whole cluster's group can rank (gittins is las until then)."""
        g = self.groups.get(group_keys(Features(), self.conditioning)[-1])
        return g is not None and g.table is not None

    def index(self, f: Features, attained_gpu_s: float) -> float:
        """The 2D-Gittins index of a job of `f` that has attained `attained_gpu_s` (0.0 with too little history)."""
        g = self.group_for(f)
        if g is None or g.table is None:
            return 0.0
        return g.table[gittins.bucket(attained_gpu_s)]

    def remaining_s(self, f: Features, ran_s: float, quantile: float | None = None) -> float:
        """How much longer a job of `f` that has run `ran_s` seconds is expected to run: the mean (or `quantile`)
        over its group's run times beyond `ran_s`. A job past every one of them is expected to run as long again
        as it has (at least a minute); with no history at all, an hour."""
        g = self.group_for(f)
        if g is None:
            return max(ran_s, 3600.0)
        left = g.remaining(ran_s, quantile)
        return left if left is not None else max(ran_s, 60.0)

    def sizes(self) -> Sequence[float]:
        """Every learned size (GPU-seconds, sorted): the whole cluster's group."""
        g = self.groups.get(group_keys(Features(), self.conditioning)[-1])
        return g.sizes if g is not None else ()
