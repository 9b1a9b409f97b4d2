"""Tiresias' 2D-Gittins index: priority by attained service (GPU-seconds, both dimensions), weighed against the
distribution of job sizes learned from the jobs this RM saw finish. Pure: no clock.

For a job that has attained `a` GPU-seconds, with S the (unknown) size of a job, the Gittins index is

    G(a) = max over quanta D of  P(S - a <= D | S > a) / E[min(S - a, D) | S > a]

the best chance of finishing within the next D GPU-seconds per GPU-second spent trying. A job with a higher index
runs first (it is likelier to finish soon); with no size known beyond `a` the index is 0 (it ranks last).
The `gittins` policy (rm/sched/priority.py) ranks by the las levels first and by this index inside a level, and preempts
by level alone: the index only orders.

Quantisation (documented, and the same in the daemon and the simulator, which run this same code):
- attained service is bucketed on a doubling scale: [0, 60), [60, 120), [120, 240), ... GPU-seconds
  (`BUCKET_FIRST_GPU_S`, `BUCKET_RATIO`, `BUCKETS`); a job's index is that of its bucket's lower edge, so it
  changes only when its service crosses an edge;
- the quanta D tried are the distances from that edge to every higher edge.
- The tables are learned from the sizes (attained GPU-seconds at the end) of jobs that ended on their own
  (succeeded or failed; a killed job's size is cut short), one per group of similar jobs (rm/sched/history.py).
  Until `MIN_FINISHED` such jobs have finished (or a prior gave as many), no table is ready and `gittins` ranks
  exactly as `las`. A table is rebuilt when its group has grown by `REBUILD_GROWTH` (10%) since the last build, so
  the ranks stay put between builds.
"""

from __future__ import annotations

import bisect
import itertools

BUCKET_FIRST_GPU_S = 60.0      # the first bucket edge above 0: one GPU-minute
BUCKET_RATIO = 2.0             # each edge doubles the previous one
BUCKETS = 32                   # edges up to 60 x 2^30 GPU-s (~2 million GPU-hours): past every real job
MIN_FINISHED = 50              # finished jobs before the index is used (las until then)
REBUILD_GROWTH = 0.1           # rebuild the table when the finished jobs grew by this fraction

EDGES: tuple[float, ...] = (0.0, *(BUCKET_FIRST_GPU_S * BUCKET_RATIO ** k for k in range(BUCKETS - 1)))


def bucket(attained_gpu_s: float) -> int:
    """The bucket a job with this much attained service is in."""
    return max(0, bisect.bisect_right(EDGES, attained_gpu_s) - 1)


def next_edge(attained_gpu_s: float) -> float:
    """Where the job's bucket ends (infinity past the last edge): its index may change there."""
    b = bucket(attained_gpu_s)
    return EDGES[b + 1] if b + 1 < len(EDGES) else float("inf")


def index_table(sizes: list[float]) -> tuple[float, ...]:
    """The Gittins index at each bucket's lower edge, for job sizes `sizes` (GPU-seconds, any order)."""
    s = sorted(sizes)
    sums = list(itertools.accumulate(s, initial=0.0))
    n = len(s)
    out: list[float] = []
    for a in EDGES:
        i = bisect.bisect_right(s, a)               # sizes <= a are done: condition on S > a
        alive = n - i
        if alive == 0:
            out.append(0.0)
            continue
        best = 0.0
        for b in EDGES:
            if b <= a:
                continue
            j = bisect.bisect_right(s, b)           # sizes in (a, b] finish within the quantum b - a
            done = j - i
            # E[min(S - a, b - a); S > a] (times n): those finishing spend S - a, the others the whole quantum.
            spent = (sums[j] - sums[i]) - done * a + (n - j) * (b - a)
            if spent > 0:
                best = max(best, done / spent)
            if j == n:
                break                               # a longer quantum only adds time, never a finish
        out.append(best)
    return tuple(out)
