"""Submit-to-running latency on a real 4-node dev cluster (see submit_latency)."""

from __future__ import annotations

import argparse
import getpass
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from gpurm.common.jobspec import JobSpec, spec_to_proto
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def raw_limits(client: pbg.ClientStub) -> dict[str, float]:
    """What the pipeline is made of, measured here and now."""
    rtts = []
    for _ in range(200):
        t = time.perf_counter()
        client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
        rtts.append(time.perf_counter() - t)
    spawn = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import gpurm.am.runner"], check=True)
        spawn.append(time.perf_counter() - t)
    true_spawn = []
    for _ in range(20):
        t = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", "true"], check=True)
        true_spawn.append(time.perf_counter() - t)
    return {"grpc_unary_rtt_ms": statistics.median(rtts) * 1000,
            "am_interpreter_start_ms": statistics.median(spawn) * 1000,
            "sh_spawn_ms": statistics.median(true_spawn) * 1000}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20)
    args = ap.parse_args()
    port = free_port()
    state = Path(tempfile.mkdtemp(prefix="gpurm-bench-"))
    with open(state / "dev-cluster.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpurm.cli.main", "dev-cluster", "--nodes", "4",
                                 "--gpus-per-node", "8", "--racks", "2", "--port", str(port), "--state-dir",
                                 str(state), "--http-port", "0"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        while not (state / "cluster.json").exists() or not json.loads((state / "cluster.json").read_text())["ready"]:
            if proc.poll() is not None:
                raise SystemExit("dev cluster failed; see " + str(state / "dev-cluster.log"))
            time.sleep(0.1)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        client = pbg.ClientStub(channel)
        md = (("x-gpurm-user", getpass.getuser()),)
        limits = raw_limits(client)
        results: dict[int, dict[str, list[float]]] = {}
        for gpus in (1, 16):
            lat, am_part = [], []
            for i in range(args.jobs):
                spec = JobSpec(gpus=gpus, command=["/bin/sh", "-c", "sleep 0.2"], name=f"bench-{gpus}-{i}",
                               workdir="/tmp")
                job_id = client.SubmitJob(pb.SubmitJobRequest(spec=spec_to_proto(spec), submit_id=f"b{gpus}-{i}"),
                                          metadata=md, timeout=10).job_id
                while True:
                    job = client.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)
                    if job.state in (pb.JOB_SUCCEEDED, pb.JOB_FAILED, pb.JOB_KILLED):
                        break
                    time.sleep(0.02)
                if job.state != pb.JOB_SUCCEEDED:
                    raise SystemExit(f"{job_id} ended {pb.JobState.Name(job.state)}: {job.diagnostics}")
                lat.append((job.start_ms - job.submit_ms) / 1000)
                am_part.append((job.attempts[0].start_ms - job.submit_ms) / 1000)
                sys.stderr.write(f"\r{gpus}-GPU jobs: {i + 1}/{args.jobs}")
            sys.stderr.write("\n")
            results[gpus] = {"total": lat, "am": am_part}
        print(f"submit_latency: 4-node dev cluster (32 fake GPUs, 2 racks), {args.jobs} sequential jobs per size; "
              f"time from submit to every learner running (RM clock)")
        print(f"{'job':>8} {'p50':>8} {'p95':>8} {'max':>8}   {'submit->AM up p50':>18}")
        for gpus, r in results.items():
            t = r["total"]
            print(f"{gpus:>5}GPU {pct(t, .5) * 1000:>6.0f}ms {pct(t, .95) * 1000:>6.0f}ms {max(t) * 1000:>6.0f}ms   "
                  f"{pct(r['am'], .5) * 1000:>16.0f}ms")
        print("raw limits measured in this run: gRPC unary round trip p50 "
              f"{limits['grpc_unary_rtt_ms']:.2f} ms; a Python interpreter importing the AM "
              f"{limits['am_interpreter_start_ms']:.0f} ms; /bin/sh spawn {limits['sh_spawn_ms']:.1f} ms")
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
