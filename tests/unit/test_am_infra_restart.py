"""An AM that its server took down with it (a lost node, the agent's fence) does not use up the job's AM attempts
(as YARN-614): a job whose AM was fenced three times runs on; AMs failing on their own still fail it at the cap.
Pure: the RM core on a given clock."""

from __future__ import annotations

from gpurm.common.model import JobState
from gpurm.rm.state.core import ContainerReport, RMSettings
from tests.unit.test_rm_core import cluster, exited, launched, running, started_job


def fenced(cid: str) -> ContainerReport:
    return ContainerReport(cid, "EXITED", exit_code=143, stopped=True, infra_failure=True,
                           diagnostics="exited with code 143 after stop: fenced: no answer from the RM for 6.5s")


def test_fenced_ams_do_not_use_up_the_attempts_but_a_failing_am_still_does() -> None:
    core = cluster(1, settings=RMSettings(am_max_attempts=2))
    job = started_job(core, gpus=1)
    now = 2.0
    for attempt in (1, 2, 3):
        am = f"{job}-am{attempt}"
        core.node_heartbeat("n1", "s1", [fenced(am)], now)
        (relaunch,) = launched(core)
        assert relaunch.am_attempt == attempt + 1 and core.jobs[job].state is not JobState.FAILED
        core.node_heartbeat("n1", "s1", [running(relaunch.container_id)], now + 0.1)
        core.register_am(job, relaunch.am_attempt, now + 0.2)
        now += 1.0
    core.node_heartbeat("n1", "s1", [exited(f"{job}-am4", 1)], now)     # its own failure: the first
    (relaunch,) = launched(core)
    core.node_heartbeat("n1", "s1", [running(relaunch.container_id)], now + 0.1)
    core.register_am(job, relaunch.am_attempt, now + 0.2)
    assert core.jobs[job].state is not JobState.FAILED
    core.node_heartbeat("n1", "s1", [exited(relaunch.container_id, 1)], now + 1)   # the second: the cap
    assert core.jobs[job].state is JobState.FAILED and "AM failed 2 times" in core.jobs[job].diagnostics
