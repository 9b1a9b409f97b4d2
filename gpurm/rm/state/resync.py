"""Work-preserving restart at fleet scale: how agents spread their re-registrations after an RM restart, and how
long the restarted RM waits for them before it declares any node LOST (as YARN's RM waits for NodeManagers to
resync). Pure functions of the settings and the fleet's size; the core and the shell apply them.
"""

from __future__ import annotations

from gpurm.rm.state.messages import RMSettings

RESYNC_RATE = 300.0      # registrations per second the agents' spread aims at (the RM beats for the others meanwhile)
MIN_SPREAD_S = 0.0
MAX_SPREAD_S = 60.0
MIN_GRACE_S = 60.0


def spread_s(nodes: int) -> float:
    """How long an agent may wait (uniformly at random) before registering again after its stream broke, so
    that `nodes` agents come back over a span the RM absorbs instead of all in the same instant."""
    return min(MAX_SPREAD_S, max(MIN_SPREAD_S, nodes / RESYNC_RATE))


def grace_s(settings: RMSettings, nodes: int, expiry_s: float = 0.0) -> float:
    """How long after a restart a node the RM knew may take to register again before it is LOST: never less
    than the node expiry (`expiry_s`, the one in force for the fleet's heartbeat interval, rm/state/heartbeats.py;
    0: the configured interval's); by default two expiries plus the agents' spread, and at least a minute
    (`heartbeat.resync_grace` in rm.yaml sets it)."""
    expiry = expiry_s or settings.heartbeat_interval_s * settings.missed_beats
    if settings.resync_grace_s > 0:
        return max(settings.resync_grace_s, expiry)
    return max(MIN_GRACE_S, 2 * expiry + spread_s(nodes))
