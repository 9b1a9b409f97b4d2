"""How often a running AM calls Allocate: the RM's allocate load stays bounded as the number of AMs grows.

An AM that is acquiring, launching or stopping calls every `am.allocate_interval`; one whose job simply runs calls
4x less often. With thousands of running jobs even that is more than one RM serves (10,000 AMs at 2 s are 5,000
calls a second), so the RM stretches the steady interval to spread the AMs over `am.max_allocate_rate` calls a
second, as Nomad scales its heartbeat TTL with the number of clients. It never stretches past a quarter of the AM
liveness timeout, so a paced AM is never taken for dead.
"""

from __future__ import annotations

STEADY_FACTOR = 4.0      # a running AM with nothing outstanding calls this many times less often than one acquiring


def steady_allocate_interval(base_s: float, live_ams: int, max_rate: float, liveness_s: float) -> float:
    """Seconds a running AM waits between Allocate calls, at least."""
    floor = STEADY_FACTOR * base_s
    spread = live_ams / max_rate if max_rate > 0 else 0.0
    return max(floor, min(spread, liveness_s / 4))
