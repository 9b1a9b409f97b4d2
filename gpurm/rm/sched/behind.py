"""How far behind a waiting job is: its wait against what the one-GPU jobs recently queued. Pure: no clock.

A reservation drains a server, and every GPU it holds idle adds to everyone's queueing; on a busy cluster that cost
is paid for every job. So a job gets one only once it is starving: it has waited `BEHIND` times as long as the
one-GPU jobs recently queued before their first start (at least `FLOOR_S`). The one-GPU jobs set the bar because
they are the jobs locality never holds back: what they wait is what the cluster's load costs everyone, and what a
bigger job waits beyond a multiple of it is what waiting for a whole server cost it (issue 29's measure of
starvation: a size class's mean queueing against the one-GPU jobs', floor 600 s).

"Recently" is an exponentially weighted mean over the last `RECENT` first starts of one-GPU jobs, so the bar
follows the load through a day (a burst of submissions, a quiet night) rather than the whole history's.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_S = 600.0        # the one-GPU jobs' queueing is taken as at least this (below it, nobody starves)
BEHIND = 2.0           # a job is starving past this multiple of it: half the 4x a size class may lag on average,
                       # so that the drain, which takes a server's remaining run times, fits in the other half
MAX_BEHIND = 100.0     # rm.yaml scheduler.reserve_behind's most: beyond, a job starves long before it is reserved for
RECENT = 100           # first starts the mean weighs (its weight halves about every 70)


@dataclass
class Behind:
    """The recent queueing of one-GPU jobs, and whether a job has waited long enough to be starving."""

    behind: float = BEHIND
    floor_s: float = FLOOR_S
    recent: int = RECENT
    mean_s: float = 0.0          # the weighted mean of the one-GPU jobs' recent queueing
    seen: int = 0

    def started(self, gpus: float, queued_s: float) -> None:
        """A job was granted its first gang after queueing `queued_s`; only one-GPU jobs move the bar."""
        if gpus != 1:
            return
        self.seen += 1
        # The first starts weigh equally (a plain mean) until `recent` of them came; then each weighs 1/recent.
        self.mean_s += (max(0.0, queued_s) - self.mean_s) / min(self.seen, self.recent)

    @property
    def bar_s(self) -> float:
        """How long a job waits before it counts as starving."""
        return self.behind * max(self.floor_s, self.mean_s)

    def starving(self, waited_s: float) -> bool:
        return waited_s >= self.bar_s
