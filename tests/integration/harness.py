"""Drives a real `gpurm dev-cluster` (RM + agents as separate processes on loopback) and the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.rm.server import paging
from tests.conftest import TestBroker, free_port

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = (pb.JOB_SUCCEEDED, pb.JOB_FAILED, pb.JOB_KILLED)
# AMs call allocate every 100 ms while acquiring and every 400 ms otherwise (500 ms and 2 s by default): a job's
# end, a grant or a preemption notice reaches its AM sooner (at 250 ms / 1 s the dev-cluster tests took 13% longer,
# for no less CPU: their AMs are few). A test's own --rm-option comes later and wins (the in-queue test keeps the
# default its graces are chosen around; the chaos run, with 50 AMs, uses RMProcess).
TEST_RM_OPTIONS = ("--rm-option", "am.allocate_interval=100ms")


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class DevCluster:
    def __init__(self, state_dir: Path, nodes: int = 3, gpus_per_node: int = 8, racks: int | None = 2,
                 broker: TestBroker | None = None, extra: Iterable[str] = ()) -> None:
        """`racks` None: the command's default (--racks not given)."""
        self.state_dir = state_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "gpurm.cli.main", "dev-cluster", "--nodes", str(nodes), "--gpus-per-node",
                str(gpus_per_node), *(["--racks", str(racks)] if racks is not None else []), "--state-dir",
                str(state_dir), "--port", str(self.port), "--http-port", "0", *TEST_RM_OPTIONS, *extra]
        if broker is not None:
            args += broker.dev_cluster_args()
        state_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (state_dir / "cluster.json").unlink()   # an earlier cluster's, ready: not this one's
        self.log = open(state_dir / "dev-cluster.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self._wait_ready()
        self.address = str(self.info.get("rm_address") or self.address)   # --netns: the RM listens on its bridge
        self.channel = grpc.insecure_channel(self.address)
        self.client = pbg.ClientStub(self.channel)

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        path = self.state_dir / "cluster.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dev-cluster exited {self.proc.returncode}:\n{self.log_text()}")
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_text()).get("ready"):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"dev-cluster not ready after {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        return (self.state_dir / "dev-cluster.log").read_text(errors="replace")

    @property
    def info(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "cluster.json").read_text())
        return data

    @property
    def http_url(self) -> str:
        """The RM's web UI and REST API (the dev cluster asks for a free port)."""
        return str(self.info.get("http_url", ""))

    def agent_pid(self, node_id: str) -> int:
        return next(int(a["pid"]) for a in self.info["agents"] if a["node_id"] == node_id)

    # -- the real CLI, as a user runs it
    def gpurm(self, *args: str, input_text: str | None = None, cwd: Path | None = None,
              env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
        full_env = {**os.environ, "GPURM_RM": self.address, **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], capture_output=True, text=True,
                              input=input_text, cwd=cwd or ROOT, env=full_env, timeout=timeout, check=False)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def submit(self, *args: str) -> str:
        r = self.gpurm("submit", *args)
        assert r.code == 0, r.err
        return r.out.strip()

    # -- direct reads for waiting
    def job(self, job_id: str) -> pb.Job:
        return self.client.GetJob(pb.GetJobRequest(job_id=job_id), timeout=10)

    def wait_job(self, job_id: str, states: Iterable[int] = TERMINAL, timeout: float = 60) -> pb.Job:
        wanted = set(states)
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.state in wanted:
                return job
            time.sleep(0.1)
        raise TimeoutError(f"{job_id} is {pb.JobState.Name(job.state)} after {timeout}s: {job.waiting_reason} "
                           f"{job.diagnostics}")

    def job_pids(self, job_id: str) -> list[int]:
        """Live processes of a job on this cluster: members of the process groups its agents recorded."""
        pgids = set()
        for record in self.state_dir.glob("agents/*/containers/*/record.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(record.read_text())
                if data.get("job_id") == job_id and data.get("pgid"):
                    pgids.add(int(data["pgid"]))
        return [pid for pid, pgid in process_groups() if pgid in pgids]

    def nodes(self) -> list[pb.NodeInfo]:
        return paging.fetch_all(lambda r: self.client.ListNodes(r, timeout=10), pb.ListNodesRequest(), "nodes")

    def stop(self) -> int:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def process_groups() -> list[tuple[int, int]]:
    """(pid, process group) of every live, non-zombie process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            out.append((int(entry.name), int(fields[2])))
    return out


def processes_with_env(key: str, value: str, *, prefix: bool = False) -> list[int]:
    """Pids of live processes whose environment has key=value (how we find a job's processes); `prefix`: a value
    that starts with `value`."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (any(v.startswith(needle) for v in env) if prefix else needle in env):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
