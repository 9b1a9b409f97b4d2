"""The RM's running account of its queues: GPUs used and wanted per queue (kept up to date incrementally),
fair shares (recomputed only when capacity, the set of active queues or the config changes), starvation timers.
Pure."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from gpurm.queues.fairshare import Shares, compute_shares
from gpurm.queues.tree import Policy, QueueDef, QueueTree


@dataclass
class Starvation:
    min_since: float | None = None
    fair_since: float | None = None


class QueueBook:
    def __init__(self, tree: QueueTree) -> None:
        self.tree = tree
        # GPU amounts are floats: a job below one GPU counts by its fraction (see tidy).
        self.used: dict[str, float] = defaultdict(float)      # every queue, ancestors included
        self.demand: dict[str, float] = defaultdict(float)    # GPUs of unfinished jobs, per queue and ancestor
        self.user_used: dict[tuple[str, str], float] = defaultdict(float)   # (leaf, user) -> GPUs
        self.jobs_active: dict[str, int] = defaultdict(int)   # jobs with an AM or GPUs, per queue and ancestor
        self.starvation: dict[str, Starvation] = defaultdict(Starvation)
        self._capacity = -1
        self._shares: Shares | None = None
        self.version = 0                 # bumped on every change of usage, demand, admissions or the tree
        self._waiting: tuple[int, int, set[str]] | None = None
        self._short: tuple[int, int, set[str]] | None = None
        self.ranked = self._ranked()
        # The policy borrowed capacity is ranked by (the tree's `borrowing`); None: `fair` (rm/sched/borrowing.py)
        self.borrowing: Policy | None = tree.borrowing.policy
        # Seconds each leaf used fewer GPUs than min(its demand, its steady share) (`gpurm queues`): the leaves
        # below it since `_under_since`, counted at each scheduling pass (where usage and demand change).
        self.below_guarantee_s: dict[str, float] = {}
        self._under: set[str] = set()
        self._under_since = -1.0

    # -- accounting (the core calls these on every change)
    def charge(self, leaf: str, user: str, gpus: float) -> None:
        """GPUs granted (positive) or freed (negative) to a job of `user` in `leaf`."""
        q = self.tree.by_path.get(leaf)
        self.version += 1
        key = (leaf, user)
        self.user_used[key] = tidy(self.user_used[key] + gpus)
        for a in q.ancestry() if q is not None else ():
            self.used[a.path] = tidy(self.used[a.path] + gpus)

    def want(self, leaf: str, gpus: float) -> None:
        """A job of `gpus` GPUs entered (positive) or left (negative) the queue's demand."""
        q = self.tree.by_path.get(leaf)
        self.version += 1
        before = self.demand.get(leaf, 0) > 0
        for a in q.ancestry() if q is not None else ():
            self.demand[a.path] = tidy(self.demand[a.path] + gpus)
        if (self.demand.get(leaf, 0) > 0) != before:
            self._shares = None            # the set of active queues changed: instantaneous shares move

    def activate(self, leaf: str, delta: int) -> None:
        self.version += 1
        q = self.tree.by_path.get(leaf)
        for a in q.ancestry() if q is not None else ():
            self.jobs_active[a.path] += delta

    # -- shares
    def shares(self, capacity: int) -> Shares:
        """Fair shares, recomputed only when capacity, the set of queues with demand or the tree changed."""
        if self._shares is None or capacity != self._capacity:
            self._capacity = capacity
            leaf_demand = {q.path: math.ceil(self.demand.get(q.path, 0)) for q in self.tree.leaves}
            self._shares = compute_shares(self.tree.share_tree(leaf_demand), capacity)
        return self._shares

    def waiting(self, shares: Shares) -> set[str]:
        """Leaves that want more than they use while below their instantaneous share: while any waits, no
        other queue may go above its share."""
        cached = self._waiting
        if cached is not None and cached[0] == self.version and cached[1] == id(shares):
            return cached[2]
        inst = shares.instantaneous
        waiting = {q.path for q in self.tree.leaves
                   if self.demand.get(q.path, 0) > self.used.get(q.path, 0)
                   and self.used.get(q.path, 0) < inst.get(q.path, 0)}
        self._waiting = (self.version, id(shares), waiting)
        return waiting

    def between(self, shares: Shares) -> dict[str, int]:
        """The share queues are held to between each other: the instantaneous share under `borrowing: fair`; the
        steady share under a borrowing policy, which ranks every GPU beyond it by the policy instead."""
        return shares.instantaneous if self.borrowing is None else shares.steady

    def short(self, shares: Shares) -> set[str]:
        """Leaves that want more than they use while below the share they are held to (`between`): while any
        is, no other queue's incomplete gang may go beyond that share. `waiting` under `borrowing: fair`."""
        if self.borrowing is None:
            return self.waiting(shares)
        cached = self._short
        if cached is not None and cached[0] == self.version and cached[1] == id(shares):
            return cached[2]
        steady = shares.steady
        short = {q.path for q in self.tree.leaves
                 if self.demand.get(q.path, 0) > self.used.get(q.path, 0)
                 and self.used.get(q.path, 0) < steady.get(q.path, 0)}
        self._short = (self.version, id(shares), short)
        return short

    def below_guarantee(self, shares: Shares) -> set[str]:
        """Leaves whose guarantee is unmet: they use less than min(demand, steady share) (DESIGN.md's guarantee:
        a queue gets its steady share back whenever it wants it)."""
        steady = shares.steady
        return {q.path for q in self.tree.leaves
                if self.used.get(q.path, 0) < min(self.demand.get(q.path, 0), steady.get(q.path, 0))}

    def track_guarantees(self, now: float) -> None:
        """Count the time since the last call for the leaves that were below their guarantee, and look again."""
        if self._under_since >= 0:
            span = max(0.0, now - self._under_since)
            for leaf in self._under:
                self.below_guarantee_s[leaf] = self.below_guarantee_s.get(leaf, 0.0) + span
        self._under_since = now
        if self._capacity >= 0 and self._shares is not None:
            self._under = self.below_guarantee(self._shares)

    def _ranked(self) -> bool:
        """Whether some leaf's policy ranks jobs by something that changes over time (las, gittins, srtf)."""
        return any(q.effective_policy.value in ("las", "srtf", "gittins") for q in self.tree.leaves)

    def invalidate(self) -> None:
        self._shares = None
        self.version += 1

    def ratio(self, path: str, capacity: int) -> float:
        """How served a queue is: GPUs used over its instantaneous share (lower = needier)."""
        share = self.shares(capacity).instantaneous.get(path, 0)
        used = self.used.get(path, 0)
        if share <= 0:
            return float("inf") if used else 1e9
        return used / share

    def over_cap(self, leaf: QueueDef, user: str, gpus: float) -> str:
        """Why granting `gpus` more to a job of `user` in `leaf` would break a limit ("" if it would not)."""
        for q in leaf.ancestry():
            if q.max_gpus is not None and self.used.get(q.path, 0) + gpus > q.max_gpus:
                return f"queue {q.short} is at its max_gpus ({q.max_gpus})"
        if leaf.max_gpus_per_user is not None and \
                self.user_used.get((leaf.path, user), 0) + gpus > leaf.max_gpus_per_user:
            return f"{user} is at max_gpus_per_user ({leaf.max_gpus_per_user}) in {leaf.short}"
        return ""

    def replace_tree(self, tree: QueueTree) -> None:
        """Adopt a new config; usage and demand are re-derived by the caller."""
        self.tree = tree
        self.version += 1
        self.ranked = self._ranked()
        self.borrowing = tree.borrowing.policy
        self.used.clear()
        self.demand.clear()
        self.user_used.clear()
        self.jobs_active.clear()
        self.starvation.clear()
        self.invalidate()


def tidy(amount: float) -> float:
    """A GPU amount after a sum: shares are thousandths, so round away the binary fractions' error (0.1 + 0.2 -
    0.3 must be 0, or an idle queue would look active)."""
    return round(amount, 6)
