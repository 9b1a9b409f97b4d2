"""The RM core with an injected clock: jobs, the allocate protocol, node expiry, kill, AM restarts, restore."""

from __future__ import annotations

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.common.model import ContainerPhase, ExitKind, JobState, Learner
from gpurm.queues.tree import Policy
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.core import (
    AttemptUpdate,
    ContainerReport,
    ErrorCode,
    HeartbeatAction,
    JobChanged,
    LaunchAM,
    NodeRegistration,
    RequestError,
    RMCore,
    RMSettings,
)
from gpurm.rm.storage.store import MemoryStore


def reg(node_id: str, rack: str = "r1", gpus: int = 8, containers: list[ContainerReport] | None = None
        ) -> NodeRegistration:
    return NodeRegistration(node_id=node_id, host="127.0.0.1", port=9000, rack=rack, ib_domain=rack,
                            gpus=[GpuRecord(index=i) for i in range(gpus)], containers=containers or [])


def cluster(n: int = 2, gpus: int = 8, settings: RMSettings | None = None) -> RMCore:
    core = RMCore(settings or RMSettings(heartbeat_interval_s=1.0, missed_beats=3))
    for i in range(1, n + 1):
        core.register_node(reg(f"n{i}", gpus=gpus), f"s{i}", now=0.0)
    core.take_outbox()
    return core


def launched(core: RMCore) -> list[LaunchAM]:
    return [e for e in core.take_outbox() if isinstance(e, LaunchAM)]


def running(cid: str, pid: int = 100) -> ContainerReport:
    return ContainerReport(cid, "RUNNING", pid=pid)


def exited(cid: str, code: int = 0, stopped: bool = False) -> ContainerReport:
    return ContainerReport(cid, "EXITED", exit_code=code, stopped=stopped)


def restarted(core: RMCore, now: float) -> RMCore:
    """A new RM restored from what `core` stored (an RM restart)."""
    store = MemoryStore()
    store.save(core.jobs.values(), core.containers.values(), core.cluster.nodes.values(), core.meta())
    snap = store.load()
    again = RMCore()
    again.restore(snap.jobs, snap.containers, snap.nodes, snap.meta, now=now)
    return again


def started_job(core: RMCore, gpus: int = 8, now: float = 1.0) -> str:
    """Submit a job, bring its AM up and register it; return the job id."""
    job = core.submit(JobSpec(gpus=gpus, command=["x"]), "alice", now)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], now)
    core.register_am(job.job_id, launch.am_attempt, now)
    return job.job_id


def test_submit_queues_and_launches_an_am_on_the_least_loaded_node() -> None:
    core = cluster(2)
    a = core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0)
    b = core.submit(JobSpec(gpus=1, command=["x"]), "bob", 1.0)
    assert (a.job_id, b.job_id) == ("job-1", "job-2")
    assert a.state is JobState.QUEUED and a.queue == "root.default"
    nodes = {e.node_id for e in launched(core)}
    assert nodes == {"n1", "n2"}          # one AM per node: spread
    assert core.dirty.jobs == {"job-1", "job-2"}


def test_submit_rejections_name_the_field() -> None:
    core = cluster(2)
    with pytest.raises(RequestError) as info:
        core.submit(JobSpec(gpus=17, command=["x"]), "a", 1.0)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT and "gpus" in info.value.message and "16" in info.value.message
    with pytest.raises(RequestError) as info:
        core.submit(JobSpec(gpus=1, command=["x"], queue="nope"), "a", 1.0)
    assert "queue" in info.value.message
    assert core.jobs == {}


def test_submit_is_idempotent_by_submit_id() -> None:
    core = cluster(1)
    a = core.submit(JobSpec(gpus=1, command=["x"]), "a", 1.0, submit_id="abc")
    b = core.submit(JobSpec(gpus=1, command=["x"]), "a", 2.0, submit_id="abc")
    assert a is b and len(core.jobs) == 1


def test_allocate_grants_asked_nodes_and_retries_get_the_same_answer() -> None:
    core = cluster(2)
    job = started_job(core, gpus=16)
    asks = [Ask(gpus=8, node_id="n1"), Ask(gpus=8, node_id="n2")]
    r1 = core.allocate(job, 1, 0, asks, [], [], 2.0)
    assert sorted(g.node_id for g in r1.grants) == ["n1", "n2"]
    assert all(len(g.gpu_indices) == 8 for g in r1.grants)
    again = core.allocate(job, 1, 0, asks, [], [], 2.1)     # the AM never saw r1: it repeats the call
    assert again is r1
    r2 = core.allocate(job, 1, r1.response_id, [], [], [], 2.2)
    assert r2.grants == [] and core.cluster.free_gpus == 0


def test_grants_not_yet_seen_are_not_granted_twice() -> None:
    core = cluster(2)
    job = started_job(core, gpus=8)
    r = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0, schedule=False)   # pass deferred
    app = core.apps[job]
    core.schedule(2.1)                                # the deferred pass grants n1; the AM has not heard yet
    assert len(app.pending_grants) == 1
    # The AM repeats its unchanged ask: the grant it has not seen counts against it, so nothing more is granted.
    r = core.allocate(job, 1, r.response_id, [Ask(gpus=8, node_id="n1")], [], [], 2.2)
    assert len(r.grants) == 1 and core.cluster.free("n2") == 8 and core.cluster.free("n1") == 0


def test_container_lifecycle_reaches_the_am_and_frees_gpus() -> None:
    core = cluster(1)
    job = started_job(core, gpus=4)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    assert core.cluster.free("n1") == 4
    core.node_heartbeat("n1", "s1", [running(g.container_id, pid=42)], 3.0)
    assert core.containers[g.container_id].phase is ContainerPhase.RUNNING
    core.node_heartbeat("n1", "s1", [exited(g.container_id, 3)], 4.0)
    assert core.cluster.free("n1") == 8
    r = core.allocate(job, 1, 1, [], [], [], 4.1)
    assert [c.exit.exit_code for c in r.completed] == [3]


def test_attempt_reports_drive_job_state() -> None:
    core = cluster(1)
    job = started_job(core, gpus=1)
    assert core.jobs[job].state is JobState.ALLOCATING
    report = AttemptUpdate(1, JobState.RUNNING, learners=[Learner(0, "n1", [0], "c")], level="node")
    core.allocate(job, 1, 0, [], [], [report], 5.0)
    j = core.jobs[job]
    assert j.state is JobState.RUNNING and j.start_time == 5.0 and j.attempts[0].level == "node"
    core.finish_am(job, 1, JobState.SUCCEEDED, "ok", 0, [], 6.0)
    assert j.state is JobState.SUCCEEDED and j.finish_time == 6.0


def test_missed_heartbeats_make_a_node_lost_and_its_containers_lost() -> None:
    core = cluster(2)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 2.0).grants
    core.node_heartbeat("n2", "s2", [running(g.container_id)], 2.5)
    core.node_heartbeat("n1", "s1", [], 5.0)
    core.tick(5.4)        # n2's last beat was at 2.5: 2.9 s < 3 beats
    assert core.cluster.nodes["n2"].state.name == "RUNNING"
    core.tick(5.6)
    assert core.cluster.nodes["n2"].state.name == "LOST"
    c = core.containers[g.container_id]
    assert c.phase is ContainerPhase.COMPLETED and c.exit.kind is ExitKind.LOST and c.exit.infra
    r = core.allocate(job, 1, 1, [], [], [], 5.7)
    assert [x.container_id for x in r.completed] == [g.container_id]
    # The lost node's next beat is told to register again, which stops what it still runs.
    assert core.node_heartbeat("n2", "s2", [], 6.0) is HeartbeatAction.REREGISTER
    stops = core.register_node(reg("n2", containers=[running(g.container_id)]), "s2b", 6.1)
    assert [s.container_id for s in stops] == [g.container_id]


def test_kill_stops_every_container_but_keeps_gpus_until_the_agent_confirms() -> None:
    core = cluster(1)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 2.1)
    killed = core.kill(job, "alice", "wrong lr", 3.0)
    assert killed.state is JobState.KILLED and "alice" in killed.diagnostics
    orders = {o.container_id for o in core.take_stops("n1", 3.0)}
    assert orders == {g.container_id, f"{job}-am1"}
    assert core.cluster.free("n1") == 0                  # still held: the process may still be alive
    core.node_heartbeat("n1", "s1", [exited(g.container_id, -15, stopped=True), exited(f"{job}-am1", 143)], 4.0)
    assert core.cluster.free("n1") == 8 and core.live_count(job) == 0
    assert core.kill(job, "alice", "", 5.0).state is JobState.KILLED     # killing again changes nothing


def test_am_death_starts_a_new_am_then_fails_the_job_at_the_cap() -> None:
    core = cluster(1, settings=RMSettings(am_max_attempts=2))
    job = started_job(core, gpus=1)
    core.node_heartbeat("n1", "s1", [exited(f"{job}-am1", 1)], 2.0)
    (relaunch,) = launched(core)
    assert relaunch.am_attempt == 2 and core.jobs[job].state is not JobState.FAILED
    with pytest.raises(RequestError):
        core.allocate(job, 1, 0, [], [], [], 2.1)          # the old AM attempt is refused
    core.node_heartbeat("n1", "s1", [running(relaunch.container_id)], 2.2)
    core.register_am(job, 2, 2.3)
    core.node_heartbeat("n1", "s1", [exited(relaunch.container_id, 1)], 3.0)
    assert core.jobs[job].state is JobState.FAILED and "AM failed 2 times" in core.jobs[job].diagnostics


def test_released_grant_that_never_ran_is_freed_at_once() -> None:
    core = cluster(1)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.allocate(job, 1, 1, [], [g.container_id], [], 2.5)
    assert core.cluster.free("n1") == 8
    # ... and the agent is told, so a start racing with the release is refused.
    assert g.container_id in {o.container_id for o in core.take_stops("n1", 2.5)}


def test_grant_never_started_expires() -> None:
    core = cluster(1, settings=RMSettings(container_start_timeout_s=30, am_liveness_timeout_s=1000))
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    for t in (10.0, 20.0, 31.0):
        core.node_heartbeat("n1", "s1", [], t)
        core.tick(t)
    assert core.containers[g.container_id].phase is ContainerPhase.ALLOCATED
    core.node_heartbeat("n1", "s1", [], 33.0)
    core.tick(33.0)
    assert core.containers[g.container_id].exit.kind is ExitKind.EXPIRED and core.cluster.free("n1") == 8


def test_unknown_container_reported_by_an_agent_is_stopped() -> None:
    core = cluster(1)
    stops = core.register_node(reg("n1", containers=[running("ghost")]), "s1b", 1.0)
    assert [s.container_id for s in stops] == ["ghost"]


def test_restore_from_the_store_keeps_jobs_allocations_and_counters() -> None:
    core = cluster(2)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 2.0).grants
    again = restarted(core, now=100.0)
    assert again.jobs[job].state is JobState.ALLOCATING
    assert again.cluster.free("n2") == 0 and again.cluster.nodes["n2"].allocated[0] == g.container_id
    assert again.submit(JobSpec(gpus=1, command=["x"]), "a", 101.0).job_id == "job-2"
    assert any(isinstance(e, JobChanged) for e in again.take_outbox())
    # Restored nodes must re-register: their old sessions are unknown.
    assert again.node_heartbeat("n2", "s2", [], 101.0) is HeartbeatAction.REREGISTER


def test_an_end_reported_before_the_am_returns_after_a_restart_is_delivered() -> None:
    core = cluster(1)
    job = started_job(core, gpus=4)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 2.1)
    core.allocate(job, 1, 1, [], [], [AttemptUpdate(1, JobState.RUNNING,
                                                    learners=[Learner(0, "n1", [0, 1, 2, 3], g.container_id)])], 2.2)
    again = restarted(core, now=10.0)
    # The agent re-registers first, carrying the learner's end; the AM has not called the new RM yet.
    again.register_node(reg("n1", containers=[exited(g.container_id, 7), running(f"{job}-am1")]), "s1b", 10.5)
    r = again.allocate(job, 1, 2, [], [], [], 11.0)
    assert [(c.container_id, c.exit.exit_code) for c in r.completed] == [(g.container_id, 7)]


def test_an_unreachable_agent_gets_no_am_and_costs_the_job_nothing() -> None:
    core = cluster(2)
    job = core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0)
    (first,) = launched(core)
    core.am_launch_failed(first.container_id, "agent unreachable: UNAVAILABLE", 1.1, agent_unreachable=True)
    (second,) = launched(core)
    assert second.node_id != first.node_id                 # not the unreachable node again
    core.am_launch_failed(second.container_id, "agent unreachable: UNAVAILABLE", 1.2, agent_unreachable=True)
    assert not launched(core)                              # both unreachable: the job waits
    j = core.jobs[job.job_id]
    assert j.state is JobState.QUEUED and j.am_launch_failures == 0
    core.node_heartbeat(first.node_id, "s" + first.node_id[1:], [], 5.0)
    assert not launched(core)                              # heard from too soon after: still held
    core.node_heartbeat(first.node_id, "s" + first.node_id[1:], [], 15.0)
    (third,) = launched(core)
    assert third.node_id == first.node_id
    # A refusal that is not about reachability counts, and fails the job at the cap.
    attempt = third
    for t in range(5):
        core.am_launch_failed(attempt.container_id, "token refused", 16.0 + t)
        if j.state is JobState.FAILED:
            break
        (attempt,) = launched(core)
    assert j.state is JobState.FAILED and "could not start the AM" in j.diagnostics


def test_a_grant_whose_reply_died_with_the_rm_is_offered_again() -> None:
    # The RM granted n2 and stored it, then died before the reply reached the AM. The restarted RM offers the
    # grant again on the AM's next call (the AM uses it or releases it): a grant nobody knows of would hold
    # its GPUs forever.
    core = cluster(2)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 2.0).grants
    again = restarted(core, now=10.0)
    r = again.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 11.0)       # the AM never saw response 1
    assert [x.container_id for x in r.grants] == [g.container_id]
    assert again.cluster.free("n2") == 0                                           # granted once, not twice
    r = again.allocate(job, 1, r.response_id, [], [g.container_id], [], 12.0)      # the AM lets it go
    assert again.cluster.free("n2") == 8


def test_a_grant_of_a_finished_job_that_never_starts_is_taken_back_after_the_start_timeout() -> None:
    # The job ended while a grant was not yet seen running: it may be starting right now, so its GPUs stay
    # held (a stop order goes out) until the agent reports it or the start timeout runs out.
    core = cluster(2, settings=RMSettings(heartbeat_interval_s=1.0, missed_beats=1000, container_start_timeout_s=30))
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 2.0).grants
    core.kill(job, "alice", "no longer needed", 3.0)
    assert core.cluster.free("n2") == 0
    assert any(o.container_id == g.container_id for o in core.take_stops("n2", 3.1))
    core.tick(20.0)
    assert core.cluster.free("n2") == 0
    core.tick(40.0)
    assert core.cluster.free("n2") == 8
    assert core.containers[g.container_id].exit.kind is ExitKind.EXPIRED


def test_an_end_seen_before_the_report_naming_its_learner_reaches_the_am() -> None:
    # The AM launched a learner but its report died with the RM; the restarted RM hears the learner's end from
    # the agent first, then gets the AM's report (naming the learner) in the AM's first call. The reply to that
    # very call must carry the end, or the AM waits for it forever.
    core = cluster(1)
    job = started_job(core, gpus=4)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 2.1)
    again = restarted(core, now=10.0)
    again.register_node(reg("n1", containers=[exited(g.container_id, 0), running(f"{job}-am1")]), "s1b", 10.5)
    report = AttemptUpdate(1, JobState.RUNNING, learners=[Learner(0, "n1", [0, 1, 2, 3], g.container_id)])
    r = again.allocate(job, 1, 1, [], [], [report], 11.0)
    assert [c.container_id for c in r.completed] == [g.container_id]
    r = again.allocate(job, 1, r.response_id, [], [], [report], 12.0)
    assert r.completed == []                                    # sent once


def test_the_agents_word_on_a_learners_end_beats_the_ams_older_report() -> None:
    core = cluster(1)
    job = started_job(core, gpus=4)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 2.1)
    core.node_heartbeat("n1", "s1", [ContainerReport(g.container_id, "EXITED", signal=15, stopped=True)], 3.0)
    stale = Learner(0, "n1", [0, 1, 2, 3], g.container_id, state="EXITED")       # the AM knew no signal
    core.allocate(job, 1, 1, [], [], [AttemptUpdate(1, JobState.KILLED, learners=[stale])], 3.1)
    (learner,) = core.jobs[job].attempts[-1].learners
    assert (learner.state, learner.signal) == ("EXITED", 15)


def ran_4000_gpu_s() -> tuple[RMCore, str]:
    """A 1-GPU job that ran 10..4,010 s (4,000 GPU-s: LAS level 1) and was stopped; returns the core and job."""
    core = cluster(1)
    job = started_job(core, gpus=1)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=1, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    core.node_heartbeat("n1", "s1", [exited(g.container_id, stopped=True)], 4010.0)
    return core, job


def test_a_las_promotion_sticks_once_the_starved_job_runs_and_survives_a_restart() -> None:
    # 1 GPU: runs 4,000 s (4,000 GPU-s: level 1), stops, waits 40,000 s > 8 x 4,000 s (starved), runs again. Its
    # service then counts from the promotion, so it ranks at level 0 while it runs.
    core, job = ran_4000_gpu_s()
    assert core.standing(core.jobs[job], 4010.0).attained_gpu_s == 4000.0
    (g2,) = core.allocate(job, 1, 1, [Ask(gpus=1, node_id="n1")], [], [], 44_020.0).grants
    core.node_heartbeat("n1", "s1", [running(g2.container_id)], 44_020.0)
    assert core.jobs[job].las_base_gpu_s == 4000.0
    assert core.standing(core.jobs[job], 44_120.0).attained_gpu_s == 100.0
    assert core.jobs[job].attained_gpu_s == 4000.0       # what it was served in all is kept
    again = restarted(core, 44_200.0)
    assert again.jobs[job].las_base_gpu_s == 4000.0


def test_a_job_that_did_not_starve_keeps_its_service() -> None:
    core, job = ran_4000_gpu_s()
    (g2,) = core.allocate(job, 1, 1, [Ask(gpus=1, node_id="n1")], [], [], 5000.0).grants
    core.node_heartbeat("n1", "s1", [running(g2.container_id)], 5000.0)
    assert core.jobs[job].las_base_gpu_s == 0.0
    assert core.standing(core.jobs[job], 5100.0).attained_gpu_s == 4100.0


def test_in_queue_preemption_tells_an_outranking_job_that_fits_in_idle_gpus_to_plan_now() -> None:
    # 8 GPUs: `old` runs on 4 of them long enough to drop to LAS level 1; `w` (level 0) outranks it and its AM,
    # backing off, asks for nothing although 4 GPUs are idle. Nobody is preempted: w's next reply says plan now.
    core = cluster(1, settings=RMSettings(heartbeat_interval_s=1e9, am_liveness_timeout_s=1e9,
                                          container_start_timeout_s=1e9, inqueue_preemption=True,
                                          inqueue_min_run_s=300.0))
    core.scheduler.policy_override = Policy.LAS
    old = started_job(core, gpus=4)
    (g,) = core.allocate(old, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    w = started_job(core, gpus=4, now=20.0)
    assert core.preempt_in_queue(2000.0) == []                  # 4 x 1,990 s: level 1 now
    assert core.allocate(w, 1, 0, [], [], [], 2001.0).plan_now
    assert not core.allocate(w, 1, 1, [], [], [], 2002.0).plan_now     # said once
    assert not core.allocate(old, 1, 1, [], [], [], 2003.0).plan_now


def las_core() -> RMCore:
    """One 8-GPU server, every queue ranked by LAS with in-queue preemption after 300 s of running."""
    core = cluster(1, settings=RMSettings(heartbeat_interval_s=1e9, am_liveness_timeout_s=1e9,
                                          container_start_timeout_s=1e9, inqueue_preemption=True,
                                          inqueue_min_run_s=300.0))
    core.scheduler.policy_override = Policy.LAS
    return core


def test_in_queue_preemption_weighs_a_job_that_arrives_after_a_quiet_look() -> None:
    core = las_core()
    old = started_job(core, gpus=8)
    (g,) = core.allocate(old, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    assert core.preempt_in_queue(100.0) == []       # nobody waits, and `old` is too young to be preempted anyway
    assert core.preempt_in_queue(2000.0) == []      # old enough now, at LAS level 1 (8 x 1,990 GPU-s): still nobody
    w = started_job(core, gpus=8, now=2100.0)       # level 0: outranks it
    assert core.preempt_in_queue(2200.0) == [(old, w)]


def test_in_queue_preemption_waits_for_the_outranked_job_to_run_its_minimum() -> None:
    core = las_core()
    old = started_job(core, gpus=8)
    (g,) = core.allocate(old, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    # 8 x 290 s: level 0 still, and younger than 300 s; `w`, at level 0 too, outranks nobody.
    w = started_job(core, gpus=8, now=20.0)
    assert core.preempt_in_queue(300.0) == []
    assert core.preempt_in_queue(400.0) == []       # old enough, but level 0 until 3,600 GPU-s (t = 460 s)
    assert core.preempt_in_queue(461.0) == [(old, w)]   # crossed into level 1 with nothing else changed


def test_in_queue_preemption_makes_one_room_per_waiting_job_while_the_victims_stop() -> None:
    # Two 4-GPU servers: `big` holds n1, `small` 2 GPUs of n2; both at LAS level 1 and past the minimum run when
    # `w` (4 GPUs, level 0) arrives. The cheapest room is n2 (2 GPUs preempted). Until `small` has stopped (its
    # grace), `w` still waits, and a later look must not make it a second room by preempting `big` too (the
    # simulator's victims stop at once, so only the daemon looked again during the grace, and preempted both).
    core = las_core_of(servers=2, gpus=4)
    big, small = started_job(core, gpus=4), started_job(core, gpus=2)
    (g1,) = core.allocate(big, 1, 0, [Ask(gpus=4, node_id="n1")], [], [], 2.0).grants
    (g2,) = core.allocate(small, 1, 0, [Ask(gpus=2, node_id="n2")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g1.container_id)], 10.0)
    core.node_heartbeat("n2", "s2", [running(g2.container_id)], 10.0)
    w = started_job(core, gpus=4, now=2000.0)
    assert core.preempt_in_queue(2001.0) == [(small, w)]
    assert core.preempt_in_queue(2003.0) == []                  # `small` is still stopping: its room is under way
    core.node_heartbeat("n2", "s2", [exited(g2.container_id, stopped=True)], 2004.0)
    assert core.preempt_in_queue(2005.0) == []                  # n2 is free for `w` now: nobody else loses
    assert core.allocate(w, 1, 0, [Ask(gpus=4, node_id="n2")], [], [], 2006.0).grants


def las_core_of(servers: int, gpus: int) -> RMCore:
    core = cluster(servers, gpus=gpus, settings=RMSettings(heartbeat_interval_s=1e9, am_liveness_timeout_s=1e9,
                                                           container_start_timeout_s=1e9, inqueue_preemption=True,
                                                           inqueue_min_run_s=300.0))
    core.scheduler.policy_override = Policy.LAS
    return core


def test_gpus_in_queue_preemption_freed_wait_for_the_job_they_were_freed_for() -> None:
    # `old` holds the whole server into LAS level 1; `w` (level 0) arrives, its AM planning (asking for nothing:
    # it sees no free GPU). `old` is preempted for it and stops. Its AM, polling fast while it stops, asks again
    # before w's AM has seen the GPUs free: the GPUs wait for `w` all the same, not for the job that just lost them
    # (else it wins them back and is preempted again, over and over, while `w` waits).
    core = las_core()
    old = started_job(core, gpus=8)
    (g,) = core.allocate(old, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    w = started_job(core, gpus=8, now=2100.0)
    assert core.allocate(w, 1, 0, [], [], [], 2150.0).grants == []
    assert core.preempt_in_queue(2200.0) == [(old, w)]
    core.node_heartbeat("n1", "s1", [exited(g.container_id, stopped=True)], 2201.0)
    assert core.preempt_in_queue(2201.5) == []
    assert core.allocate(old, 1, 1, [Ask(gpus=8, node_id="n1")], [], [], 2202.0).grants == []
    assert w in core.why_waiting(core.jobs[old])
    (g2,) = core.allocate(w, 1, 1, [Ask(gpus=8, node_id="n1")], [], [], 2203.0).grants
    assert g2.node_id == "n1"


def test_gpus_held_for_a_job_go_to_others_once_it_is_gone() -> None:
    # As above, but `w` is killed before its AM asks: the hold ends with it, and `old` gets its GPUs back.
    core = las_core()
    old = started_job(core, gpus=8)
    (g,) = core.allocate(old, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], 2.0).grants
    core.node_heartbeat("n1", "s1", [running(g.container_id)], 10.0)
    w = started_job(core, gpus=8, now=2100.0)
    assert core.preempt_in_queue(2200.0) == [(old, w)]
    core.node_heartbeat("n1", "s1", [exited(g.container_id, stopped=True)], 2201.0)
    assert core.allocate(old, 1, 1, [Ask(gpus=8, node_id="n1")], [], [], 2202.0).grants == []
    core.kill(w, "alice", "", 2203.0)
    assert core.allocate(old, 1, 2, [Ask(gpus=8, node_id="n1")], [], [], 2204.0).grants


def test_a_reply_held_for_the_deferred_pass_takes_its_grants_and_a_retry_gets_them_too() -> None:
    core = cluster(2)
    job = started_job(core, gpus=8)
    asks = [Ask(gpus=8, node_id="n1")]
    r = core.allocate(job, 1, 0, asks, [], [], 2.0, schedule=False)    # passes coalesced: none ran
    assert r.grants == [] and core.waits_for_pass(job)
    core.schedule(2.01)                                               # the deferred pass
    assert not core.waits_for_pass(job)
    late = core.late_grants(job, 1, r.response_id)
    assert [g.node_id for g in late] == ["n1"] and [g.node_id for g in r.grants] == ["n1"]
    assert core.allocate(job, 1, 0, asks, [], [], 2.1).grants == r.grants, "a retry of that call: same answer"
    nxt = core.allocate(job, 1, r.response_id, asks, [], [], 2.2)
    assert nxt.grants == [], "the grant went out once"
    assert core.late_grants(job, 1, r.response_id) == [], "a later call was made: nothing moves into an old reply"


def test_after_a_restart_nodes_have_the_resync_grace_not_one_expiry_and_losses_are_counted() -> None:
    core = cluster(3)
    job = started_job(core, gpus=8)
    (g,) = core.allocate(job, 1, 0, [Ask(gpus=8, node_id="n2")], [], [], 2.0).grants
    core.node_heartbeat("n2", "s2", [running(g.container_id)], 2.5)
    again = restarted(core, now=10.0)
    expiry = 1.0 * 3
    grace = again.resync_until - 10.0
    assert grace >= 60.0 and grace > 2 * expiry
    am_node = again.jobs[job].am_container and again.containers[again.jobs[job].am_container].node_id
    assert am_node == "n1"
    again.register_node(reg("n3"), "t3", 11.0)                    # n3 comes back; n1 and n2 take their time
    again.tick(10.0 + grace - 1)
    assert {n: again.cluster.nodes[n].state.name for n in ("n1", "n2", "n3")} == {
        "n1": "RUNNING", "n2": "RUNNING", "n3": "LOST"}, "a node that came back and then went silent is lost"
    stops = again.register_node(reg("n2", containers=[running(g.container_id)]), "t2", 10.0 + grace - 0.5)
    assert stops == [] and again.containers[g.container_id].phase is ContainerPhase.RUNNING
    assert again.lost_nodes == 1 and again.lost_containers == 0
    again.node_heartbeat("n2", "t2", [], 10.0 + grace + 0.5)
    again.tick(10.0 + grace + 1)
    assert again.cluster.nodes["n1"].state.name == "LOST", "past the grace, a node that never came back is lost"
    assert again.cluster.nodes["n2"].state.name == "RUNNING"
    assert again.lost_nodes == 2 and again.lost_containers == 1, "n1's AM went with it"


def test_a_burst_of_submits_leaves_its_am_launches_to_one_pass_and_a_lone_submit_launches_at_once() -> None:
    # The daemon sets am_launch_coalesce_s to its scheduler interval (rm.yaml scheduler.interval): the first submit
    # after a quiet spell launches its AM at once; the rest of a burst wait for the pass loop's one launch.
    core = cluster(4, settings=RMSettings(heartbeat_interval_s=1.0, missed_beats=3, am_launch_coalesce_s=0.02))
    first = core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0)
    assert [e.job_id for e in launched(core)] == [first.job_id] and not core.launch_due
    burst = [core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0 + i * 0.001) for i in range(1, 6)]
    assert launched(core) == [] and core.launch_due
    core.launch_due_ams(1.02)
    assert [e.job_id for e in launched(core)] == [j.job_id for j in burst] and not core.launch_due
    late = core.submit(JobSpec(gpus=1, command=["x"]), "alice", 2.0)
    assert [e.job_id for e in launched(core)] == [late.job_id]


def test_without_coalescing_every_submit_launches_at_once() -> None:
    core = cluster(4)                                            # the simulator's and the tests' default: 0
    jobs = [core.submit(JobSpec(gpus=1, command=["x"]), "alice", 1.0) for _ in range(3)]
    assert [e.job_id for e in launched(core)] == [j.job_id for j in jobs] and not core.launch_due
