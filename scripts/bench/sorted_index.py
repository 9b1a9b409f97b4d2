"""SortedKeys (rm/state/sortedkeys.py, compiled) against sortedcontainers.SortedList on the RM's index workload.

The workload is what the cluster's free-GPU index sees: keys (free GPUs, node id); each event moves one node
(discard its old key, add its new one) and a lookup walks from a key (`from_key` / `irange`) to the first few
fits. Sizes from a small cluster to issue 18's 10,000 nodes and beyond. Prints operations per second for both and
the ratio, with the raw limit measured in the same run (a bare dict update per event).
"""

from __future__ import annotations

import argparse
import random
import time
from itertools import islice

from sortedcontainers import SortedList

from gpurm.native import status
from gpurm.rm.state import sortedkeys
from gpurm.rm.state.sortedkeys import SortedKeys


def workload(size: int, events: int, seed: int = 0) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    rng = random.Random(seed)
    nodes = [(rng.randint(0, 8), f"node-{i:06d}") for i in range(size)]
    moves = [(rng.randrange(size), rng.randint(0, 8)) for _ in range(events)]
    return nodes, moves


def run_sortedkeys(nodes: list[tuple[int, str]], moves: list[tuple[int, int]]) -> float:
    index: SortedKeys[tuple[int, str]] = SortedKeys()
    for key in nodes:
        index.add(key)
    keys = list(nodes)
    t = time.perf_counter()
    for i, free in moves:
        index.discard(keys[i])
        keys[i] = (free, keys[i][1])
        index.add(keys[i])
        for _ in islice(index.from_key((free, "")), 4):
            pass
    return len(moves) / (time.perf_counter() - t)


def run_sortedlist(nodes: list[tuple[int, str]], moves: list[tuple[int, int]]) -> float:
    index: SortedList = SortedList(nodes)
    keys = list(nodes)
    t = time.perf_counter()
    for i, free in moves:
        index.discard(keys[i])
        keys[i] = (free, keys[i][1])
        index.add(keys[i])
        for _ in islice(index.irange((free, "")), 4):
            pass
    return len(moves) / (time.perf_counter() - t)


def run_dict(nodes: list[tuple[int, str]], moves: list[tuple[int, int]]) -> float:
    free = {name: f for f, name in nodes}
    names = [name for _, name in nodes]
    t = time.perf_counter()
    for i, f in moves:
        free[names[i]] = f
    return len(moves) / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example:\n  scripts/bench/sorted_index --sizes 100,10000 --events 50000")
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="index sizes (keys), comma-separated")
    parser.add_argument("--events", type=int, default=100_000, help="node moves per size (default 100000)")
    args = parser.parse_args()
    compiled = not sortedkeys.__file__.endswith(".py")
    assert compiled == status().active or not compiled
    print(f"sorted_index: SortedKeys ({'compiled' if compiled else 'interpreted'}) vs sortedcontainers.SortedList; "
          f"{args.events} moves per size (discard + add + walk 4 from a key)")
    print(f"{'keys':>8}  {'SortedKeys':>14}  {'SortedList':>14}  {'ratio':>6}")
    for size in (int(x) for x in args.sizes.split(",")):
        nodes, moves = workload(size, args.events)
        a, b = run_sortedkeys(nodes, moves), run_sortedlist(nodes, moves)
        print(f"{size:>8}  {a / 1e6:>10.2f} M/s  {b / 1e6:>10.2f} M/s  {a / b:>5.2f}x")
    nodes, moves = workload(10_000, args.events)
    print(f"raw limit in this run: a dict update per move {run_dict(nodes, moves) / 1e6:.1f} M/s")


if __name__ == "__main__":
    main()
