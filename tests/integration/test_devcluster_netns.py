"""`gpurm dev-cluster --netns`: each agent and its learners in a network namespace of its own, named after the node,
with its own address on a bridge where the RM listens. The DDP example (configs/jobs/ddp-train.yaml, torchrun with
gloo) spans the two servers with MASTER_ADDR the first server's real address; the namespaces go when the cluster
stops, and those of a killed cluster at the next start. Needs root; the refusal without root is checked too."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpurm.cli import netns
from gpurm.proto import gpurm_pb2 as pb
from tests.integration.harness import ROOT, DevCluster

EXAMPLE = ROOT / "configs" / "jobs" / "ddp-train.yaml"
RENDEZVOUS = re.compile(r"rank (\d+) of 4 on (\S+): .*? rendezvous at ([\d.]+):(\d+)")
FINAL = re.compile(r"rank (\d+) final loss ([\d.]+) accuracy ([\d.]+) weights (-?[\d.]+)")
needs_root = pytest.mark.skipif(bool(netns.root_problem()), reason=netns.root_problem() or "needs root")


def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _ddp_job(tmp_path: Path) -> Path:
    text = EXAMPLE.read_text().replace("python3 ", f"{sys.executable} ").replace("--epochs 3", "--epochs 1")
    job_file = tmp_path / "ddp-train.yaml"
    job_file.write_text(text.replace("workdir: .", f"workdir: {EXAMPLE.parent}"))
    return job_file


@pytest.mark.netns
@needs_root
def test_agents_in_namespaces_train_ddp_over_real_addresses_and_leave_nothing_behind(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.fail("torch is missing: run ./scripts/setup-venv (it installs the torch extra)", pytrace=False)
    state = tmp_path / "dev"
    c = DevCluster(state, nodes=2, gpus_per_node=2, racks=1, extra=["--netns"])
    try:
        net = c.info["netns"]
        name = net["cluster"]
        agents = {a["node_id"]: a for a in c.info["agents"]}
        assert {a["namespace"] for a in agents.values()} == {f"gpurm-{name}-node-1", f"gpurm-{name}-node-2"}
        assert set(netns.leftovers(name)) == {a["namespace"] for a in agents.values()}
        addresses = {n: a["address"] for n, a in agents.items()}
        assert len(set(addresses.values())) == 2 and net["gateway"] not in addresses.values()
        assert c.address.startswith(f"{net['gateway']}:")          # the RM listens on the bridge
        mine = _netns_of(os.getpid())
        assert len({_netns_of(a["pid"]) for a in agents.values()} | {mine}) == 3   # one each, not ours
        assert {n.node_id: n.host for n in c.nodes()} == addresses  # the RM dials each at its own address

        job_id = c.submit(str(_ddp_job(tmp_path)))
        job = c.wait_job(job_id, timeout=240)
        assert job.state == pb.JOB_SUCCEEDED, (job.diagnostics, c.gpurm("logs", job_id).out[-3000:])
        learners = job.attempts[-1].learners
        assert len({ln.node_id for ln in learners}) == 2
        out = "".join(c.gpurm("logs", job_id, "--rank", str(ln.rank)).out for ln in learners)
        meets = {int(m.group(1)): m.groups()[1:] for m in RENDEZVOUS.finditer(out)}
        assert sorted(meets) == [0, 1, 2, 3], out[-3000:]
        master = {m[1] for m in meets.values()}
        rank0_node = next(ln.node_id for ln in learners if ln.rank == 0)
        assert master == {addresses[rank0_node]}, (master, addresses)   # a real address, not 127.0.0.1
        finals = {int(m.group(1)): m.group(4) for m in FINAL.finditer(out)}
        assert sorted(finals) == [0, 1, 2, 3] and len(set(finals.values())) == 1, finals
    finally:
        assert c.stop() == 0, c.log_text()
    assert netns.leftovers(name) == [], "the namespaces outlived the dev cluster"

    # A killed dev cluster leaves its namespaces; the next one removes them before it starts.
    again = DevCluster(state, nodes=1, gpus_per_node=1, racks=1, extra=["--netns"])
    again.proc.send_signal(signal.SIGKILL)
    again.proc.wait(10)
    assert netns.leftovers(name) == [f"gpurm-{name}-node-1"]
    third = DevCluster(state, nodes=1, gpus_per_node=1, racks=1, extra=["--netns"])
    try:
        assert "removed the network a killed dev cluster left" in third.log_text()
        assert json.loads((state / "cluster.json").read_text())["ready"]
    finally:
        assert third.stop() == 0, third.log_text()
    assert netns.leftovers(name) == []


def test_without_root_netns_is_refused_with_what_is_needed(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gpurm.cli.main", "dev-cluster", "--netns", "--state-dir", str(tmp_path / "d")]
    if os.geteuid() == 0:
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
        tmp_path.chmod(0o777)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 2, done.stderr
    assert "--netns: network namespaces need root" in done.stderr and "sudo" in done.stderr
