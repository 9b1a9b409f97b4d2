"""Heartbeats at fleet scale: the interval the RM names to its agents grows with the fleet, so that the whole fleet
beats at most `heartbeat.max_rate` times a second (as YARN scales the NodeManagers' heartbeat interval and Nomad
its clients' heartbeat TTL with their number); the agents' lease and the LOST expiry follow the interval in force.

- **The interval**: `heartbeat.interval` while the fleet is small; past `max_rate x interval` servers, as long as
  it takes `nodes` servers to beat `max_rate` times a second, rounded up to a step (STEP_S) so that it does not
  change at every registration, and never past `heartbeat.max_interval`. It grows at once; it shrinks only once
  the fleet has been SHRINK_BAND smaller for SHRINK_AFTER_S (a rack that reboots does not make every agent beat
  faster and then slower again).
- **The fence's terms scale with it** (gpurm/common/lease.py): at k = interval / heartbeat.interval, the lease is
  k x the configured one and the expiry is interval x missed_beats. rm.yaml's check holds at every k >= 1 once it
  holds at 1: lease + grace + margin = k(lease + interval) + grace + 0.5 <= k x expiry, because
  expiry - lease - interval >= grace + 0.5 at k = 1.
- **A shorter interval never shortens the expiry at once**: an agent keeps the longer lease until it hears of the
  shorter one, and the last lease it renewed under the old terms runs from a beat it sent before the change; so
  the RM keeps the old (longer) expiry for one old expiry after the change, then applies the new one. The same
  holds across an RM restart: the interval last named is stored (store meta `heartbeat_interval_s`) and its
  expiry held for one expiry after the restart.
- **An agent that does not follow** (an older one: its registration does not say `follows_interval`) keeps the
  terms its registration named; its node keeps that expiry (`Node.pinned_expiry_s`).

Pure: the fleet's size and `now` are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpurm.common.lease import fence_timing
from gpurm.rm.state.messages import RMSettings

STEP_S = 0.5            # a paced interval is the base plus a whole number of these
SHRINK_BAND = 0.8       # the interval shrinks only when the fleet's would be at most this fraction of it ...
SHRINK_AFTER_S = 60.0   # ... and has been for this long
META_KEY = "heartbeat_interval_s"   # the interval last named, in the store's meta (held after a restart)


@dataclass(frozen=True)
class BeatTerms:
    """What the RM names to its agents (registration and heartbeat replies) and what it holds them to."""

    interval_s: float
    expiry_s: float     # interval x missed_beats: a node silent this long is LOST
    lease_s: float      # an agent with no answer from the RM this long stops its containers (the fence)
    grace_s: float      # ... TERM, then KILL after this
    interval_ms: int    # the same, for the wire (computed once: every heartbeat reply carries them)
    lease_ms: int
    grace_ms: int


def paced_interval(base_s: float, nodes: int, max_rate: float, max_interval_s: float) -> float:
    """The heartbeat interval for a fleet of `nodes` servers: `base_s`, or as long as it takes them to beat
    `max_rate` times a second, in steps of STEP_S, at most `max_interval_s` (never below `base_s`); `max_rate` 0:
    always `base_s`."""
    if max_rate <= 0 or base_s <= 0:
        return base_s
    want = nodes / max_rate
    if want <= base_s:
        return base_s
    stepped = base_s + math.ceil((want - base_s) / STEP_S - 1e-9) * STEP_S
    return round(min(max(max_interval_s, base_s), stepped), 6)


def terms_at(settings: RMSettings, interval_s: float) -> BeatTerms:
    """The fence's terms at `interval_s`: rm.yaml's (interval, lease, grace) scaled by interval / base."""
    base = fence_timing(settings.heartbeat_interval_s, settings.missed_beats, settings.agent_lease_s,
                        settings.fence_grace_s)
    k = interval_s / settings.heartbeat_interval_s if settings.heartbeat_interval_s > 0 else 1.0
    lease = round(base.lease_s * k, 3)
    return BeatTerms(interval_s, interval_s * settings.missed_beats, lease, base.grace_s,
                     _ms(interval_s), _ms(lease), _ms(base.grace_s))


def _ms(seconds: float) -> int:
    return round(min(seconds, 1e12) * 1000)


class BeatPacing:
    """The interval in force, when it last changed, and the longer expiry held after it shrank."""

    def __init__(self, settings: RMSettings) -> None:
        self.settings = settings
        self.terms = terms_at(settings, settings.heartbeat_interval_s)
        self._held_expiry_s = 0.0          # a longer expiry agents may still hold leases under ...
        self._held_until = float("-inf")   # ... until then
        self._small_since: float | None = None   # since when the fleet wants a (much) shorter interval

    @property
    def shrinking(self) -> bool:
        """Whether the fleet wants a shorter interval and waits out SHRINK_AFTER_S (update() is due each tick)."""
        return self._small_since is not None

    def want(self, nodes: int) -> float:
        s = self.settings
        return paced_interval(s.heartbeat_interval_s, nodes, s.heartbeat_max_rate, s.heartbeat_max_interval_s)

    def update(self, nodes: int, now: float) -> bool:
        """Follow the fleet's size (servers not LOST or decommissioned); whether the interval changed."""
        want = self.want(nodes)
        current = self.terms.interval_s
        if want > current:
            self._set(want, now)
            return True
        if want <= current * SHRINK_BAND:
            if self._small_since is None:
                self._small_since = now
            if now - self._small_since >= SHRINK_AFTER_S:
                self._set(want, now)
                return True
        else:
            self._small_since = None
        return False

    def restore(self, interval_s: float, now: float) -> None:
        """After a restart: the interval the previous RM last named. Agents may hold leases under it, so its
        expiry holds for one expiry from `now` when it was longer than the one in force."""
        if interval_s > self.terms.interval_s:
            self._hold(terms_at(self.settings, interval_s).expiry_s, now)

    def expiry_s(self, now: float) -> float:
        """How long a node may be silent before it is LOST, now."""
        if now < self._held_until and self._held_expiry_s > self.terms.expiry_s:
            return self._held_expiry_s
        return self.terms.expiry_s

    def _set(self, interval_s: float, now: float) -> None:
        old = self.terms
        if interval_s < old.interval_s:
            self._hold(old.expiry_s, now)
        self.terms = terms_at(self.settings, interval_s)
        self._small_since = None

    def _hold(self, expiry_s: float, now: float) -> None:
        if now < self._held_until:
            self._held_expiry_s = max(self._held_expiry_s, expiry_s)
            self._held_until = max(self._held_until, now + expiry_s)
        else:
            self._held_expiry_s, self._held_until = expiry_s, now + expiry_s
