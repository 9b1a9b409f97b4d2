"""Tiresias-style workload (see tiresias_workload): policies compared on 480 jobs on 15 servers x 4 GPUs."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import cast

from gpurm import native
from gpurm.queues.tree import Policy
from gpurm.sim import metrics
from gpurm.sim.clusterspec import parse_cluster, total_gpus
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import trace_tree
from gpurm.sim.runtime import RuntimeConfig, RuntimeModel
from gpurm.sim.trace import Trace, load_trace
from gpurm.sim.workloads import TiresiasStyle, tiresias_style, to_tiresias_csv

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests/data/philly/jobs-2017-10-02_to_10-15.csv"
TIRESIAS_2DLAS_JCT_S = 1510.0     # Tiresias' own simulator, 2D-LAS on its 480-job trace (the issue's reference)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", default=str(SOURCE), help="philly-csv trace the durations are drawn from")
    parser.add_argument("--jobs", type=int, default=480)
    parser.add_argument("--loads", default="1.0,1.5,2.0",
                        help="comma-separated offered loads over the arrival span (default 1.0,1.5,2.0)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds; figures are averaged over them")
    parser.add_argument("--policy", action="append", choices=[p.value for p in Policy],
                        help="policies to run (repeatable; default fifo, las, srtf and gittins)")
    parser.add_argument("--runtime-model", choices=[m.value for m in RuntimeModel], default="ideal")
    parser.add_argument("--write", help="write the first seed's workload to this file (Tiresias CSV)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    source = load_trace(Path(args.source), "philly-csv")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    loads = [float(x) for x in args.loads.split(",") if x.strip()]
    policies = args.policy or ["fifo", "las", "srtf", "gittins"]
    config = RuntimeConfig() if args.runtime_model == "placement" else None
    print(f"hot paths: {native.status().reason}; run-time model {args.runtime_model}")
    results = {}
    for load in loads:
        results[str(load)] = at_load(args, source, load, seeds, policies, config)
    print(f"\nreference: Tiresias' simulator, 2D-LAS on its own (unpublished) 480-job trace: "
          f"{TIRESIAS_2DLAS_JCT_S:,.0f}s average JCT")
    print(f"average over seeds {args.seeds}: avg JCT (avg queueing) per offered load")
    print(f"  {'policy':<8}" + "".join(f"{'load ' + format(x, 'g'):>20}" for x in loads))
    for name in [*policies, "floor"]:
        cells = "".join(f"{results[str(x)]['jct'][name]:>11,.0f}s ({results[str(x)]['queue'][name]:>5,.0f}s)"
                        for x in loads)
        print(f"  {name:<8}{cells}")
    print("  (floor: the mean duration, the JCT with no queueing at all)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def at_load(args: argparse.Namespace, source: Trace, load_target: float, seeds: list[int], policies: list[str],
            config: RuntimeConfig | None) -> dict[str, dict[str, float]]:
    """Each policy's average JCT and queueing over the seeds at one offered load (plus the floor)."""
    jct: dict[str, list[float]] = {p: [] for p in policies}
    queue: dict[str, list[float]] = {p: [] for p in policies}
    floor: list[float] = []
    for seed in seeds:
        params = TiresiasStyle(jobs=args.jobs, load=load_target, seed=seed)
        trace = tiresias_style(params, source)
        if args.write and seed == seeds[0]:
            Path(args.write).write_text(to_tiresias_csv(trace))
        servers = parse_cluster(params.cluster)
        capacity = total_gpus(servers)
        load = metrics.load_factor(trace.gpu_seconds(), capacity, trace.span_s)
        floor.append(statistics.fmean(j.duration_s for j in trace.jobs))
        print(f"load {load_target:g}, seed {seed}: {len(trace.jobs)} jobs on {params.cluster} ({capacity} GPUs), "
              f"load factor {load:.2f}, mean duration {floor[-1]:,.0f}s")
        for name in policies:
            res = Engine(trace, servers, trace_tree(trace.queues()),
                         SimOptions(policy=Policy(name), seed=seed, runtime=config)).run()
            summary = metrics.summarize(res.results, res.timeline, capacity, load, res.wall_s)
            jct[name].append(float(cast(float, summary["avg_jct_s"])))
            queue[name].append(float(cast(float, summary["avg_queue_s"])))
            print(f"  {name:<8} avg JCT {jct[name][-1]:8,.0f}s  avg queueing {queue[name][-1]:8,.0f}s  "
                  f"preemptions {summary['preemptions']}")
    out = {"jct": {p: statistics.fmean(v) for p, v in jct.items()},
           "queue": {p: statistics.fmean(v) for p, v in queue.items()}}
    out["jct"]["floor"] = statistics.fmean(floor)
    out["queue"]["floor"] = 0.0
    return out


if __name__ == "__main__":
    raise SystemExit(main())
