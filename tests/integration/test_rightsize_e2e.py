"""Right-sizing end to end: the real RM and agent (fake GPUs) run a learner that goes through phases
(scripts/workloads/phased_learner.py); the agent samples it every 200 ms into its usage series, finds its phases,
and `gpurm status JOB` (table and JSON) shows them with the recommended request beside the GPU use."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurm.proto import gpurm_pb2 as pb
from gpurm.rightsize.phases import discover
from gpurm.rightsize.series import SERIES_FILE, parse_series
from tests.conftest import TestBroker
from tests.integration.harness import ROOT
from tests.integration.rmproc import WAIT, AgentProcess, RMProcess, poll

# Its learner's CPU phases (loading idle, training busy) must stand apart: not beside other CPU-heavy tests.
pytestmark = pytest.mark.whole_machine

LEARNER = ROOT / "scripts" / "workloads" / "phased_learner.py"


QUEUES = "queues:\n  default: {}\n  sized: {rightsize: on}\n"


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[RMProcess]:
    workdir = tmp_path_factory.mktemp("rightsize-rm")
    (workdir / "queues.yaml").write_text(QUEUES)
    proc = RMProcess(workdir, broker, heartbeat="1s", queues=str(workdir / "queues.yaml"))
    yield proc
    assert proc.close() == 0, proc.log_text()


def test_the_agent_records_each_containers_cpu_memory_and_gpu_series(rm: RMProcess, tmp_path: Path) -> None:
    node_id = f"rs-{uuid.uuid4().hex[:6]}"
    # A sample every 100 ms: on a loaded machine the training phase's CPU can sink near the loading phase's, and
    # the phases must then stand apart by memory alone, which takes enough samples per phase.
    agent = AgentProcess(tmp_path, rm, node_id, telemetry={"interval": "200ms", "container_interval": "100ms"})
    try:
        agent.start()
        # (Two CI-like runs found one phase: the first sample, taken before the GPU telemetry, had no GPU reading
        # and stood alone; rightsize/phases.py now fills and smooths it, tests/unit/test_rightsize_phases.py.)
        job_id = rm.submit(f"{sys.executable} {LEARNER} --scale 0.5 --epochs 2 --mem-mib 200")
        learner = rm.learner(job_id)

        def status(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "status", job_id, *args, "--rm",
                                   rm.address], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        # While it runs: the phases so far, and the request they suggest, under the learner table.
        out = poll(lambda: status() if "rank 0 phases: " in status() else None, WAIT,
                   lambda: f"no phases in `gpurm status {job_id}`:\n{status()}", every=0.3)
        line = next(x for x in out.splitlines() if "rank 0 phases: " in x)
        assert re.search(r"\d+ phases? \(.* cores/.*\); request \d+\.\d cores, \d+", line), line
        assert "util " in out                                 # the GPU use is still there beside it
        job = rm.wait_job(job_id, timeout=WAIT + 30)
        assert job.state == pb.JOB_SUCCEEDED, job
        series = parse_series((agent.state / "containers" / learner.container_id / SERIES_FILE).read_text())
        assert len(series) >= 10, series
        peak_mem = max(s.mem_mib for s in series)
        assert 180 <= peak_mem <= 600, peak_mem              # the 200 MiB buffer (+ interpreter), counted once
        # Training: two busy workers (on a shared 2-core machine they get what they get); loading: mostly idle.
        assert max(s.cpu for s in series) >= 0.4
        assert min(s.cpu for s in series) <= 0.2
        assert any(s.gpu is not None for s in series)        # the fake GPU's utilisation
        assert series[0].t < series[-1].t
        # The recorded series tells loading and training apart (by memory, whatever CPU the machine gave).
        found = discover(series)
        assert 2 <= len(found.phases) <= 4, (found.summary(), [(s.t, s.cpu, s.mem_mib) for s in series])
        # Ended: the last summary stays, in JSON too; by now it has seen loading and training apart.
        learner_json = json.loads(status("-o", "json"))["attempts"][-1]["learners"][0]
        assert learner_json["rightsize"].split(" ")[0] in ("2", "3", "4"), learner_json["rightsize"]
        assert "rightsize" not in agent.log_text()           # its queue is not `rightsize: on`
        assert agent.terminate() == 0
    finally:
        agent.close()


def test_a_rightsize_queue_limits_memory_per_phase_where_cgroup_v2_can(rm: RMProcess, tmp_path: Path) -> None:
    node_id = f"rs-{uuid.uuid4().hex[:6]}"
    agent = AgentProcess(tmp_path, rm, node_id, telemetry={"interval": "200ms", "container_interval": "200ms"})
    try:
        agent.start()
        spec = pb.JobSpec(name="sized", gpus=1, queue="sized", max_retries=0, command=[
            sys.executable, str(LEARNER), "--scale", "0.5", "--epochs", "2", "--mem-mib", "200"])
        job_id = rm.client.SubmitJob(pb.SubmitJobRequest(spec=spec, submit_id=uuid.uuid4().hex),
                                     metadata=rm.metadata, timeout=10).job_id
        learner = rm.learner(job_id)
        job = rm.wait_job(job_id, timeout=WAIT + 30)
        assert job.state == pb.JOB_SUCCEEDED, job
        record = json.loads((agent.state / "containers" / learner.container_id / "record.json").read_text())
        assert record["rightsize"] is True                    # the RM signed it into the container's token
        log = agent.log_text()
        if record["cgroup"] and "rightsize: memory.high" in log:
            assert f"container {learner.container_id} (job {job_id}): rightsize: memory.high" in log
        else:   # no cgroup v2 memory control here: said once, and the job ran unlimited
            assert log.count(f"container {learner.container_id} (job {job_id}): its queue has rightsize: on, "
                             "but") == 1, log
            assert "its phases are reported, its memory is not limited" in log
        assert agent.terminate() == 0
    finally:
        agent.close()
