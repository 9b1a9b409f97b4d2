"""Simulator speed benchmark (see sim_speed)."""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import time
from pathlib import Path

from gpurm import native
from gpurm.queues.tree import Policy
from gpurm.sim import metrics
from gpurm.sim.clusterspec import parse_cluster, total_gpus
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests/data/philly/jobs-2017-10-02_to_10-15.csv"
FIGURES = ("jobs", "finished", "load_factor", "makespan_s", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
           "p99_queue_s", "gpu_utilization", "locality", "preemptions", "retries", "queue_by_size")


def bare_event_loop(events: int) -> float:
    """Seconds for a heap push and pop per event with no work at all: the floor of any event-driven Python loop."""
    t0 = time.perf_counter()
    heap: list[tuple[float, int, int]] = []
    for i in range(events):
        heapq.heappush(heap, (float(i % 977), 0, i))
    while heap:
        heapq.heappop(heap)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--cluster", default="8x8x8")
    parser.add_argument("--policy", action="append", choices=[p.value for p in Policy],
                        help="policies to run (repeatable; default fifo, las and srtf)")
    parser.add_argument("--jobs", type=int, default=0, help="only the first N jobs (default: all)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = load_trace(Path(args.trace), "philly-csv")
    load_s = time.perf_counter() - t0
    if args.jobs:
        trace = dataclasses.replace(trace, jobs=trace.jobs[:args.jobs])
    servers = parse_cluster(args.cluster)
    capacity = total_gpus(servers)
    load = metrics.load_factor(trace.gpu_seconds(), capacity, trace.span_s)
    print(f"trace: {len(trace.jobs)} jobs from {Path(args.trace).name}, loaded in {load_s:.2f}s; cluster "
          f"{args.cluster} = {capacity} GPUs; load factor {load:.3f}")
    print(f"hot paths: {native.status().reason}")
    results = {}
    for name in args.policy or ["fifo", "las", "srtf"]:
        engine = Engine(trace, servers, trace_tree(trace.queues()), SimOptions(policy=Policy(name)))
        res = engine.run()
        summary = metrics.summarize(res.results, res.timeline, capacity, load, res.wall_s)
        floor = bare_event_loop(res.events)
        results[name] = {"wall_s": res.wall_s, "events": res.events, "settles": res.settles,
                         "compiled": native.status().active,
                         "bare_event_loop_s": floor, **{k: summary[k] for k in FIGURES}}
        print(f"\n== {name}: {res.wall_s:.1f}s wall for {len(trace.jobs)} jobs ({res.events} events, "
              f"{res.events / res.wall_s:,.0f} events/s; a bare heap loop over as many events: {floor * 1000:.0f} ms)")
        for key in FIGURES:
            value = summary[key]
            shown = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, dict) \
                else str(value)
            print(f"  {key:<16} {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
