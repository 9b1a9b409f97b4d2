"""The RM's periodic work, each loop with what it needs passed in: the scheduling passes deferred under load
(`SchedulingPasses`: coalesced to one per `scheduler_interval`, and the replies that wait for the next one), the
tick (the core's time-driven work, retention, forgotten tokens: `tick_loop`), and the probe of the event loop's
lag (`loop_lag_loop`). RMShell (rm/server/daemon.py) starts them in `run` and stops them at the end; what a loop
changes goes through RMShell.mutation like any request's change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from gpurm.common.aio import wait_set
from gpurm.rm.config import RMConfig
from gpurm.rm.server.metrics import RMMetrics
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import RequestError
from gpurm.rm.storage.persist import Persister

log = logging.getLogger("gpurm.rm.server.daemon")     # the RM's one log name, whichever module writes the line

LAG_PROBE_S = 0.1             # the event loop's lag is sampled this often (gpurm_event_loop_lag_seconds)


class SchedulingPasses:
    """When the scheduling pass runs: an allocate call runs it itself unless one ran within `scheduler_interval`;
    then it is deferred, and `loop` runs the deferred ones. The loop also starts the AMs a burst of submits left for
    it (a submit within `scheduler_interval` of the last AM launch leaves its AM to the next one: one launch for the
    burst instead of one per submit)."""

    def __init__(self, config: RMConfig, persist: Persister, core: Callable[[], RMCore],
                 mutation: Callable[[], AbstractAsyncContextManager[object]], metrics: RMMetrics) -> None:
        """`core`: the shell's core now (a failed write replaces it). `mutation`: RMShell.mutation (a deferred
        pass's grants are written before the replies held for it take them)."""
        self.config = config
        self.persist = persist
        self._core = core
        self._mutation = mutation
        self.metrics = metrics
        self._last_pass = 0.0
        self._pass_pending = False
        self._pass_done = asyncio.Event()    # set (and replaced) after each deferred pass

    def soon(self) -> bool:
        """Whether an allocate call should run the scheduling pass itself now. Under load passes are
        coalesced to one per `scheduler_interval`; `loop` runs the deferred ones."""
        now = time.monotonic()
        if now - self._last_pass >= self.config.scheduler_interval_s:
            self._last_pass = now
            return True
        self._pass_pending = True
        return False

    async def loop(self) -> None:
        took = 0.0
        while True:
            # Passes take at most half the loop's time: a slow pass (a burst on a big cluster) spaces them out.
            await asyncio.sleep(max(self.config.scheduler_interval_s, took))
            if self._core().launch_due and self.persist.writable:
                # The AMs of a burst of submits, in one launch (rm/state/lifecycle.py, submit).
                with contextlib.suppress(RequestError):
                    async with self._mutation():
                        self._core().launch_due_ams(time.time())
            if self._pass_pending and self.persist.writable:
                self._pass_pending = False
                self._last_pass = time.monotonic()
                with contextlib.suppress(RequestError):   # a failed write: logged already
                    async with self._mutation():
                        began = time.perf_counter()
                        self._core().schedule(time.time())
                        took = time.perf_counter() - began
                        self.metrics.schedule_seconds.observe(took)
                self.written()

    def written(self) -> None:
        """A scheduling pass is done and its grants are on disk: replies held for it may take them."""
        done, self._pass_done = self._pass_done, asyncio.Event()
        done.set()

    async def next(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) for the next scheduling pass to be done and written; whether one was."""
        return await wait_set(self._pass_done, timeout_s)


async def tick_loop(interval_s: float, persist: Persister, tick: Callable[[], Awaitable[None]]) -> None:
    """`tick` every `interval_s` while the store takes writes; a tick that fails is logged, the next one runs."""
    while True:
        await asyncio.sleep(interval_s)
        if not persist.writable:
            continue       # the store refuses writes: the periodic work waits for it
        try:
            await tick()
        except RequestError:
            pass           # the store refused this tick's write (logged once by the persister)
        except Exception:
            log.exception("tick failed")


async def loop_lag_loop(metrics: RMMetrics) -> None:
    """Measure how late the event loop runs a timer: when it is busy, everything waits that long."""
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        await asyncio.sleep(LAG_PROBE_S)
        metrics.loop_lag_seconds.observe(max(0.0, loop.time() - began - LAG_PROBE_S))
