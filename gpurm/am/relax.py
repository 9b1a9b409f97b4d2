"""Relax by expected cost: how long an AM should wait at a locality level, from what the wait costs and what the
locality saves. Pure: views and `now` in, a deadline out.

The rule: keep waiting at a level while the expected total wait there is below the run time that the level saves
over the next looser one. Both sides are rough on purpose, and documented:

- Expected wait = time already waited + the GPUs still missing at this level / the rate at which GPUs came free
  in the recent views (`FreeRate`: every increase of a server's free GPUs between two views counts, over the last
  `window_s`). The missing GPUs are measured from the view's aggregates (the emptiest server at `node`, the
  emptiest rack at `packed` / `rack`), so they are a lower bound and the estimate errs towards waiting.
- Saving = the job's expected run time x (slowdown at the next looser level - slowdown at this one), the slowdowns
  from a small table (`SLOWDOWN`). Its default is calibrated from Philly (Jeon et al., ATC'19): a 16-GPU job ran
  at 43.66% GPU utilisation on 2 servers and at 28.56% on 8, so spreading a sensitive job over servers and racks
  costs it up to 43.66 / 28.56 = 1.53x; `rack` (several servers, one switch) takes half of that.

Without enough history (no frees seen for `window_s` yet) the estimate is not trusted and the caller keeps its
timeout policy; the last level a job will try (`any`, or a strict job's own) always keeps it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpurm.am.placement import View
from gpurm.rm.jobspec import LocalityLevel

# Run-time multiplier of a locality-sensitive job placed at each level, relative to its best placement
# (node, packed, rack, any). Source: Philly, ATC'19 (see the module's docstring).
SLOWDOWN: tuple[float, float, float, float] = (1.0, 1.0, 1.265, 1.53)


@dataclass
class FreeRate:
    """GPUs coming free per second, from successive views (their servers' free counts going up)."""

    window_s: float = 600.0
    events: deque[tuple[float, int]] = field(default_factory=deque)   # (when, GPUs freed)
    since: float | None = None           # when the first view was seen
    last: float = 0.0                    # when the latest view was seen

    def observe(self, old: View, new: View, now: float) -> None:
        if self.since is None:
            self.since = now
        self.last = now
        if len(old):
            freed = sum(max(0, n - old.free_on.get(node, n)) for node, n in new.free_on.items())
            if freed:
                self.events.append((now, freed))
        while self.events and self.events[0][0] < now - self.window_s:
            self.events.popleft()

    @property
    def trusted(self) -> bool:
        """Whether a whole window has been watched: before that, a rate of 0 means nothing."""
        return self.since is not None and self.last - self.since >= self.window_s

    def rate(self) -> float:
        """GPUs per second over the window ending at the latest view."""
        start = self.last - self.window_s
        return sum(n for t, n in self.events if t >= start) / self.window_s


def missing_gpus(view: View, gpus: int, level: LocalityLevel) -> int:
    """GPUs that must still come free before a plan at `level` could exist (a lower bound)."""
    if level is LocalityLevel.NODE:
        have = view.max_free
    elif level is LocalityLevel.ANY:
        have = view.total_free
    else:
        have = view.max_domain_free
    return max(0, gpus - have)


def expected_wait_s(missing: int, rate: float) -> float:
    if missing <= 0:
        return 0.0
    return missing / rate if rate > 0 else math.inf


@dataclass(frozen=True)
class CostRelax:
    """The policy: wait at a level while waited + expected remaining wait < expected run time x slowdown saved."""

    expected_runtime_s: float
    slowdown: tuple[float, float, float, float] = SLOWDOWN
    sensitivity: float = 1.0             # 0: the job does not care where it runs; 1: as sensitive as the table

    def saving_s(self, level: LocalityLevel, nxt: LocalityLevel) -> float:
        """Run time the job saves by starting at `level` rather than at `nxt`."""
        gain = self.slowdown[nxt] - self.slowdown[level]
        return max(0.0, self.expected_runtime_s * gain * self.sensitivity)

    def deadline(self, level: LocalityLevel, nxt: LocalityLevel, level_since: float, view: View, gpus: int,
                 rate: float) -> float:
        """When to give the level up: level_since + saving - expected remaining wait (at once when the level
        cannot fill in time at the current rate; never later than the saving itself)."""
        remaining = expected_wait_s(missing_gpus(view, gpus, level), rate)
        return level_since + max(0.0, self.saving_s(level, nxt) - remaining)
