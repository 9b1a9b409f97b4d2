"""rm/state/resync.py: the agents' re-registration spread grows with the fleet (bounded), and the restart grace is never
shorter than the node expiry and covers the spread."""

from __future__ import annotations

from gpurm.rm.state import resync
from gpurm.rm.state.messages import RMSettings


def test_the_spread_grows_with_the_fleet_within_bounds() -> None:
    assert resync.spread_s(4) < 0.05, "a dev cluster's agents come back at once"
    assert resync.spread_s(10_000) == 10_000 / resync.RESYNC_RATE
    assert resync.spread_s(10_000_000) == resync.MAX_SPREAD_S


def test_the_grace_covers_two_expiries_and_the_spread_and_a_setting_cannot_go_below_one_expiry() -> None:
    s = RMSettings(heartbeat_interval_s=3.0, missed_beats=10)           # expiry 30 s
    assert resync.grace_s(s, 10_000) == 2 * 30 + resync.spread_s(10_000)
    assert resync.grace_s(RMSettings(heartbeat_interval_s=1.0, missed_beats=3), 4) == resync.MIN_GRACE_S
    assert resync.grace_s(RMSettings(heartbeat_interval_s=3.0, missed_beats=10, resync_grace_s=5.0), 10) == 30.0
    assert resync.grace_s(RMSettings(heartbeat_interval_s=3.0, missed_beats=10, resync_grace_s=600.0), 10) == 600.0
