#!/usr/bin/env python3
"""A stand-in for a torchrun launcher: one process per server, as gpurm starts learners.

It checks the environment gpurm gives it, rendezvouses with the other servers' learners over
MASTER_ADDR:MASTER_PORT (rank 0 listens, the others connect), "trains" for a few steps and exits 0.
Standard library only, so it runs with any python3.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "WORLD_SIZE",
            "GPURM_JOB_ID", "GPURM_ATTEMPT", "CUDA_VISIBLE_DEVICES")


def rendezvous(rank: int, nnodes: int, addr: str, port: int, timeout: float) -> None:
    if nnodes == 1:
        return
    deadline = time.time() + timeout
    if rank == 0:
        with socket.create_server((addr, port), reuse_port=False) as srv:
            srv.settimeout(timeout)
            peers = []
            while len(peers) < nnodes - 1:
                conn, _ = srv.accept()
                peers.append((int(conn.recv(16).decode()), conn))
            for _, conn in peers:
                conn.sendall(b"go")
                conn.close()
            print(f"rendezvous: ranks {sorted(r for r, _ in peers)} joined rank 0", flush=True)
        return
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                conn.sendall(str(rank).encode())
                if conn.recv(2) == b"go":
                    print(f"rendezvous: joined rank 0 at {addr}:{port}", flush=True)
                    return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank exits 3 half way (to try retries)")
    args = p.parse_args()
    missing = [v for v in REQUIRED if v not in os.environ]
    if missing:
        print(f"missing environment: {missing}", file=sys.stderr)
        return 2
    env = os.environ
    rank, nnodes = int(env["NODE_RANK"]), int(env["NNODES"])
    gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
    if len(gpus) != int(env["NPROC_PER_NODE"]):
        print(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} does not match NPROC_PER_NODE", file=sys.stderr)
        return 2
    print(f"job {env['GPURM_JOB_ID']} attempt {env['GPURM_ATTEMPT']}: node rank {rank}/{nnodes} on "
          f"{socket.gethostname()}, GPUs {env['CUDA_VISIBLE_DEVICES']}, world size {env['WORLD_SIZE']}, "
          f"master {env['MASTER_ADDR']}:{env['MASTER_PORT']}", flush=True)
    rendezvous(rank, nnodes, env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout=120)
    loss = 2.5
    for step in range(1, args.steps + 1):
        time.sleep(args.step_time)
        loss *= 0.9
        if rank == 0:
            print(f"step {step}/{args.steps} loss {loss:.4f}", flush=True)
        if rank == args.fail_rank and step == args.steps // 2:
            print("simulated failure", file=sys.stderr, flush=True)
            return 3
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
