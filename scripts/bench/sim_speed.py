"""Simulator speed benchmark (see sim_speed)."""

from __future__ import annotations

import argparse
import dataclasses
import gc
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
from gpurm.sim.runtime import RuntimeConfig, RuntimeModel
from gpurm.sim.trace import Trace, load_trace, tile

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests/data/philly/jobs-2017-10-02_to_10-15.csv"
FIGURES = ("jobs", "finished", "load_factor", "makespan_s", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
           "p99_queue_s", "gpu_utilization", "locality", "preemptions", "retries", "queue_by_size")


def bare_event_loop(events: int) -> float:
    """Seconds for a heap push and pop per event with no work at all: the floor of any event-driven Python loop.
    With the cyclic collector off, as the engine replays: on, it would walk the last replay's objects (still young:
    they were made while it was off) and time that instead of the loop."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        heap: list[tuple[float, int, int]] = []
        for i in range(events):
            heapq.heappush(heap, (float(i % 977), 0, i))
        while heap:
            heapq.heappop(heap)
        return time.perf_counter() - t0
    finally:
        if was_on:
            gc.enable()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--cluster", default="8x8x8")
    parser.add_argument("--policy", action="append", choices=[p.value for p in Policy],
                        help="policies to run (repeatable; default fifo, las and srtf)")
    parser.add_argument("--jobs", type=int, default=0, help="only the first N jobs (default: all)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--runtime-model", choices=[m.value for m in RuntimeModel], default="ideal",
                        help="the run-time model (default ideal, the figures this benchmark has always printed)")
    parser.add_argument("--scale", action="store_true",
                        help="replay the first 10k, 20k, 40k and 80k jobs with the first --policy (default fifo) "
                             "and print jobs/s at each size and the growth")
    parser.add_argument("--tile", type=int, default=0, metavar="N",
                        help="replay the trace N times back to back (sim/trace.py tile: times shifted, job ids and "
                             "users renamed, same queues and load factor); default 1, and with --scale as many "
                             "copies as reach 80k jobs (4 of the 24,137-job window: 96,548 jobs)")
    args = parser.parse_args()
    config = RuntimeConfig() if args.runtime_model == "placement" else None
    if args.scale:
        return scale(args, config)

    t0 = time.perf_counter()
    trace = tiled(load_trace(Path(args.trace), "philly-csv"), args.tile or 1)
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
        engine = Engine(trace, servers, trace_tree(trace.queues()), SimOptions(policy=Policy(name), runtime=config))
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


SCALE_SIZES = (10_000, 20_000, 40_000, 80_000)


def tiled(trace: Trace, copies: int) -> Trace:
    if copies > 1:
        trace = tile(trace, copies)
        print(f"tiled: {copies} copies of the trace back to back = {len(trace.jobs)} jobs")
    return trace


def scale(args: argparse.Namespace, config: RuntimeConfig | None) -> int:
    """Jobs/s for the first N jobs of the trace, and the growth of the per-job cost from the smallest size to the
    largest (1.0: linear; 2.0: each job costs twice as much at the largest size), each beside the bare event loop
    over as many events (the floor of any event-driven Python loop), measured in the same run."""
    base = load_trace(Path(args.trace), "philly-csv")
    copies = args.tile or max(1, -(-SCALE_SIZES[-1] // max(len(base.jobs), 1)))
    full = tiled(base, copies)
    servers = parse_cluster(args.cluster)
    policy = Policy((args.policy or ["fifo"])[0])
    sizes = [n for n in SCALE_SIZES if n < len(full.jobs)] + [len(full.jobs)]
    sizes = sorted(set(sizes))[:len(SCALE_SIZES)]
    if len(full.jobs) < SCALE_SIZES[-1]:
        print(f"the trace has {len(full.jobs)} jobs, fewer than {SCALE_SIZES[-1]}: the largest size is all of them")
    print(f"hot paths: {native.status().reason}; policy {policy.value}; cluster {args.cluster}; run-time model "
          f"{args.runtime_model}")
    per_job: dict[int, float] = {}
    per_job_cpu: dict[int, float] = {}
    rows = []
    for n in sizes:
        trace = dataclasses.replace(full, jobs=full.jobs[:n])
        cpu0 = time.process_time()
        res = Engine(trace, servers, trace_tree(trace.queues()), SimOptions(policy=policy, runtime=config)).run()
        cpu = time.process_time() - cpu0
        per_job[n] = res.wall_s / n
        per_job_cpu[n] = cpu / n
        floor = bare_event_loop(res.events)
        rows.append({"jobs": n, "wall_s": res.wall_s, "cpu_s": cpu, "jobs_per_s": n / res.wall_s,
                     "jobs_per_cpu_s": n / cpu, "events": res.events, "bare_event_loop_s": floor,
                     "bare_jobs_per_s": n / floor})
        print(f"  {n:>6} jobs: {res.wall_s:7.1f}s wall, {n / res.wall_s:8,.0f} jobs/s ({cpu:.1f}s CPU, "
              f"{n / cpu:,.0f} jobs per CPU-s), {res.events} events (a bare heap loop over as many events: "
              f"{floor:.2f}s, {n / floor:,.0f} jobs/s)")
    growth = per_job[sizes[-1]] / per_job[sizes[0]]
    growth_cpu = per_job_cpu[sizes[-1]] / per_job_cpu[sizes[0]]
    print(f"growth: the per-job cost at {sizes[-1]} jobs is {growth:.2f}x that at {sizes[0]} in wall time, "
          f"{growth_cpu:.2f}x in CPU time ({sizes[-1] / sizes[0]:.1f}x the jobs; 1.0 = linear; CPU time is the "
          "figure to trust on a shared machine)")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": rows, "growth": growth, "growth_cpu": growth_cpu},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
