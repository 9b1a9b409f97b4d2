"""The daemon's forecasts: a snapshot taken on the event loop (cheap: plain copies), the replays run in one
separate process at low priority, within a CPU budget, so that allocation never waits for them.

A round: take a snapshot of the core (`snapshot.take`), hand it to the worker process (pickled there by the
executor's own thread, not on the loop), replay (`replay.forecast`), keep the forecasts it returns with the time
the snapshot was taken. The next round comes `interval` after this one ended, or later when this one's CPU time
over the budget asks for more: a round that cost 3 s of CPU under a 0.25-core budget waits at least 12 s. No
queued job: no round. The process is started once (`spawn`: never a fork of the RM's threads and gRPC state),
niced, and stopped with the RM; a round that fails is logged and the last forecasts stay (they say when they
were made).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gpurm.rm.forecast.config import ForecastConfig
from gpurm.rm.forecast.records import Forecast, ForecastSettings
from gpurm.rm.forecast.snapshot import HistoryCache, Snapshot, take
from gpurm.rm.state.core import RMCore

log = logging.getLogger("gpurm.rm.server.daemon")

WORKER_NICE = 10
PARENT_POLL_S = 1.0      # how often a worker checks that its RM still lives

# What travels back from the worker: (job id, earliest, likely, latest) per job, and the CPU seconds the round took.
Rows = list[tuple[str, float | None, float | None, float | None]]


def _init_worker(rm_pid: int) -> None:
    """`rm_pid`: the RM's, named by the RM itself (had it died while this process was still importing, its parent
    would already be another)."""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    threading.Thread(target=_exit_with_parent, args=(rm_pid,), name="forecast-parent-watch", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the RM that started it is gone. A process pool's worker holds both ends of its own
    call queue, so it never reads an end of file when the RM dies uncleanly (SIGKILL, OOM): it would wait forever,
    and every restart of the RM would leave one more behind."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def run_round(snap: Snapshot, settings: ForecastSettings) -> tuple[Rows, float, int]:
    """In the worker process: forecast every queued job; the rows, the CPU seconds used and the events replayed.
    Only plain values cross the process boundary, both ways. (The simulator's engine is imported here, in the
    worker, not by the RM process.)"""
    from gpurm.rm.forecast.replay import forecast

    began = time.process_time()
    got, stats = forecast(snap, settings)
    rows = [(f.job_id, f.earliest, f.likely, f.latest) for f in got.values()]
    return rows, time.process_time() - began, stats.events


@dataclass
class RoundStats:
    """The last round's cost: the snapshot's time on the loop, the replays' CPU and wall time, its size."""

    made_at: float = 0.0
    snapshot_s: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    jobs: int = 0
    events: int = 0
    rounds: int = 0


class Forecaster:
    """The RM's forecasts: `get(job_id)` while the job waits; `loop` makes them, `close` stops the worker."""

    def __init__(self, config: ForecastConfig, core: Callable[[], RMCore],
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.core = core
        self.clock = clock
        self.forecasts: dict[str, Forecast] = {}
        self.stats = RoundStats()
        self.cache = HistoryCache()
        self._pool: ProcessPoolExecutor | None = None

    def get(self, job_id: str) -> Forecast | None:
        return self.forecasts.get(job_id)

    @property
    def horizon_s(self) -> float:
        return self.config.settings.horizon_s

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(os.getpid(),))
        return self._pool

    async def round(self) -> bool:
        """One round; False when there was nothing to forecast."""
        core = self.core()
        t0 = time.perf_counter()
        snap = take(core, self.clock(), self.cache)
        snapshot_s = time.perf_counter() - t0
        queued = sum(1 for j in snap.jobs if not j.running)
        if not queued:
            self.forecasts = {}
            return False
        began = time.perf_counter()
        loop = asyncio.get_running_loop()
        rows, cpu_s, events = await loop.run_in_executor(self._executor(), run_round, snap,
                                                         self.config.settings)
        self.forecasts = {job_id: Forecast(job_id, snap.now, e, li, la) for job_id, e, li, la in rows}
        self.stats = RoundStats(snap.now, snapshot_s, cpu_s, time.perf_counter() - began, queued, events,
                                self.stats.rounds + 1)
        return True

    def pause_after(self, stats: RoundStats) -> float:
        """How long to wait after a round: the interval, or longer when the round's CPU needs it to stay within
        the budget (cpu / budget is the round's share of the time; the wall time it took is counted in it)."""
        return max(self.config.interval_s, stats.cpu_s / self.config.cpu_budget - stats.wall_s)

    async def loop(self) -> None:
        while True:
            pause = self.config.interval_s
            try:
                if await self.round():
                    pause = self.pause_after(self.stats)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("forecast round failed (the last forecasts stay)")
            await asyncio.sleep(pause)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
