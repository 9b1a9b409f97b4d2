"""The simulator's virtual clock: the heap of pending events it sleeps along, the kinds of events in it, and
where its time starts (`ORIGIN`). What each event does is the engine's (`Engine.handle`)."""

from __future__ import annotations

import heapq

# Event kinds, in the order they are handled when simultaneous.
FINISH, FAIL, ARRIVE, TIMER, CHECK = range(5)
# The virtual clock the cores see starts here, not at 0: the RM's records use 0.0 for "never" (a learner that
# started at 0.0 would look unstarted), as real clocks never read 0. Everything reported is counted from the
# trace's first submission again. A power of two, so adding it keeps the trace's times exact.
ORIGIN = float(2**20)


class EventQueue:
    """The pending events, earliest first, as (time, kind, sequence, payload). Events of one time are taken in
    kind order, then in the order they were pushed (the sequence, which also keeps payloads from being
    compared). The engine pops `heap` itself, in its loop."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = 0

    def push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, kind, self._seq, payload))
