"""`gpurm logs -f` without any log topic on the broker (agents publish nothing): the CLI polls GetLogs through
the RM by offset, so every byte a learner writes is printed once, in order, and it stops when the job ends.
Real RM, real agent (fake GPUs), the session's broker with credentials, the real CLI."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import TestBroker
from tests.integration.harness import ROOT
from tests.integration.rmproc import AgentProcess, RMProcess

LINES = 40
CHUNK = 5000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    work = tmp_path_factory.mktemp("logs-follow")
    rm = RMProcess(work / "rm", broker, heartbeat="1s")
    agent = AgentProcess(work / "agent", rm, "logs-node", gpus={"fake": 2})
    try:
        agent.start()
        yield rm
    finally:
        agent.close()
        assert rm.close() == 0, rm.log_text()


def test_follow_prints_every_byte_once_while_the_job_writes(cluster: RMProcess) -> None:
    # ~200 KB over ~2 s: many GetLogs polls land mid-stream, some mid-line.
    script = (f"for i in $(seq 1 {LINES}); do echo line $i; head -c {CHUNK} /dev/zero | tr '\\0' x; echo; "
              "sleep 0.05; done")
    job_id = cluster.submit(script, gpus=1)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "logs", job_id, "-f", "--rm", cluster.address],
                          cwd=ROOT, capture_output=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    expected = b"".join(b"line %d\n" % i + b"x" * CHUNK + b"\n" for i in range(1, LINES + 1))
    assert done.stdout == expected                                   # nothing lost, nothing twice, in order
    assert b"SUCCEEDED" in done.stderr
    assert cluster.job(job_id).state == pb.JOB_SUCCEEDED
    assert time.monotonic() - started < 60                           # it stopped when the job ended
