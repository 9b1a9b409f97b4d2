"""Clients that know several RMs (issue 19, active/standby): the list's first address is dead, the real RM second.

Real processes throughout: the real RM (RMProcess), a real agent whose agent.yaml `rm` is the list, the real CLI
with `--rm` / `GPURM_RM` lists, and a real job whose AM gets the agent's list as GPURM_RM and runs to SUCCEEDED.
The dead address is a port bound without listening for the whole module (connects are refused at once, and no
daemon can be handed the port meanwhile). A stand-in standby (a gRPC server that refuses every call as the
contract says a standby RM will: UNAVAILABLE, "standby ...", `x-gpurm-leader`) checks that a hint is followed only
within the list.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpurm.common.rmlist import LEADER_KEY
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT
from tests.integration.rmproc import WAIT, AgentProcess, RMProcess, poll


class Standby(grpc.GenericRpcHandler):
    """Answers every unary call as a standby RM: UNAVAILABLE, details "standby ...", the leader it names."""

    def __init__(self, leader: str) -> None:
        self.leader = leader
        self.calls = 0

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        return grpc.unary_unary_rpc_method_handler(self._refuse)

    def _refuse(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        context.set_trailing_metadata(((LEADER_KEY, self.leader),))
        context.abort(grpc.StatusCode.UNAVAILABLE, f"standby: the leader is {self.leader}")
        raise AssertionError("abort returns only by raising")


@pytest.fixture(scope="module")
def dead() -> Iterator[str]:
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hold.bind(("127.0.0.1", 0))          # bound, never listening: connection refused, and the port stays ours
    try:
        yield f"127.0.0.1:{hold.getsockname()[1]}"
    finally:
        hold.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker,
            dead: str) -> Iterator[tuple[RMProcess, AgentProcess]]:
    work = tmp_path_factory.mktemp("rm-list")
    rm = RMProcess(work / "rm", broker, heartbeat="1s")
    try:
        agent = AgentProcess(work / "agent", rm, "list-node", gpus={"fake": 2}, mqtt={"advertise": broker.url},
                             rm_list=[dead, rm.address])
        try:
            agent.start()
            yield rm, agent
        finally:
            agent.close()
    finally:
        assert rm.close() == 0, rm.log_text()


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("GPURM_RM", "GPURM_RETRY_FOR")} | (env or {})
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_the_agent_registers_and_heartbeats_past_a_dead_first_rm(cluster: tuple[RMProcess, AgentProcess]) -> None:
    rm, agent = cluster
    first = rm.wait_node(agent.node_id).last_heartbeat_ms
    poll(lambda: rm.nodes()[agent.node_id].last_heartbeat_ms > first, 10, "no heartbeat after registering")
    assert rm.nodes()[agent.node_id].state == pb.NODE_RUNNING
    assert f"registered with the RM at {rm.address}" in agent.log_text()


def test_the_cli_works_with_a_dead_first_rm(cluster: tuple[RMProcess, AgentProcess], dead: str) -> None:
    rm, _agent = cluster
    started = time.monotonic()
    listed = cli("jobs", env={"GPURM_RM": f"{dead},{rm.address}", "GPURM_RETRY_FOR": "0"})
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""                    # a dead first RM is passed over silently, without a back-off
    assert time.monotonic() - started < 20
    submitted = cli("submit", "--gpus", "1", "--rm", f"{dead},{rm.address}", "--", "sh", "-c", "echo hello")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    job = rm.wait_job(job_id, timeout=60)
    assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
    # The AM got the agent's list (dead first) as GPURM_RM and went past the dead RM too.
    am_log = cli("logs", job_id, "--am", "--rm", f"{dead},{rm.address}")
    assert am_log.returncode == 0, am_log.stderr
    assert f"RM at {dead} did not answer as leader" in am_log.stdout, am_log.stdout


def test_with_no_rm_answering_the_cli_fails_at_once_listing_them(dead: str) -> None:
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hold.bind(("127.0.0.1", 0))
    other = f"127.0.0.1:{hold.getsockname()[1]}"
    try:
        started = time.monotonic()
        out = cli("jobs", "--rm", f"{dead},{other}", "--retry-for", "0")
        assert out.returncode == 3, out.stderr
        assert time.monotonic() - started < 20
        assert f"no RM answered as leader: tried {dead} (" in out.stderr and f"{other} (" in out.stderr
    finally:
        hold.close()


def test_a_bad_list_is_a_usage_error() -> None:
    out = cli("jobs", "--rm", "127.0.0.1:7070,,127.0.0.1:7071")
    assert out.returncode == 2 and "--rm: item 2 is empty" in out.stderr
    out = cli("jobs", env={"GPURM_RM": "127.0.0.1:7070,127.0.0.1:7070"})
    assert out.returncode == 2 and "GPURM_RM: '127.0.0.1:7070' is listed twice" in out.stderr


def test_a_standby_hint_is_followed_only_within_the_list(cluster: tuple[RMProcess, AgentProcess],
                                                         dead: str) -> None:
    rm, _agent = cluster
    standby = Standby(leader=rm.address)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[standby])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        # The standby first, the leader it names last: the CLI goes straight to it (the dead RM between is skipped).
        out = cli("jobs", "--rm", f"127.0.0.1:{port},{dead},{rm.address}", "--retry-for", "0")
        assert out.returncode == 0, out.stderr
        assert standby.calls >= 1
        # A standby naming a leader outside the list: not followed, whatever answers there.
        out = cli("jobs", "--rm", f"127.0.0.1:{port},{dead}", "--retry-for", "0")
        assert out.returncode == 3, out.stderr
        assert f"127.0.0.1:{port} (standby, leader {rm.address})" in out.stderr
    finally:
        server.stop(0)


def test_an_agent_follows_a_standby_to_the_leader_it_names(cluster: tuple[RMProcess, AgentProcess], dead: str,
                                                            tmp_path: Path) -> None:
    rm, _agent = cluster
    standby = Standby(leader=rm.address)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[standby])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    # The standby first, a dead RM next, the leader last: the agent goes from the standby straight to the leader.
    agent = AgentProcess(tmp_path / "agent", rm, "standby-node", gpus={"fake": 1},
                         rm_list=[f"127.0.0.1:{port}", dead, rm.address])
    try:
        agent.start()
        assert standby.calls >= 1
        assert f"is a standby: following it to the leader at {rm.address}" in agent.log_text()
        # The RM lists the node as it answers; the agent logs its registration when the answer arrives.
        poll(lambda: f"registered with the RM at {rm.address}" in agent.log_text(), WAIT, agent.log_text)
        assert f"at {dead}" not in agent.log_text()       # the dead RM between them was skipped
    finally:
        agent.close()
        server.stop(0)


def test_an_agent_told_to_give_up_names_every_rm_it_tried(tmp_path: Path, dead: str) -> None:
    hold = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hold.bind(("127.0.0.1", 0))
    other = f"127.0.0.1:{hold.getsockname()[1]}"
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node_id": "n", "state_dir": str(tmp_path / "s"), "listen": "127.0.0.1:0",
                                      "rm": [dead, other], "gpus": {"fake": 1}, "node_secret": "ab" * 32,
                                      "rm_retry": {"base": "100ms", "max": "500ms", "give_up_after": "2s"}}))
    try:
        done = subprocess.run([sys.executable, "-m", "gpurm.nodeagent", "--config", str(config)], cwd=ROOT,
                              capture_output=True, text=True, timeout=WAIT, check=False)
    finally:
        hold.close()
    assert done.returncode == 3, done.stderr
    assert f"the RMs {dead} (" in done.stderr and f"{other} (" in done.stderr, done.stderr
    assert "have been unreachable for" in done.stderr
