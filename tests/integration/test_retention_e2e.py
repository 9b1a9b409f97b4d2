"""Retention of finished jobs on a real RM (rm.yaml retention; rm/state/retention.py): a store holding jobs that
finished
days ago (as an RM of an earlier version, or one down for a while, left it). On start the RM retires them from
memory batch by batch; `GetJob` still answers for those within `retention.store` (from the store), says where to
look for older ones, `GetAccounting` totals count every job, and a restart loads only the jobs kept in memory."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import grpc
import pytest

from gpurm.common.jobspec import JobSpec
from gpurm.common.model import Container, ContainerKind, ContainerPhase, Job, JobState
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.storage.store import SqliteStore
from tests.conftest import TestBroker
from tests.integration.rmproc import RMProcess, poll

DAY = 86400.0


def old_job(n: int, finish: float) -> tuple[Job, Container]:
    job = Job(f"job-{n}", JobSpec(gpus=2, command=["train"]), "alice" if n % 2 else "bob", "root.default",
              finish - 3600, seq=n, state=JobState.SUCCEEDED, start_time=finish - 3000, finish_time=finish,
              attained_gpu_s=6000.0)
    c = Container(f"job-{n}-c1", job.job_id, ContainerKind.LEARNER, "gone-node", [0, 1], 1, created=finish - 3000,
                  phase=ContainerPhase.COMPLETED, started=finish - 3000, finished=finish)
    return job, c


def acct_total(rm: RMProcess) -> tuple[int, float]:
    reply = rm.client.GetAccounting(pb.AccountingRequest(), metadata=rm.metadata, timeout=10)
    return reply.total.jobs, round(reply.total.gpu_seconds, 1)


def test_old_finished_jobs_leave_memory_and_stay_counted(tmp_path: Path, broker: TestBroker) -> None:
    now = time.time()
    # 40 jobs finished 2 days ago (past retention.memory: 1h), 5 finished 40 days ago (past retention.store: 30d),
    # 3 finished a minute ago (kept in memory).
    records = [old_job(n, now - 2 * DAY + n) for n in range(1, 41)]
    records += [old_job(n, now - 40 * DAY + n) for n in range(41, 46)]
    records += [old_job(n, now - 60 + n) for n in range(46, 49)]
    store = SqliteStore(tmp_path / "rm" / "rm-state" / "state.db")
    store.save([j for j, _ in records], [c for _, c in records], [], {"next_job_seq": "49", "next_container_seq": "1"})
    store.close()

    rm = RMProcess(tmp_path / "rm", broker, retention={"memory": "1h", "store": "30d", "batch": 10})
    try:
        def listed() -> list[str]:
            return [j.job_id for j in rm.client.ListJobs(pb.ListJobsRequest(), metadata=rm.metadata, timeout=10).jobs]

        poll(lambda: sorted(listed()) == ["job-46", "job-47", "job-48"], 30, lambda: f"jobs in memory: {listed()}")
        assert acct_total(rm) == (48, 48 * 6000.0)
        kept = rm.client.GetJob(pb.GetJobRequest(job_id="job-7"), metadata=rm.metadata, timeout=10)
        assert kept.job_id == "job-7" and kept.state == pb.JOB_SUCCEEDED and kept.user == "alice"
        with pytest.raises(grpc.RpcError) as err:
            rm.client.GetJob(pb.GetJobRequest(job_id="job-42"), metadata=rm.metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "job-42 finished (SUCCEEDED)" in str(err.value.details()) and "gpurm acct" in str(err.value.details())
        db = sqlite3.connect(rm.state_dir / "state.db")
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 3
        assert db.execute("SELECT COUNT(*) FROM retired").fetchone()[0] == 40
        assert db.execute("SELECT COUNT(*) FROM finished").fetchone()[0] == 45
        db.close()

        rm.stop()
        rm.start()
        assert sorted(listed()) == ["job-46", "job-47", "job-48"]       # only what memory keeps was loaded
        assert acct_total(rm) == (48, 48 * 6000.0)
        assert "3 jobs (0 live)" in rm.log_text()
    finally:
        assert rm.close() == 0, rm.log_text()
