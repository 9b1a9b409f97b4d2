"""Fair shares, YARN FairScheduler style. Pure.

For the children of one queue, find R such that the sum over them of clamp(R x weight, min, max) equals what the
parent has to give (solved exactly over the piecewise-linear sum; YARN bisects). Weight-0 queues take part only
through their minimum; what the weighted queues cannot use (all at their max) is left over and split among the
weight-0 queues. The computation runs
top-down: the root gives the cluster's capacity, each queue gives its share to its children.

- steady share: over every queue (what a queue can count on when everybody wants GPUs);
- instantaneous share: over the queues with demand only (running or pending work); idle queues get 0 and their
  share goes to the active ones.

Integer shares (GPUs): each queue's real share is rounded down and the GPUs left over go one at a time to the
queues with the largest fractional parts (ties: the earlier queue path), never above a queue's max. The integer
shares of a set of siblings therefore sum to exactly what their parent distributes (when their max caps allow),
and each differs from its real share by less than one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class ShareNode:
    """One queue as fair-share math sees it."""

    path: str
    weight: float = 1.0
    min_gpus: int = 0
    max_gpus: int | None = None     # None = unlimited
    children: list[ShareNode] = field(default_factory=list)
    demand: int = 0                 # leaf: GPUs held plus GPUs asked for; parents: computed

    @property
    def leaf(self) -> bool:
        return not self.children


def _cap(n: ShareNode) -> float:
    return math.inf if n.max_gpus is None else float(n.max_gpus)


def compute_real_shares(total: float, nodes: Sequence[ShareNode]) -> list[float]:
    """Real-valued shares of `total` for sibling queues (YARN's computeShares).

    used(R) = sum of clamp(R x weight, min, max) is piecewise linear in R with breakpoints at min/weight and
    max/weight, so R is found exactly by walking the sorted breakpoints (O(n log n)) rather than by bisection.
    """
    if not nodes or total <= 0:
        return [0.0] * len(nodes)
    mins = [float(min(n.min_gpus, _cap(n))) for n in nodes]
    total_min = sum(mins)
    if total_min >= total:
        # Not even the minimums fit: scale them down in proportion.
        return [m * total / total_min if total_min else 0.0 for m in mins]
    r = _solve_r(total, nodes, mins)
    if r is not None:
        return [min(max(r * n.weight, mins[i]), _cap(n)) if n.weight > 0 else mins[i]
                for i, n in enumerate(nodes)]
    # Every weighted queue is at its max: what is left goes to the weight-0 queues, water-filled to their max.
    shares = [(_cap(n) if n.weight > 0 else mins[i]) for i, n in enumerate(nodes)]
    left = total - sum(shares)
    zero = [i for i, n in enumerate(nodes) if n.weight <= 0]
    while left > 1e-9 and zero:
        room = [i for i in zero if shares[i] < _cap(nodes[i]) - 1e-12]
        if not room:
            break
        each = left / len(room)
        for i in room:
            give = min(each, _cap(nodes[i]) - shares[i])
            shares[i] += give
            left -= give
    return shares


def _solve_r(total: float, nodes: Sequence[ShareNode], mins: list[float]) -> float | None:
    """The R at which sum(clamp(R x w, min, max)) reaches `total`, or None if the weighted queues' maxima
    cannot reach it."""
    events: list[tuple[float, float]] = []       # (R, change of slope)
    for i, n in enumerate(nodes):
        if n.weight <= 0:
            continue
        events.append((mins[i] / n.weight, n.weight))        # starts growing with R
        cap = _cap(n)
        if cap != math.inf:
            events.append((cap / n.weight, -n.weight))       # stops at its max
    events.sort()
    r, used, slope = 0.0, sum(mins), 0.0
    for at, delta in events:
        reach = used + slope * (at - r)
        if reach >= total and slope > 0:
            return r + (total - used) / slope
        r, used, slope = at, reach, slope + delta
    if slope > 0:
        return r + (total - used) / slope
    return None


def round_shares(real: Sequence[float], nodes: Sequence[ShareNode], total: int) -> list[int]:
    """Largest-remainder rounding: integer shares summing to min(total, what the caps allow)."""
    floors = [math.floor(x + 1e-9) for x in real]
    target = min(total, round(sum(real)))
    left = target - sum(floors)
    order = sorted(range(len(real)), key=lambda i: (-(real[i] - floors[i]), nodes[i].path))
    for i in order:
        if left <= 0:
            break
        cap = nodes[i].max_gpus
        if cap is None or floors[i] < cap:
            floors[i] += 1
            left -= 1
    return floors


@dataclass
class Shares:
    steady: dict[str, int]
    instantaneous: dict[str, int]
    steady_real: dict[str, float]
    instantaneous_real: dict[str, float]


def _distribute(root: ShareNode, capacity: int, include: Callable[[ShareNode], bool]
                ) -> tuple[dict[str, int], dict[str, float]]:
    ints: dict[str, int] = {root.path: capacity}
    reals: dict[str, float] = {root.path: float(capacity)}
    stack = [root]
    while stack:
        parent = stack.pop()
        if not parent.children:
            continue
        members = [c for c in parent.children if include(c)]
        for c in parent.children:
            if not include(c):
                ints[c.path], reals[c.path] = 0, 0.0
                _zero_below(c, ints, reals)
        give = ints[parent.path]
        real = compute_real_shares(float(give), members)
        rounded = round_shares(real, members, give)
        for c, r, i in zip(members, real, rounded, strict=True):
            reals[c.path] = r
            ints[c.path] = i
            stack.append(c)
    return ints, reals


def _zero_below(node: ShareNode, ints: dict[str, int], reals: dict[str, float]) -> None:
    for c in node.children:
        ints[c.path], reals[c.path] = 0, 0.0
        _zero_below(c, ints, reals)


def active(node: ShareNode) -> bool:
    """A queue has demand if it, or any queue below it, holds or wants GPUs."""
    if node.leaf:
        return node.demand > 0
    return any(active(c) for c in node.children)


def compute_shares(root: ShareNode, capacity: int) -> Shares:
    steady, steady_real = _distribute(root, capacity, lambda n: True)
    inst, inst_real = _distribute(root, capacity, active)
    return Shares(steady, inst, steady_real, inst_real)
