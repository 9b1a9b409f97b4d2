"""What start-time forecasts cost the RM (see forecast_cost): the snapshot on the event loop, a round's CPU in the
worker process, and the event loop's lag while rounds run back to back, against the same loop without them."""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpurm.common.model import JobState  # noqa: E402
from gpurm.rm.forecast.config import ForecastConfig  # noqa: E402
from gpurm.rm.forecast.records import ForecastSettings  # noqa: E402
from gpurm.rm.forecast.snapshot import HistoryCache, take  # noqa: E402
from gpurm.rm.forecast.worker import Forecaster, run_round  # noqa: E402
from gpurm.rm.state.core import RMCore  # noqa: E402
from gpurm.sim.clusterspec import parse_cluster  # noqa: E402
from gpurm.sim.engine import Engine, SimOptions  # noqa: E402
from gpurm.sim.run import trace_tree  # noqa: E402
from gpurm.sim.trace import load_trace  # noqa: E402

TRACE = ROOT / "tests" / "data" / "philly" / "jobs-2017-10-02_to_10-15.csv"


class Reached(Exception):
    pass


def note(text: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def waiting(core: RMCore) -> int:
    return sum(1 for j in core.jobs.values() if j.state in (JobState.QUEUED, JobState.ALLOCATING))


def live_core(target: int, cluster: str) -> tuple[RMCore, float]:
    """The Philly window replayed until at least `target` jobs wait (or to its end): the core, and its time."""
    trace = load_trace(TRACE, "philly-csv")
    engine = Engine(trace, parse_cluster(cluster), trace_tree(trace.queues()), SimOptions())
    seen = [0]
    at = [0.0]

    def hook(now: float, arrived: list[str]) -> None:
        seen[0] += len(arrived)
        if seen[0] % 100 < len(arrived) and waiting(engine.core) >= target:
            at[0] = now
            raise Reached

    engine.after_arrivals = hook
    try:
        engine.run()
    except Reached:
        pass
    return engine.core, at[0]


def lag_probe(seconds: float, loop_work: Any = None) -> dict[str, float]:
    """The event loop's lag (a 10 ms timer's lateness) over `seconds`, with `loop_work` (a coroutine factory)
    running beside it: what an allocate call arriving then would wait."""
    async def main() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(loop_work()) if loop_work is not None else None
        lags: list[float] = []
        end = loop.time() + seconds
        while loop.time() < end:
            began = loop.time()
            await asyncio.sleep(0.01)
            lags.append(max(0.0, loop.time() - began - 0.01))
        if task is not None:
            task.cancel()
        lags.sort()
        return {"p50_ms": 1000 * lags[len(lags) // 2], "p99_ms": 1000 * lags[int(len(lags) * 0.99)],
                "max_ms": 1000 * lags[-1], "samples": len(lags)}
    return asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--waiting", type=int, default=1190, help="replay the Philly window until this many jobs wait")
    ap.add_argument("--cluster", default="8x8x8")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each lag probe runs")
    ap.add_argument("--budget", type=float, default=ForecastConfig().cpu_budget, help="forecast.cpu_budget")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    note(f"replaying the Philly window on {args.cluster} until {args.waiting} jobs wait ...")
    core, at = live_core(args.waiting, args.cluster)
    n_wait = waiting(core)
    if n_wait < args.waiting:
        note(f"the window never had {args.waiting} jobs waiting (at its end: {n_wait}); give a smaller --waiting")
        return 1
    live = sum(1 for j in core.jobs.values() if not j.state.terminal)
    note(f"{n_wait} waiting, {live} not ended, {len(core.jobs)} jobs in the core; timing the snapshot")
    cache = HistoryCache()
    take(core, at, cache)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        snap = take(core, at, cache)
        times.append(time.perf_counter() - t)
    cold = []
    for _ in range(5):
        t = time.perf_counter()
        take(core, at, HistoryCache())
        cold.append(time.perf_counter() - t)
    # Raw limits, here and now: a bare walk over the same jobs, and pickling the snapshot (the executor's thread).
    t = time.perf_counter()
    for _ in range(20):
        _ = [(j.job_id, j.state, j.spec.gpus) for j in core.jobs.values()]
    bare_walk_ms = (time.perf_counter() - t) / 20 * 1000
    t = time.perf_counter()
    blob = pickle.dumps(snap)
    pickle_ms = (time.perf_counter() - t) * 1000
    note("one round in this process (what the worker runs) ...")
    rows, cpu_s, events = run_round(pickle.loads(blob), ForecastSettings())
    beyond = sum(1 for r in rows if r[3] is None)
    note(f"{len(rows)} forecasts, {cpu_s:.1f} s CPU, {events} events; lag probes ({args.seconds:g} s each) ...")
    without = lag_probe(args.seconds)

    async def rounds() -> None:
        forecaster = Forecaster(ForecastConfig(interval_s=1.0, cpu_budget=args.budget), lambda: core,
                                clock=lambda: at)
        try:
            await forecaster.loop()
        finally:
            forecaster.close()

    with_forecasts = lag_probe(args.seconds, rounds)
    result = {
        "waiting": n_wait, "live": live, "jobs_in_core": len(core.jobs),
        "snapshot_ms_p50": statistics.median(times) * 1000, "snapshot_ms_max": max(times) * 1000,
        "snapshot_cold_ms_p50": statistics.median(cold) * 1000, "snapshot_bytes": len(blob),
        "raw_bare_walk_ms": bare_walk_ms, "raw_pickle_ms": pickle_ms,
        "round_cpu_s": cpu_s, "round_events": events, "forecasts": len(rows), "beyond_horizon": beyond,
        "round_period_s_at_budget": max(ForecastConfig().interval_s, cpu_s / args.budget), "budget": args.budget,
        "lag_without": without, "lag_with": with_forecasts,
    }
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(f"state: {n_wait} waiting jobs, {live} not ended ({len(core.jobs)} in the core), Philly window "
          f"on {args.cluster}")
    print(f"snapshot on the loop: p50 {result['snapshot_ms_p50']:.1f} ms, max {result['snapshot_ms_max']:.1f} ms "
          f"(history copied too: {result['snapshot_cold_ms_p50']:.1f} ms); {len(blob) / 1e6:.2f} MB pickled")
    print(f"  raw: a bare walk over the core's jobs {bare_walk_ms:.1f} ms; pickling the snapshot {pickle_ms:.1f} ms "
          "(off the loop, in the executor's thread)")
    print(f"one round (worker): {cpu_s:.1f} s CPU, {events} events, {len(rows)} forecasts ({beyond} beyond the "
          f"horizon); at a budget of {args.budget:g} core a round every {result['round_period_s_at_budget']:.0f} s")
    for name, lag in (("event-loop lag without forecasts", without), ("... with rounds back to back", with_forecasts)):
        print(f"{name}: p50 {lag['p50_ms']:.2f} / p99 {lag['p99_ms']:.2f} / max {lag['max_ms']:.1f} ms "
              f"({lag['samples']} samples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
