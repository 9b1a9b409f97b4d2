"""`FailureInjector`: infrastructure failures injected into the replay (`gpurm sim --failures`), a Poisson
process per learner GPU-hour. When an attempt starts it draws when its failure would come and on which of its
servers, and queues a FAIL event for it; the agents (sim/agents.py) report that learner LOST when the event
comes, unless the attempt ended first. The draws have their own random stream (the run's seed), so they are
the same whatever else the run draws."""

from __future__ import annotations

import random

from gpurm.sim.clock import FAIL, EventQueue


class FailureInjector:
    def __init__(self, per_1000_gpu_h: float, seed: int, timed: bool, queue: EventQueue) -> None:
        self.per_1000_gpu_h = per_1000_gpu_h   # failures per 1000 learner GPU-hours; 0: none
        self.rng = random.Random(seed)
        # Under the `placement` run-time model an attempt may run slower than full speed, so its finish time is
        # not known when it starts: every draw is queued, and one past the finish is dropped as stale.
        self.timed = timed
        self.queue = queue

    def draw(self, job_id: str, gpus: int, token: int, containers: dict[str, str], remaining: float,
             now: float) -> None:
        """An attempt (run `token`, its learners `containers`: container -> node) starts with `remaining`
        seconds of work at full speed: queue its failure, if one comes before it ends."""
        failures = self.per_1000_gpu_h
        if failures > 0:
            per_s = failures / 1000.0 * gpus / 3600.0
            t_fail = self.rng.expovariate(per_s)
            if t_fail < remaining or self.timed:
                node = self.rng.choice(sorted(set(containers.values())))
                self.queue.push(now + t_fail, FAIL, (job_id, token, node))
