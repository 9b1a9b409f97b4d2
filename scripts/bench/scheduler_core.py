"""Scheduler-core benchmark (see scheduler_core)."""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time

from gpurm.common.gpus import GpuRecord
from gpurm.queues.config import parse_queues
from gpurm.queues.fairshare import compute_shares
from gpurm.rm.sched.priority import Standing
from gpurm.rm.sched.scheduler import App, Ask, Scheduler
from gpurm.rm.state.cluster import Cluster, Node
from gpurm.rm.state.queuebook import QueueBook
from gpurm.rm.state.sortedkeys import SortedKeys


def build_tree(parents: int, leaves_per_parent: int) -> str:
    lines = ["queues:"]
    for p in range(parents):
        lines.append(f"  p{p}:\n    weight: {1 + p % 3}\n    queues:")
        for leaf in range(leaves_per_parent):
            policy = "las" if leaf % 4 == 0 else "fifo"
            lines.append(f"      q{leaf}: {{weight: {1 + leaf % 2}, policy: {policy}}}")
    return "\n".join(lines) + "\n"


def build_cluster(nodes: int, gpus: int, rack_size: int) -> Cluster:
    cluster = Cluster()
    for i in range(nodes):
        rack = f"r{i // rack_size}"
        cluster.upsert(Node(f"n{i:05d}", "h", 1, rack, rack, {k: GpuRecord(k) for k in range(gpus)}))
    return cluster


SIZES = [1, 1, 1, 1, 2, 2, 4, 8, 8, 16]


def make_apps(rng: random.Random, jobs: int, leaves: list[str], node_ids: list[str]) -> list[App]:
    apps = []
    for j in range(jobs):
        gpus = rng.choice(SIZES)
        per, count = (gpus, 1) if gpus <= 8 else (8, gpus // 8)
        # As AMs ask: specific servers picked from their (possibly stale) view.
        asks = [Ask(gpus=per, node_id=rng.choice(node_ids)) for _ in range(count)]
        apps.append(App(f"job-{j}", rng.choice(leaves), f"user{j % 200}", j, asks,
                        standing=Standing(f"job-{j}", j, gpus, attained_gpu_s=rng.random() * 1e5)))
    return apps


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(42)
    parents = 50
    tree = parse_queues(build_tree(parents, args.queues // parents))
    leaves = [q.path for q in tree.leaves]
    node_ids = [f"n{i:05d}" for i in range(args.nodes)]

    # Fair-share recomputation over the whole tree (steady + instantaneous), half the leaves active.
    book = QueueBook(tree)
    for leaf in leaves[::2]:
        book.want(leaf, 8)
    capacity = args.nodes * 8
    demand = {p: math.ceil(book.demand[p]) for p in leaves}
    share_times = timed(lambda: compute_shares(tree.share_tree(demand), capacity), args.repeat)

    # Pass 1: an idle cluster, every job's asks fit somewhere: thousands of grants in one pass.
    results = {}
    for label, fill in (("empty cluster", 0.0), ("90% full", 0.9), ("full", 1.0)):
        times, grants_made = [], []
        for _ in range(args.repeat):
            cluster = build_cluster(args.nodes, 8, 32)
            book = QueueBook(tree)
            filled = 0
            for nid in node_ids[: int(args.nodes * fill)]:
                cluster.allocate(nid, range(8), f"busy-{nid}")
                filled += 8
            apps = make_apps(rng, args.jobs, leaves, node_ids)
            for a in apps:
                book.want(a.queue, sum(x.gpus * x.count for x in a.asks))
            book.charge(leaves[0], "busy", filled)
            sched = Scheduler(cluster, book)
            ids = iter(range(10**9))
            t = time.perf_counter()
            grants = sched.schedule(apps, lambda job, ids=ids: f"{job}-c{next(ids)}")  # type: ignore[misc]
            times.append(time.perf_counter() - t)
            grants_made.append(len(grants))
        results[label] = (times, grants_made)

    # Raw limits on this machine, in this run.
    index: SortedKeys[tuple[int, str]] = SortedKeys()
    for i in range(10000):
        index.add((i, "n"))
    t = time.perf_counter()
    for i in range(100000):
        index.discard((i % 10000, "n"))
        index.add((i % 10000, "n"))
    sorted_ops = 200000 / (time.perf_counter() - t)
    items = [{"a": i} for i in range(args.jobs)]
    t = time.perf_counter()
    for _ in range(20):
        total = 0
        for d in items:
            total += d["a"]
    loop_ms = (time.perf_counter() - t) / 20 * 1000

    print(f"scheduler_core: {len(tree.by_path) - 1} queues ({len(leaves)} leaves under {parents} parents), "
          f"{args.jobs} pending jobs (1-16 GPUs, node-specific asks), {args.nodes} nodes x 8 GPUs; "
          f"median of {args.repeat}")
    print(f"  fair-share recomputation (steady + instantaneous): {statistics.median(share_times) * 1000:.1f} ms")
    for label, (times, grants) in results.items():
        print(f"  scheduling pass, {label:>13}: {statistics.median(times) * 1000:7.1f} ms "
              f"({statistics.median(grants):.0f} grants)")
    print(f"raw limits in this run: SortedKeys add+discard (10,000 keys) {sorted_ops / 1e6:.2f} M ops/s; "
          f"a bare Python loop over {args.jobs} dicts {loop_ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
