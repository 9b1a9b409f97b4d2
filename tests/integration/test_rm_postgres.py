"""A real RM on a PostgreSQL store (rm.yaml `store: {url: postgresql://...}`; a throwaway server, tests/pg.py): a job
it acknowledged survives a SIGKILL of the RM, a second RM pointed at the same database is refused, and when the
server drops the RM's sessions a write fails UNAVAILABLE (never acknowledged) and the RM takes writes again."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import psycopg
import pytest

from gpurm.proto import gpurm_pb2 as pb
from gpurm.proto import gpurm_pb2_grpc as pbg
from tests.conftest import TestBroker
from tests.integration.rmproc import TERMINAL, USER, RMProcess, poll


def registration(node_id: str) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id, host="127.0.0.1", agent_port=1, rack="rack-1", ib_domain="ib-1",
        gpus=[pb.GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model="fake", memory_mib=16000, healthy=True)
              for i in range(2)],
        cpus=8, memory_mib=64000, agent_version="test", agent_instance=uuid.uuid4().hex, healthy=True)


def submitted(rm: RMProcess) -> str | None:
    try:
        return rm.submit("true", gpus=1)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None


def test_a_job_survives_a_sigkill_of_an_rm_on_postgresql(tmp_path: Path, broker: TestBroker, pg_url: str) -> None:
    rm = RMProcess(tmp_path / "rm", broker, store={"url": pg_url})
    try:
        # A node with no agent behind it (its AM launches fail): the job is acknowledged, and never ends.
        tracker = pbg.ResourceTrackerStub(rm.channel)
        tracker.RegisterNode(rm.prove(registration("pg-node")), timeout=10)
        job_id = rm.submit("true", gpus=1)
        rm.kill()
        assert not (rm.state_dir / "state.db").exists()       # nothing went to SQLite
        rm.start()
        job = rm.job(job_id)
        assert job.job_id == job_id and job.user == USER and job.state not in TERMINAL
        assert "pg-node" in rm.nodes()                        # the node came back from the store too
        assert rm.submit("true", gpus=1) != job_id            # and the job counter
        assert f"store {pg_url}: 1 jobs" in rm.log_text()
        with pytest.raises(RuntimeError, match="is in use by another RM"):
            RMProcess(tmp_path / "rm2", broker, store={"url": pg_url})
        # The server drops the RM's sessions: a write fails (never acknowledged), then the RM reconnects, takes
        # its lock again and writes again.
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                          "'gpurm-rm' AND pid <> pg_backend_pid()")
        with pytest.raises(grpc.RpcError) as refused:
            rm.submit("true", gpus=1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the RM's store cannot be written" in str(refused.value.details())
        after = poll(lambda: submitted(rm), 20, lambda: f"the RM takes no writes again:\n{rm.log_text()[-3000:]}")
        assert rm.job(after).state not in TERMINAL and rm.job(job_id).state not in TERMINAL
        with pytest.raises(RuntimeError, match="is in use by another RM"):
            RMProcess(tmp_path / "rm3", broker, store={"url": pg_url})
    finally:
        assert rm.close() == 0, rm.log_text()
