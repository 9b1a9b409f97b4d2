"""Relax by expected cost: how long an AM should wait at a locality level, from what the wait costs and what the
locality saves. Pure: views and `now` in, a deadline out.

The rule: wait at a level while the time waited there is below the run time that the level saves over the next
looser one (the ski-rental rule: the total is never more than twice the best choice made in hindsight).

- Saving = the job's expected run time x [its own slowdown at the next level - at this one, plus `others_weight`
  x the same at the mix's mean sensitivity]. The slowdowns are the simulator's run-time model (sim/runtime.py
  `rate`, with its calibrated `RuntimeConfig`: the spread exponent from Philly's 16-GPU jobs on 2 vs 8 servers,
  the rack factor, the network contention per neighbouring multi-server job) applied to the placement a level
  typically gives (`Typical`: servers and racks beyond the fewest, multi-server neighbours), at the job's
  sensitivity. The second term is what relaxing costs the *other* jobs: a spread job adds a neighbour to the
  multi-server jobs on its servers (even an insensitive one slows its sensitive neighbours) and holds its GPUs
  longer while others queue for them. Without it the saving is underestimated: on the Philly window never
  relaxing beat relaxing after the 60 s timeout by a third of the average JCT.
- Optionally (`use_rate`), the expected remaining wait shortens the wait: the GPUs still missing at this level
  (from the view's aggregates: a lower bound) / the rate at which GPUs came free in the views the AM saw
  (`FreeRate`, over `window_s`, once a whole window has been watched). Off by default: an AM sees views only
  when it has news, so that rate is thin and overestimates the wait (measured: docs/sim.md, "Relax policies").

The last level a job will try (`any`, or a strict job's own) keeps the timeout policy. The AM imports the
simulator's run-time model (pure) on purpose: one calibrated model of what spreading costs, so that the AM judges
a level by the same slowdowns the simulator charges.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpurm.am.placement import View
from gpurm.common.jobspec import LocalityLevel
from gpurm.sim.runtime import RuntimeConfig, rate


@dataclass(frozen=True)
class Typical:
    """The placement a job typically gets at a level looser than `packed` (assumptions, documented in docs/sim.md:
    the planner still takes the fewest servers it can find free, but on a busy cluster the free GPUs are scattered
    over partly used servers)."""

    spread: float = 2.0          # servers per fewest-possible server (capped at one GPU per server)
    extra_racks_any: int = 1     # racks beyond the fewest at `any`
    neighbours: float = 3.0      # other multi-server jobs on its busiest server


TYPICAL = Typical()
# What relaxing costs the other jobs, per second of the job's own slowdown (see the module's docstring). Tuned on
# the Philly window (docs/sim.md, "Relax policies").
OTHERS_WEIGHT = 2.0


def level_slowdown(level: LocalityLevel, gpus: int, fewest: int, sensitivity: float, config: RuntimeConfig,
                   typical: Typical = TYPICAL) -> float:
    """The expected run-time multiplier (1 / rate) of a job of `gpus` GPUs placed at `level`, when its fewest
    possible servers are `fewest`."""
    if level <= LocalityLevel.PACKED or gpus <= 1:
        return 1.0
    servers = max(fewest, min(gpus, math.ceil(fewest * typical.spread)))
    if servers <= 1:
        return 1.0
    racks = 1 + (typical.extra_racks_any if level is LocalityLevel.ANY else 0)
    r = rate(config, sensitivity, servers, fewest, racks, 1, 0)
    contention = 1.0 + config.contention_per_job * sensitivity * typical.neighbours
    return contention / r


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
    """The policy: wait at a level while waited + expected remaining wait < the run time the level saves."""

    expected_runtime_s: float
    sensitivity: float = 1.0             # 0: the job does not care where it runs; 1: fully sensitive (VGG-like)
    config: RuntimeConfig = field(default_factory=RuntimeConfig)   # the run-time model's calibrated constants
    typical: Typical = TYPICAL
    others_weight: float = OTHERS_WEIGHT
    # Whether the expected remaining wait (from the rate GPUs came free) may shorten the wait. Off by default: an
    # AM sees views only when it has news, so its rate is thin and overestimates the wait; on the Philly window
    # it made jobs relax at once and lost to never relaxing (docs/sim.md, "Relax policies").
    use_rate: bool = False

    def saving_s(self, level: LocalityLevel, nxt: LocalityLevel, gpus: int, fewest: int) -> float:
        """Run time (the job's own and, weighted, the others') saved by starting at `level` rather than `nxt`.
        The others' part is weighed at the mix's mean sensitivity: an insensitive job spread over servers still
        slows its sensitive neighbours."""
        def gain(sensitivity: float) -> float:
            return (level_slowdown(nxt, gpus, fewest, sensitivity, self.config, self.typical)
                    - level_slowdown(level, gpus, fewest, sensitivity, self.config, self.typical))
        c = self.config
        mean = c.sensitive_share * c.sensitive_value + (1 - c.sensitive_share) * c.insensitive_value
        return max(0.0, self.expected_runtime_s * (gain(self.sensitivity) + self.others_weight * gain(mean)))

    def deadline(self, level: LocalityLevel, nxt: LocalityLevel, level_since: float, view: View, gpus: int,
                 frees: FreeRate) -> float:
        """When to give the level up: level_since + saving, i.e. wait while the time waited is below what the
        level saves (the ski-rental rule: never more than twice the best choice in hindsight). With `use_rate`
        and a rate watched for a whole window, less the expected remaining wait (at once when the level cannot
        fill in time at that rate)."""
        saving = self.saving_s(level, nxt, gpus, view.fewest_servers(gpus))
        if not self.use_rate or not frees.trusted:
            return level_since + saving
        remaining = expected_wait_s(missing_gpus(view, gpus, level), frees.rate())
        return level_since + max(0.0, saving - remaining)
