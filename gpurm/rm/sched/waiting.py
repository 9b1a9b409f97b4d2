"""Who waits for GPUs, in the order the scheduler serves them. Pure bookkeeping: the core says who waits and at
which rank; the backfill walk (rm/sched/backfill.py) reads the order.

A job waits while its AM is registered and its gang does not run (its state is ALLOCATING): it plans, asks, backs
off, or sleeps until the RM says GPUs wait for it. Per leaf queue its jobs are kept in the queue's policy order
(fifo: submit order; las / gittins / srtf: their rank while running nothing, which only the starvation guard
changes: `due` returns the jobs whose promotion came due, for the core to rank again).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from gpurm.rm.state.sortedkeys import SortedKeys

Rank = tuple[float, float, int]
Entry = tuple[Rank, str]          # (rank, job id): the order inside a leaf


class WaitingBook:
    def __init__(self) -> None:
        self.by_leaf: dict[str, SortedKeys[Entry]] = {}
        self.entry: dict[str, tuple[str, Entry]] = {}      # job id -> (leaf, its entry)
        self._starving: list[tuple[float, str]] = []        # heap: (when the starvation guard promotes it, job id)
        self.version = 0                                    # moves with every change

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.entry

    def __len__(self) -> int:
        return len(self.entry)

    def put(self, job_id: str, leaf: str, rank: Rank, starve_at: float) -> None:
        """The job waits in `leaf` at `rank` (until `starve_at`, when it ranks as starved); a no-op when it waits
        there at that rank already."""
        old = self.entry.get(job_id)
        entry = (rank, job_id)
        if old is not None and old == (leaf, entry):
            return
        if old is not None:
            self._drop(job_id, old)
        self.by_leaf.setdefault(leaf, SortedKeys()).add(entry)
        self.entry[job_id] = (leaf, entry)
        if starve_at != float("inf"):
            heapq.heappush(self._starving, (starve_at, job_id))
        self.version += 1

    def discard(self, job_id: str) -> None:
        old = self.entry.get(job_id)
        if old is not None:
            self._drop(job_id, old)
            self.version += 1

    def _drop(self, job_id: str, old: tuple[str, Entry]) -> None:
        leaf, entry = old
        members = self.by_leaf[leaf]
        members.discard(entry)
        if not members:
            del self.by_leaf[leaf]
        del self.entry[job_id]

    def due(self, now: float) -> list[str]:
        """Waiting jobs whose starvation promotion came due by `now` (each once)."""
        out = []
        heap = self._starving
        while heap and heap[0][0] <= now:
            _, job_id = heapq.heappop(heap)
            if job_id in self.entry:
                out.append(job_id)
        return out

    def next_due(self) -> float | None:
        """When the next starvation promotion comes due (None: none can)."""
        heap = self._starving
        while heap and heap[0][1] not in self.entry:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def leaves(self) -> list[str]:
        return list(self.by_leaf)

    def in_order(self, leaf: str, limit: int) -> Iterator[str]:
        """The first `limit` waiting jobs of a leaf, best ranked first."""
        members = self.by_leaf.get(leaf)
        if members is None:
            return
        for _, job_id in members.head(limit):
            yield job_id
