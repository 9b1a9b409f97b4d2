"""The fence: an agent that the RM has not answered for its lease stops every container it runs, and starts none,
before the RM may declare the node LOST and start the same jobs elsewhere (docs/operations.md, "The fence").

The lease and the grace come from the RM in each registration reply (gpurm/common/lease.py holds the timing rule and
the RM checks it at config load); the tracker renews the lease with the send time of every beat the RM answered.
The containers it stops end as infrastructure failures with a diagnostic that says why, so their jobs are retried
elsewhere; the next registration reports them, and the RM completes them then if it had not yet declared the node
LOST.

The lease outlives the agent process: `STATE_DIR/lease.json` keeps its terms and the (wall-clock) time of its last
renewal, written at most every quarter lease (so it is never later than the truth). A restarted agent that adopts
running containers arms its fence from there: one that was away longer than the lease stops them at once unless
it has registered first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpurm.common.aio import wait_set
from gpurm.common.lease import Lease
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.records import write_json_atomic

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"


class Fence:
    def __init__(self, supervisor: ContainerSupervisor, clock: Callable[[], float] | None = None,
                 state_file: Path | None = None, wall: Callable[[], float] = time.time) -> None:
        self.supervisor = supervisor
        self.lease = Lease()
        self.clock = clock or asyncio.get_running_loop().time
        self.wall = wall
        self.state_file = state_file
        self._written_at = float("-inf")   # wall time of the last lease.json write
        self.fenced = False          # the lease ran out and has not been renewed since
        self.fences = 0              # how many times it ran out (agent metrics, tests)
        self._changed = asyncio.Event()
        self._stops: set[asyncio.Task[object]] = set()

    # ------------------------------------------------------------------ what the tracker tells it

    def set_terms(self, lease_s: float, grace_s: float) -> None:
        """The terms the RM names (at registration, and in heartbeat replies when the interval changes with the
        fleet). A lease already running keeps its end: a shorter one takes effect from the next renewal."""
        if (lease_s, grace_s) != (self.lease.lease_s, self.lease.grace_s):
            self._written_at = float("-inf")     # lease.json gets the new terms at the next renewal
        self.lease.set_terms(lease_s, grace_s)
        self._changed.set()

    def renew(self, sent_at: float) -> None:
        """The RM answered a message this agent sent at `sent_at` (its clock)."""
        self.lease.renew(sent_at)
        now = self.clock()
        if self.fenced and not self.lease.expired(now):
            self.fenced = False
            log.warning("the RM answers again: the fence is lifted, containers may start")
        self._changed.set()
        if self.state_file is not None and self.lease.expires_at is not None:
            wall = self.wall()
            if wall - self._written_at >= self.lease.lease_s / 4:
                self._save(wall - (now - sent_at))

    def _save(self, renewed_wall: float) -> None:
        assert self.state_file is not None
        try:
            write_json_atomic(self.state_file, {"lease_s": self.lease.lease_s, "grace_s": self.lease.grace_s,
                                                "renewed": renewed_wall})
            self._written_at = self.wall()
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_file, exc)

    def restore(self) -> None:
        """Arm the fence from the lease an earlier agent process held (call before serving)."""
        if self.state_file is None:
            return
        try:
            data = json.loads(self.state_file.read_text())
            lease_s, grace_s, renewed = float(data["lease_s"]), float(data["grace_s"]), float(data["renewed"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        self.lease.set_terms(lease_s, grace_s)
        self.lease.renew(self.clock() - max(0.0, self.wall() - renewed))
        left = self.lease.left(self.clock())
        if left is not None:
            log.info("the previous agent process last heard from the RM %.1fs ago: its lease (%gs) %s",
                     self.wall() - renewed, lease_s, f"has {left:.1f}s left" if left > 0 else "has run out")

    def forget(self) -> None:
        """A clean shutdown: the next agent process starts without a lease (it runs nothing it must fence)."""
        if self.state_file is not None:
            with contextlib.suppress(OSError):
                self.state_file.unlink()

    def holds(self) -> bool:
        """Whether this agent may start a container now."""
        return not self.fenced and not self.lease.expired(self.clock())

    # ------------------------------------------------------------------ the watch

    async def run(self) -> None:
        while True:
            self._changed.clear()
            left = self.lease.left(self.clock())
            if left is None or self.fenced:
                await self._changed.wait()
                continue
            if left > 0:
                await wait_set(self._changed, left)
                continue
            self._fence()

    def _fence(self) -> None:
        self.fenced = True
        self.fences += 1
        live = [r for r in self.supervisor.records() if r.live]
        reason = (f"fenced: no answer from the RM for {self.lease.lease_s:g}s (the agent's lease); stopped before "
                  "the RM may declare the node LOST and start the job elsewhere")
        log.warning("no answer from the RM for %.1fs (the lease): stopping %d containers (grace %.1fs), starting "
                    "none until the RM answers", self.lease.lease_s, len(live), self.lease.grace_s)
        for rec in live:
            rec.infra_failure = True   # the node's fault: the job is retried elsewhere without counting it
            task: asyncio.Task[object] = asyncio.create_task(
                self.supervisor.stop(rec.container_id, self.lease.grace_s, reason))
            self._stops.add(task)
            task.add_done_callback(self._stop_done)

    def _stop_done(self, task: asyncio.Task[object]) -> None:
        self._stops.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fence: a stop failed: %s", task.exception())

    async def close(self) -> None:
        for task in list(self._stops):
            task.cancel()
        await asyncio.gather(*self._stops, return_exceptions=True)
