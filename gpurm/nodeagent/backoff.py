"""Jittered exponential back-off for reconnect loops (the RM stream, the MQTT broker)."""

from __future__ import annotations

import random


class Backoff:
    """Delays base, 2·base, 4·base ... capped at max_s, each drawn from [d/2, d] so that a rack of agents
    that lost the RM together does not come back in lock-step."""

    def __init__(self, base_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.max_s, self.base_s * (2 ** min(self._attempt, 30)))
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0
