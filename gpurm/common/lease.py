"""The fence's timing: an agent's lease from the RM, and the rule that keeps two attempts of a job from running at once.

An agent holds a lease as long as the RM answers it: every heartbeat reply (and every registration) renews it from
the moment the agent *sent* the beat it answers. An agent whose lease runs out stops every container (TERM, KILL
after `grace`) and starts none until it registers again (nodeagent/fence.py). The RM may declare the node LOST (and
its jobs restart elsewhere) only `expiry = interval x missed_beats` after the last beat it *received*, which came
after the agent sent it. So when `expiry >= lease + grace + margin`, every process of the node is gone before the
RM may count it lost; the margin covers one late beat and the event loops' lag. rm.yaml is refused at load when it
is not so. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_FENCE_GRACE_S = 2.0   # TERM, then KILL this long after, for the containers the fence stops
MARGIN_FIXED_S = 0.5          # on top of one heartbeat interval: event loop lag, the kill's own latency
MIN_WAIT_S = 1.0              # the least an agent waits on an RM's answer before it tries the next
MIN_LEASE_BEATS = 2           # a lease shorter than two intervals would fence on one late beat


@dataclass(frozen=True)
class FenceTiming:
    interval_s: float
    expiry_s: float     # interval x missed_beats: the RM calls a silent node LOST after this
    lease_s: float      # an agent with no answer from the RM this long stops its containers
    grace_s: float      # ... TERM, then KILL after this

    @property
    def margin_s(self) -> float:
        return self.interval_s + MARGIN_FIXED_S

    @property
    def fenced_by_s(self) -> float:
        """The latest moment, after the last beat the RM answered, by which the fence has stopped everything."""
        return self.lease_s + self.grace_s + self.margin_s

    def problems(self) -> list[tuple[str, str]]:
        """(rm.yaml heartbeat key, why) for every rule this timing breaks; empty when it is safe."""
        out: list[tuple[str, str]] = []
        if self.grace_s < 0:
            out.append(("fence_grace", f"must be 0 or more, got {self.grace_s:g}s"))
        shortest = MIN_LEASE_BEATS * self.interval_s
        if self.lease_s < shortest:
            out.append(("lease", f"the agents' lease ({self.lease_s:g}s) must be at least two heartbeat intervals "
                                 f"({shortest:g}s), or one late beat stops every container; raise "
                                 "heartbeat.missed_beats (or set heartbeat.lease)"))
        elif self.expiry_s < self.fenced_by_s:
            beats = beats_for_lease(self.lease_s, self.interval_s, self.grace_s)
            out.append(("missed_beats", f"the node expiry (interval x missed_beats = {self.expiry_s:g}s) must be "
                                        f"at least the agents' lease ({self.lease_s:g}s) + fence_grace "
                                        f"({self.grace_s:g}s) + a margin of one interval + {MARGIN_FIXED_S:g}s "
                                        f"= {self.fenced_by_s:g}s, so that a server cut off from the RM has "
                                        "stopped its learners before the RM calls it LOST and starts them "
                                        f"elsewhere; set missed_beats to {beats} or more, or shorten "
                                        "heartbeat.lease"))
        return out


def fence_timing(interval_s: float, missed_beats: int, lease_s: float = 0.0,
                 grace_s: float = DEFAULT_FENCE_GRACE_S) -> FenceTiming:
    """The timing rm.yaml's heartbeat section gives; `lease_s` 0 means the longest safe lease (expiry less the
    grace and the margin)."""
    expiry = interval_s * missed_beats
    timing = FenceTiming(interval_s, expiry, lease_s, grace_s)
    if lease_s <= 0:
        timing = FenceTiming(interval_s, expiry, round(max(0.0, expiry - grace_s - timing.margin_s), 3), grace_s)
    return timing


def agent_wait_s(lease_s: float, interval_s: float, default_s: float) -> float:
    """How long an agent waits on a silent RM (a beat's reply, a registration) before it tries the next one:
    `default_s`, but at most a quarter of its lease (never under two intervals or a second: one slow answer must
    not break a session), so that when a leader stops the agent has time to find the next before its fence stops
    every container."""
    if lease_s <= 0:
        return default_s
    return min(default_s, max(2 * interval_s, MIN_WAIT_S, lease_s / 4))


def takeover_lease_s(takeover_s: float, interval_s: float) -> float:
    """The shortest agents' lease that outlasts an RM takeover (rm.yaml `ha:`). The new leader serves at most
    `takeover_s` after the old one's last renewal, and the agent's last renewal is at most an interval older; the
    agent needs up to a quarter lease to see the silence (`agent_wait_s`), a quarter more when it was just dialling
    the old leader again, and an interval to register: L >= takeover + 2 intervals + L/2, with what is left over
    for the new leader to load its state."""
    return 2 * (takeover_s + 2 * interval_s)


def beats_for_lease(lease_s: float, interval_s: float, grace_s: float) -> int:
    """The fewest missed_beats whose expiry lets the agents hold `lease_s` (expiry >= lease + grace + margin:
    `FenceTiming.fenced_by_s`)."""
    return int(-(-FenceTiming(interval_s, 0.0, lease_s, grace_s).fenced_by_s // interval_s))


class Lease:
    """The agent's side: until when it may run containers. Times are the agent's monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.lease_s = 0.0               # 0: the RM gave no lease (an older RM): never expires
        self.grace_s = DEFAULT_FENCE_GRACE_S
        self.expires_at: float | None = None   # None: never held one (nothing to fence yet)

    def set_terms(self, lease_s: float, grace_s: float) -> None:
        self.lease_s = max(0.0, lease_s)
        self.grace_s = max(0.0, grace_s)
        if self.lease_s == 0:
            self.expires_at = None

    def renew(self, sent_at: float) -> None:
        """The RM answered what the agent sent at `sent_at`."""
        if self.lease_s <= 0:
            return
        until = sent_at + self.lease_s
        if self.expires_at is None or until > self.expires_at:
            self.expires_at = until

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def left(self, now: float) -> float | None:
        """Seconds until it runs out (0 when it has); None when there is none to run out."""
        return None if self.expires_at is None else max(0.0, self.expires_at - now)
