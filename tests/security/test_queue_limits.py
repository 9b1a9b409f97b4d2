"""A 100k-queue refresh stalled the RM for 27 s. Now a queue config has limits (text size, number of queues,
depth, name length, ACL lists); a config over one is refused naming the limit and the old config runs on; and a
big config is parsed off the event loop, so other clients are served meanwhile. Real RM over real gRPC."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from gpurm.proto import gpurm_pb2 as pb
from gpurm.queues.config import MAX_ACL_ENTRIES, MAX_DEPTH, MAX_NAME, MAX_QUEUES, MAX_YAML_BYTES
from gpurm.rm.server import paging
from tests.conftest import TestBroker
from tests.integration.rmproc import RMProcess


def many(n: int) -> str:
    return "queues:\n" + "".join(f"  q{i}:\n    weight: 1\n    acl: {{submit: ['*']}}\n" for i in range(n))


def nested(depth: int) -> str:
    text, indent = "queues:\n", "  "
    for level in range(depth):
        text += f"{indent}l{level}:\n"
        if level < depth - 1:
            text += f"{indent}  queues:\n"
            indent += "    "
    return text + f"{indent}  acl: {{submit: ['*']}}\n"


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    proc = RMProcess(tmp_path_factory.mktemp("queue-limits"), broker)
    yield proc
    proc.close()


def refresh(rm: RMProcess, text: str) -> pb.RefreshQueuesResponse:
    reply: pb.RefreshQueuesResponse = rm.admin.RefreshQueues(pb.RefreshQueuesRequest(yaml=text),
                                                             metadata=rm.metadata, timeout=60)
    return reply


def queue_paths(rm: RMProcess) -> list[str]:
    return [q.path for q in paging.fetch_all(lambda r: rm.client.ListQueues(r, timeout=30), pb.ListQueuesRequest(),
                                             "queues")]


@pytest.mark.parametrize(("text", "named"), [
    ("queues:\n  a: {acl: {submit: ['*']}}\n#" + "x" * MAX_YAML_BYTES + "\n", f"larger than {MAX_YAML_BYTES} bytes"),
    (many(MAX_QUEUES + 1), f"more than {MAX_QUEUES} queues"),
    ("queues: {" + ", ".join(f"q{i}: " for i in range(100_000)) + "}\n", f"more than {MAX_QUEUES} queues"),
    (nested(MAX_DEPTH + 2), f"nest at most {MAX_DEPTH} levels"),
    ("queues:\n  " + "n" * (MAX_NAME + 1) + ": {acl: {submit: ['*']}}\n", f"at most {MAX_NAME} of them"),
    ("queues:\n  a:\n    acl:\n      submit: [" + ", ".join(f"u{i}" for i in range(MAX_ACL_ENTRIES + 1)) + "]\n",
     f"at most {MAX_ACL_ENTRIES}"),
], ids=["text-size", "queues", "100k-queues", "depth", "name", "acl-list"])
def test_a_config_over_a_limit_is_refused_naming_it_and_the_old_one_stays(rm: RMProcess, text: str,
                                                                          named: str) -> None:
    before = queue_paths(rm)
    reply = refresh(rm, text)
    assert not reply.applied
    assert any(named in e for e in reply.errors), reply.errors
    assert queue_paths(rm) == before


def test_a_big_refresh_does_not_stall_other_clients(rm: RMProcess) -> None:
    text = many(MAX_QUEUES)
    result: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        result["reply"] = refresh(rm, text)
        result["took"] = time.monotonic() - t0

    worker = threading.Thread(target=run)
    worker.start()
    worst = 0.0
    while worker.is_alive():
        t0 = time.monotonic()
        rm.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=30)
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    worker.join()
    reply = result["reply"]
    assert isinstance(reply, pb.RefreshQueuesResponse) and reply.applied, reply
    took = float(result["took"])   # type: ignore[arg-type]
    assert len(queue_paths(rm)) == MAX_QUEUES + 1
    assert worst < took / 2, f"another client waited {worst:.2f}s during a {took:.2f}s refresh"
