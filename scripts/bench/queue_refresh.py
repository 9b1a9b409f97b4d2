"""Queue refresh on a real RM (see queue_refresh): validate+swap time, other clients' latency, refusal speed."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import yaml

from gpurm.common.fields import ConfigError
from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.queues.config import MAX_QUEUES, MAX_YAML_BYTES, parse_queues

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def block_config(n: int, weight: int = 1) -> str:
    """n leaf queues, each with a weight and an ACL (block style, as people write them)."""
    return "queues:\n" + "".join(f"  q{i}:\n    weight: {weight}\n    acl: {{submit: ['*']}}\n" for i in range(n))


def flow_config(n: int) -> str:
    """n bare queues in flow style: the most queues that fit in the size limit."""
    return "acl: {submit: ['*']}\nqueues: {" + ", ".join(f"q{i}: " for i in range(n)) + "}\n"


class Pinger:
    """Another client: GetClusterInfo in a loop, recording each call's latency."""

    def __init__(self, client: pbg.ClientStub) -> None:
        self.client = client
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            self.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=120)
            self.latencies.append(time.perf_counter() - t)
            time.sleep(0.005)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def refresh(admin: pbg.AdminStub, text: str, md: tuple[tuple[str, str], ...]) -> tuple[float, bool, list[str]]:
    t = time.perf_counter()
    try:
        reply = admin.RefreshQueues(pb.RefreshQueuesRequest(yaml=text), metadata=md, timeout=300)
    except grpc.RpcError as exc:
        return time.perf_counter() - t, False, [f"the call failed: {exc.code().name}: {exc.details()}"]
    return time.perf_counter() - t, reply.applied, list(reply.errors)


def start_rm(state: Path, env: dict[str, str] | None) -> tuple[subprocess.Popen[bytes], int]:
    state.mkdir(parents=True)
    port = free_port()
    config = state / "rm.yaml"
    config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "state_dir": str(state / "rm"),
                                      "http": {"listen": "127.0.0.1:0"},
                                      "admins": [getpass.getuser()]}))
    with open(state / "rm.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gpurm.cli.main", "rm", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=state, env=env)
    pidfile = state / "rm" / "rm.json"
    while True:
        try:
            if json.loads(pidfile.read_text()).get("pid") == proc.pid:
                return proc, port
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the RM failed; see {state / 'rm.log'}")
        time.sleep(0.05)


def measure(state: Path, queues: int, repeat: int, env: dict[str, str] | None) -> dict[str, object]:
    """Everything, against one RM (this tree's, or the one `env` points PYTHONPATH at)."""
    proc, port = start_rm(state, env)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 16 << 20),
                                                                        ("grpc.max_receive_message_length", 64 << 20)])
        client, admin = pbg.ClientStub(channel), pbg.AdminStub(channel)
        md = (("x-gpurm-user", getpass.getuser()),)
        rtts = []
        for _ in range(200):
            t = time.perf_counter()
            client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
            rtts.append(time.perf_counter() - t)
        configs = [block_config(queues, w) for w in (1, 2)]
        swaps, worst, p99 = [], [], []
        for i in range(repeat):
            with Pinger(client) as pinger:
                took, applied, errors = refresh(admin, configs[i % 2], md)
            if not applied:
                raise SystemExit(f"refresh refused: {errors[:3]}")
            swaps.append(took)
            lat = sorted(pinger.latencies)
            worst.append(lat[-1])
            p99.append(lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))])
        big: dict[str, tuple[int, float, float, str]] = {}
        for name, text in (("100k queues, block style", block_config(100_000)),
                           ("100k queues, flow style", flow_config(100_000))):
            with Pinger(client) as pinger:
                took, applied, errors = refresh(admin, text, md)
            outcome = "APPLIED" if applied else f"refused: {errors[0][:80] if errors else ''}"
            big[name] = (len(text.encode()), took, max(pinger.latencies, default=0.0), outcome)
        channel.close()
        return {"rtt": statistics.median(rtts), "swaps": swaps, "worst": max(worst), "p99": max(p99), "big": big,
                "config_kib": len(configs[0].encode()) / 1024}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def report(label: str, r: dict[str, object], queues: int) -> None:
    swaps = r["swaps"]
    assert isinstance(swaps, list)
    print(f"== {label}")
    print(f"  validate+swap of {queues} queues over gRPC (RefreshQueues round trip): median "
          f"{statistics.median(swaps) * 1000:.0f} ms, max {max(swaps) * 1000:.0f} ms")
    print(f"  another client meanwhile (GetClusterInfo every 5 ms): worst {float(r['worst']) * 1000:.0f} ms, "  # type: ignore[arg-type]
          f"p99 {float(r['p99']) * 1000:.0f} ms")  # type: ignore[arg-type]
    big = r["big"]
    assert isinstance(big, dict)
    for name, (size, took, worst, outcome) in big.items():
        print(f"  {name} ({size / 1024:.0f} KiB): {took * 1000:.0f} ms, another client waited up to "
              f"{worst * 1000:.0f} ms; {outcome}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=MAX_QUEUES)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", metavar="DIR",
                    help="also measure an RM run from another source tree laid out as the gpurm namespace (DIR/gpurm/"
                         "rm ...), e.g. an older commit, for a before/after comparison")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpurm-bench-"))
    t = time.perf_counter()
    parse_queues(block_config(args.queues))
    parse_s = time.perf_counter() - t
    t = time.perf_counter()
    try:
        parse_queues(flow_config(100_000))
    except ConfigError:
        pass
    refuse_s = time.perf_counter() - t
    runs = []
    if args.before:
        env = {**os.environ, "PYTHONPATH": str(Path(args.before).resolve())}
        runs.append((f"before: the RM from {args.before}", measure(work / "before", args.queues, args.repeat, env)))
    runs.append(("after: this tree's RM", measure(work / "after", args.queues, args.repeat, None)))
    print(f"queue_refresh: a real RM (no agents); {args.queues} leaf queues each with a weight and an ACL "
          f"({float(runs[-1][1]['config_kib']):.0f} KiB of YAML), {args.repeat} refreshes alternating two configs")  # type: ignore[arg-type]
    for label, r in runs:
        report(label, r, args.queues)
    print(f"raw limits measured in this run: gRPC unary round trip p50 {float(runs[-1][1]['rtt']) * 1000:.2f} ms; "  # type: ignore[arg-type]
          f"parse+validate of the {args.queues}-queue YAML in-process {parse_s * 1000:.0f} ms; a 100k-queue flow "
          f"config refused in-process in {refuse_s * 1000:.0f} ms (reading stops at queue {MAX_QUEUES + 1}; over "
          f"{MAX_YAML_BYTES >> 20} MiB is refused before reading)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
