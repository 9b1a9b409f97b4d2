"""Small agent parts without processes or sockets: records, container ids, port quarantine, back-off, env."""

from __future__ import annotations

import random
import sys

import pytest

from gpurm.nodeagent.backoff import Backoff
from gpurm.nodeagent.containers import leader_first
from gpurm.nodeagent.launch import container_argv, container_env
from gpurm.nodeagent.ports import PortReserver
from gpurm.nodeagent.records import ContainerRecord, safe_container_id
from gpurm.nodeagent.shim import describe_exec_error
from gpurm.proto import gpurm_pb2 as pb


def test_record_json_round_trip() -> None:
    rec = ContainerRecord(container_id="c1", job_id="j1", kind=pb.CONTAINER_LEARNER,
                          state=pb.CONTAINER_EXITED, gpu_indices=[0, 3], node_id="n1", pid=42, pgid=42,
                          signal=9, stopped=True, start_ms=1, end_ms=2, version=5)
    data = rec.to_json()
    assert data["state"] == "CONTAINER_EXITED" and data["kind"] == "CONTAINER_LEARNER"
    assert ContainerRecord.from_json(data) == rec
    assert ContainerRecord.from_json({**data, "added_later": 1}) == rec  # newer fields are ignored
    status = rec.to_proto()
    assert (status.node_id, status.signal, status.stopped) == ("n1", 9, True)
    assert list(status.gpu_indices) == [0, 3]
    assert rec.terminal and not rec.live


@pytest.mark.parametrize("cid,ok", [("c-1", True), ("job_1.r0:a2", True), ("..", False), ("a/b", False),
                                    ("", False), (".hidden", False), ("a..b", False), ("x" * 201, False)])
def test_container_ids_that_can_be_directory_names(cid: str, ok: bool) -> None:
    assert safe_container_id(cid) is ok


class ScriptedPorts(PortReserver):
    """The OS's answers, scripted: the quarantine logic without binding sockets."""

    def __init__(self, answers: list[int]) -> None:
        self.now = 0.0
        super().__init__("127.0.0.1", quarantine_s=60.0, clock=lambda: self.now)
        self.answers = answers

    def _probe(self) -> int:
        return self.answers.pop(0)


def test_port_quarantine() -> None:
    ports = ScriptedPorts([5000, 5000, 5000, 5001, 5000])
    assert ports.reserve() == 5000
    assert ports.reserve() == 5001  # the OS offered 5000 twice more: still quarantined
    ports.now = 61.0
    assert ports.reserve() == 5000  # after the window it may be handed out again


def test_port_quarantine_gives_up_with_a_reason() -> None:
    ports = ScriptedPorts([7000] * 60)
    ports.reserve()
    with pytest.raises(OSError, match="quarantine"):
        ports.reserve()


def test_backoff_doubles_with_jitter_and_caps() -> None:
    b = Backoff(0.2, 5.0, random.Random(1))
    delays = [b.next() for _ in range(10)]
    ceilings = [min(5.0, 0.2 * 2**i) for i in range(10)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays) <= 5.0
    b.reset()
    assert b.next() <= 0.2


def test_container_env_precedence() -> None:
    env = container_env(passthrough=["PATH", "TZ"], agent_env={"PATH": "/bin", "HOME": "/root"},
                        launch_env={"PATH": "/job/bin", "GPURM_GPUS": "0-7", "X": "1"}, container_id="c",
                        node_id="n", kind=pb.CONTAINER_LEARNER, gpu_indices=[4, 5])
    assert env == {"PATH": "/job/bin", "X": "1", "CUDA_VISIBLE_DEVICES": "4,5",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "GPURM_CONTAINER_ID": "c", "GPURM_NODE_ID": "n",
                   "GPURM_GPUS": "4,5"}
    am = container_env(passthrough=[], agent_env={}, launch_env={}, container_id="c", node_id="n",
                       kind=pb.CONTAINER_AM, gpu_indices=[1])
    assert am["CUDA_VISIBLE_DEVICES"] == "" and am["GPURM_GPUS"] == ""


def test_argv_and_exec_errors() -> None:
    assert container_argv(pb.CONTAINER_LEARNER, ["a", "b"]) == ["a", "b"]
    assert container_argv(pb.CONTAINER_AM, ["x"]) == [sys.executable, "-m", "gpurm.am", "x"]
    not_found = describe_exec_error(FileNotFoundError(2, "No such file"), "foo")
    assert not_found == "cannot start 'foo': command not found"
    assert "permission denied" in describe_exec_error(PermissionError(13, "denied"), "foo")


def test_the_commands_own_process_is_killed_before_its_children() -> None:
    assert leader_first({41, 7, 30, 12}, 30) == [30, 7, 12, 41]
    assert leader_first({41, 7}, 99) == [7, 41]        # the leader already gone: the rest, in a stable order
