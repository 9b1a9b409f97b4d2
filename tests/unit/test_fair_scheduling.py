"""Fair-share scheduling and preemption through the pure RM core, with a fake clock and AMs played by the test."""

from __future__ import annotations

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec, LocalityLevel
from gpurm.common.model import ContainerPhase, JobState
from gpurm.queues.config import parse_queues
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.core import (
    AttemptUpdate,
    ContainerReport,
    ErrorCode,
    LaunchAM,
    NodeRegistration,
    RequestError,
    RMCore,
    RMSettings,
)


class Rig:
    def __init__(self, queues: str, nodes: int = 4, gpus: int = 8) -> None:
        self.core = RMCore(RMSettings(heartbeat_interval_s=1e9, am_liveness_timeout_s=1e9,
                                      container_start_timeout_s=1e9, max_acquiring_per_queue=1000),
                           parse_queues(queues))
        self.now = 0.0
        self.resp: dict[str, int] = {}
        for i in range(nodes):
            self.core.register_node(NodeRegistration(f"n{i}", "h", 1, "r1", "r1",
                                                     [GpuRecord(k) for k in range(gpus)]), f"s{i}", 0.0)

    def job(self, queue: str, gpus: int, user: str = "u", groups: tuple[str, ...] = ()) -> str:
        job = self.core.submit(JobSpec(gpus=gpus, command=["x"], queue=queue), user, self.now, groups=groups)
        for e in self.core.take_outbox():
            if isinstance(e, LaunchAM):
                self.core.register_am(e.job_id, e.am_attempt, self.now)
        return job.job_id

    def ask(self, job_id: str, asks: list[Ask], schedule: bool = True) -> list[str]:
        r = self.core.allocate(job_id, 1, self.resp.get(job_id, 0), asks, [], [], self.now, schedule=schedule)
        self.resp[job_id] = r.response_id
        for g in r.grants:                        # the learners start at once
            node = g.node_id
            self.core.node_heartbeat(node, "s" + node[1:], [ContainerReport(g.container_id, "RUNNING", pid=1)],
                                     self.now)
        return [g.container_id for g in r.grants]

    def used(self, queue: str) -> int:
        return self.core.queues.used.get(f"root.{queue}", 0)

    def end(self, container_id: str) -> None:
        c = self.core.containers[container_id]
        self.core.node_heartbeat(c.node_id, "s" + c.node_id[1:],
                                 [ContainerReport(container_id, "EXITED", stopped=True, signal=15)], self.now)


def one_gpu_asks(n: int) -> list[Ask]:
    return [Ask(gpus=1, count=n)]


TWO = "queues:\n  a: {}\n  b: {}\n"


def test_equal_queues_split_the_cluster() -> None:
    rig = Rig(TWO)
    ja, jb = rig.job("a", 32), rig.job("b", 32)
    rig.ask(ja, one_gpu_asks(32), schedule=False)
    rig.ask(jb, one_gpu_asks(32), schedule=False)
    rig.core.schedule(rig.now)
    assert (rig.used("a"), rig.used("b")) == (16, 16)


def test_weights_three_to_one() -> None:
    rig = Rig("queues:\n  a: {weight: 3}\n  b: {weight: 1}\n")
    ja, jb = rig.job("a", 32), rig.job("b", 32)
    rig.ask(ja, one_gpu_asks(32), schedule=False)
    rig.ask(jb, one_gpu_asks(32), schedule=False)
    rig.core.schedule(rig.now)
    assert (rig.used("a"), rig.used("b")) == (24, 8)


def test_idle_gpus_go_to_the_only_busy_queue_and_are_preemptible() -> None:
    rig = Rig(TWO)
    jobs = [rig.job("a", 4) for _ in range(8)]
    for j in jobs:
        rig.ask(j, [Ask(gpus=4)])
    assert rig.used("a") == 32                       # oversubscribed: b is idle
    flagged = rig.core.preemptible_jobs()
    assert flagged == set(jobs[4:])                  # the newest jobs beyond a's steady share (16)
    assert all(rig.core.containers[c].preemptible for j in jobs[4:] for c in rig.core.by_job[j] if "-c" in c)


def test_max_gpus_caps_a_queue() -> None:
    rig = Rig("queues:\n  a: {max_gpus: 8}\n  b: {}\n")
    ja = rig.job("a", 8)
    jb = rig.job("a", 8)
    rig.ask(ja, [Ask(gpus=8)])
    assert rig.ask(jb, [Ask(gpus=8)]) == []
    assert "max_gpus (8)" in rig.core.why_waiting(rig.core.jobs[jb])
    with pytest.raises(RequestError) as info:
        rig.job("a", 9)
    assert "max_gpus" in info.value.message


def test_max_gpus_per_user() -> None:
    rig = Rig("queues:\n  a: {max_gpus_per_user: 4}\n")
    j1, j2, j3 = rig.job("a", 4, user="ann"), rig.job("a", 4, user="ann"), rig.job("a", 4, user="bo")
    rig.ask(j1, [Ask(gpus=4)])
    assert rig.ask(j2, [Ask(gpus=4)]) == [] and "ann is at max_gpus_per_user" in rig.core.why_waiting(rig.core.jobs[j2])
    assert len(rig.ask(j3, [Ask(gpus=4)])) == 1


def a_at_its_share_while_b_waits() -> tuple[Rig, list[str]]:
    """Queue a holds n0 and n1 (its share, 16) and has a 16-GPU job waiting; b's 16-GPU job waits for n0 + n1."""
    rig = Rig(TWO)
    a_jobs = [rig.job("a", 8), rig.job("a", 8), rig.job("a", 16)]
    jb = rig.job("b", 16)
    rig.ask(a_jobs[0], [Ask(gpus=8, node_id="n0")])
    rig.ask(a_jobs[1], [Ask(gpus=8, node_id="n1")])
    rig.ask(jb, [Ask(gpus=8, node_id="n0"), Ask(gpus=8, node_id="n1")])
    return rig, a_jobs


def test_no_incomplete_gang_goes_past_the_share_while_another_queue_waits() -> None:
    rig, a_jobs = a_at_its_share_while_b_waits()
    # a's 16-GPU gang may not take n2 and n3: it would be incomplete above a's share (16) after the first of them.
    assert rig.ask(a_jobs[2], [Ask(gpus=8, node_id="n2"), Ask(gpus=8, node_id="n3")]) == []
    assert "incomplete gang" in rig.core.why_waiting(rig.core.jobs[a_jobs[2]])


def test_a_ready_reservation_grants_its_whole_gang_even_above_the_share() -> None:
    rig, a_jobs = a_at_its_share_while_b_waits()
    # As above, but n2 and n3 were drained for a's 16-GPU job and are all free: its whole gang is there at once,
    # so no incomplete gang stays above the share; refusing it would throw the drain away.
    res = rig.core.reservations
    res.limit = 1
    r = res.reserve(a_jobs[2], 16, LocalityLevel.PACKED, rig.now)
    assert r is not None and set(r.parts) == {"n2", "n3"}
    assert res.ready(rig.now) == [a_jobs[2]]
    assert len(rig.ask(a_jobs[2], [Ask(gpus=8, node_id="n2"), Ask(gpus=8, node_id="n3")])) == 2
    assert a_jobs[2] not in res.by_job                   # granted its gang: the reservation ended


def test_a_complete_gang_may_use_idle_gpus_beyond_the_share_while_another_queue_waits() -> None:
    rig = Rig(TWO)
    a_jobs = [rig.job("a", 8) for _ in range(3)]
    jb = rig.job("b", 16)
    rig.ask(a_jobs[0], [Ask(gpus=8, node_id="n0")])
    rig.ask(a_jobs[1], [Ask(gpus=8, node_id="n1")])
    rig.ask(jb, [Ask(gpus=8, node_id="n0"), Ask(gpus=8, node_id="n1")])
    assert len(rig.ask(a_jobs[2], [Ask(gpus=8, node_id="n2")])) == 1   # oversubscription: preemptible
    assert a_jobs[2] in rig.core.preemptible_jobs()


def test_las_serves_the_least_attained_job_first() -> None:
    rig = Rig("queues:\n  a: {policy: las}\n", nodes=1)
    old, new = rig.job("a", 8), rig.job("a", 8)
    rig.core.jobs[old].attained_gpu_s = 5000.0        # above the first LAS threshold (1 GPU-hour)
    rig.ask(old, [Ask(gpus=8)], schedule=False)
    rig.ask(new, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    assert g.job_id == new


def test_fifo_serves_submission_order() -> None:
    rig = Rig("queues:\n  a: {}\n", nodes=1)
    first, second = rig.job("a", 8), rig.job("a", 8)
    rig.ask(second, [Ask(gpus=8)], schedule=False)
    rig.ask(first, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    assert g.job_id == first


def test_submit_acl() -> None:
    rig = Rig("queues:\n  a: {acl: {submit: [ann, '@ml']}}\n")
    rig.job("a", 1, user="ann")
    rig.job("a", 1, user="bo", groups=("ml",))
    with pytest.raises(RequestError) as info:
        rig.job("a", 1, user="cy")
    assert info.value.code is ErrorCode.PERMISSION_DENIED and "cy may not submit to a" in info.value.message


def test_kill_is_for_owner_queue_admins_and_rm_admins() -> None:
    rig = Rig("queues:\n  a: {acl: {admin: [boss]}}\n")
    j = rig.job("a", 1, user="ann")
    with pytest.raises(RequestError) as info:
        rig.core.kill(j, "eve", "", rig.now)
    assert info.value.code is ErrorCode.PERMISSION_DENIED
    assert rig.core.kill(j, "boss", "", rig.now).state.name == "KILLED"
    j2 = rig.job("a", 1, user="ann")
    assert rig.core.kill(j2, "root", "", rig.now, rm_admin=True).state.name == "KILLED"


def test_max_running_jobs_holds_jobs_queued() -> None:
    rig = Rig("queues:\n  a: {max_running_jobs: 1}\n")
    j1, j2 = rig.job("a", 1), rig.job("a", 1)
    assert rig.core.jobs[j1].admitted and not rig.core.jobs[j2].admitted
    assert "max_running_jobs (1)" in rig.core.why_waiting(rig.core.jobs[j2])
    rig.core.kill(j1, "u", "", rig.now)
    rig.core.tick(rig.now)
    assert rig.core.jobs[j2].admitted


# ---------------------------------------------------------------- preemption


def flood(rig: Rig, queue: str, jobs: int, gpus: int) -> list[str]:
    out = []
    for _ in range(jobs):
        j = rig.job(queue, gpus)
        rig.now += 1
        per_server = min(gpus, 8)
        assert rig.ask(j, [Ask(gpus=per_server, count=gpus // per_server)])
        out.append(j)
    return out


def test_fair_share_preemption_takes_newest_jobs_back_after_the_timeout() -> None:
    rig = Rig("defaults: {fair_share_preemption_timeout: 60s, min_share_preemption_timeout: off, "
              "preemption_grace: 15s}\nqueues:\n  a: {}\n  b: {}\n")
    a_jobs = flood(rig, "a", 8, 4)                       # a holds all 32 GPUs
    jb = rig.job("b", 16)
    assert rig.ask(jb, [Ask(gpus=4, count=4)]) == []     # nothing free
    rig.core.tick(rig.now)                               # b starts starving
    rig.now += 59
    rig.core.tick(rig.now)
    assert not any(c.preempt_deadline for c in rig.core.containers.values())
    rig.now += 2
    rig.core.tick(rig.now)
    doomed = {c.job_id for c in rig.core.containers.values() if c.preempt_deadline}
    assert doomed == set(a_jobs[-4:])                    # newest first, exactly down to a's share of 16
    # Their AMs are told with a grace period; the RM stops what is left after it.
    r = rig.core.allocate(a_jobs[-1], 1, rig.resp[a_jobs[-1]], [], [], [], rig.now)
    assert r.preempt_ids and r.preempt_deadline == rig.now + 15
    rig.now += 15.5
    rig.core.tick(rig.now)
    ordered = {o.container_id for n in list(rig.core.stops) for o in rig.core.take_stops(n, rig.now)}
    assert {rig.core.containers[c].job_id for c in ordered} == set(a_jobs[-4:])
    for cid in ordered:
        rig.end(cid)
    assert len(rig.ask(jb, [Ask(gpus=4, count=4)])) == 4 and rig.used("b") == 16


def test_a_victim_stops_counting_as_running_once_its_preempted_learners_end() -> None:
    # Its AM reports the next attempt later; until then `gpurm status` must not call the broken gang RUNNING.
    rig = Rig("defaults: {fair_share_preemption_timeout: 10s, min_share_preemption_timeout: off, "
              "preemption_grace: 5s}\nqueues:\n  a: {}\n  b: {}\n")
    a_jobs = flood(rig, "a", 8, 4)
    for j in a_jobs:
        rig.core.allocate(j, 1, rig.resp[j], [], [], [AttemptUpdate(1, JobState.RUNNING)], rig.now)
    assert {rig.core.jobs[j].state for j in a_jobs} == {JobState.RUNNING}
    rig.job("b", 8)
    rig.core.tick(rig.now)
    rig.now += 10
    rig.core.tick(rig.now)
    rig.now += 6
    rig.core.tick(rig.now)
    for n in list(rig.core.stops):
        for o in rig.core.take_stops(n, rig.now):
            rig.end(o.container_id)
    states = {j: rig.core.jobs[j].state for j in a_jobs}
    assert [j for j, s in states.items() if s is JobState.ALLOCATING] == a_jobs[-2:]
    assert all(states[j] is JobState.RUNNING for j in a_jobs[:-2])
    assert "preempted for queue b" in rig.core.jobs[a_jobs[-1]].waiting_reason


def test_never_preempts_a_non_preemptible_queue() -> None:
    rig = Rig("defaults: {fair_share_preemption_timeout: 10s}\nqueues:\n  a: {preemptible: false}\n  b: {}\n")
    flood(rig, "a", 8, 4)
    jb = rig.job("b", 8)
    rig.ask(jb, [Ask(gpus=8)])
    for _ in range(5):
        rig.now += 10
        rig.core.tick(rig.now)
    assert not any(c.preempt_deadline for c in rig.core.containers.values())


def test_never_pushes_a_victim_below_its_share() -> None:
    # One 32-GPU job: taking it would leave a with nothing, below its share of 16.
    rig = Rig("defaults: {fair_share_preemption_timeout: 10s}\nqueues:\n  a: {}\n  b: {}\n")
    flood(rig, "a", 1, 32)
    jb = rig.job("b", 8)
    rig.ask(jb, [Ask(gpus=8)])
    for _ in range(3):
        rig.now += 10
        rig.core.tick(rig.now)
    assert not any(c.preempt_deadline for c in rig.core.containers.values())


def test_min_share_preemption_uses_its_own_timeout() -> None:
    rig = Rig("defaults: {min_share_preemption_timeout: 5s, fair_share_preemption_timeout: off}\n"
              "queues:\n  a: {}\n  b: {min_gpus: 8}\n")
    flood(rig, "a", 8, 4)
    jb = rig.job("b", 8)
    rig.ask(jb, [Ask(gpus=8)])
    rig.core.tick(rig.now)
    rig.now += 5
    rig.core.tick(rig.now)
    doomed = {c.job_id for c in rig.core.containers.values() if c.preempt_deadline}
    assert len(doomed) == 2                              # 8 GPUs: two 4-GPU jobs, the newest


def test_refresh_refuses_to_drop_a_queue_with_jobs() -> None:
    rig = Rig(TWO)
    j = rig.job("b", 1)
    problems = rig.core.replace_tree(parse_queues("queues:\n  a: {}\n"))
    assert problems and "root.b" in problems[0] and j in problems[0]
    assert rig.core.queues.tree.find("b") is not None        # the old tree stays
    rig.core.kill(j, "u", "", rig.now)
    assert rig.core.replace_tree(parse_queues("queues:\n  a: {weight: 2}\n")) == []
    assert rig.core.queues.tree.find("b") is None


def test_usage_survives_restore() -> None:
    rig = Rig(TWO)
    j = rig.job("a", 8)
    rig.ask(j, [Ask(gpus=8)])
    core2 = RMCore(tree=parse_queues(TWO))
    core2.restore(rig.core.jobs.values(), rig.core.containers.values(), rig.core.cluster.nodes.values(),
                  rig.core.meta(), 100.0)
    assert core2.queues.used["root.a"] == 8 and core2.queues.demand["root.a"] == 8
    assert core2.queues.jobs_active["root.a"] == 1
    assert all(c.phase is not ContainerPhase.COMPLETED for c in core2.containers.values())


def test_freed_gpus_count_for_the_starving_queue_until_it_gets_them() -> None:
    # b wants 8 of its share of 16; a holds all 32 in 4-GPU jobs, so a keeps room above its share after
    # the first preemption. Until b is granted the freed GPUs, they must not be reclaimed a second time.
    rig = Rig("defaults: {fair_share_preemption_timeout: 10s, min_share_preemption_timeout: off, "
              "preemption_grace: 5s}\nqueues:\n  a: {}\n  b: {}\n")
    a_jobs = flood(rig, "a", 8, 4)
    jb = rig.job("b", 8)
    rig.ask(jb, [Ask(gpus=4, count=2)], schedule=False)
    rig.core.tick(rig.now)
    rig.now += 10
    rig.core.tick(rig.now)
    first = {c.job_id for c in rig.core.containers.values() if c.preempt_deadline}
    assert first == set(a_jobs[-2:])
    rig.now += 6
    rig.core.tick(rig.now)
    for n in list(rig.core.stops):
        for o in rig.core.take_stops(n, rig.now):
            rig.end(o.container_id)                   # the victims are gone; b has not been granted yet
    for _ in range(3):
        rig.now += 11
        rig.core.tick(rig.now)
    again = {c.job_id for c in rig.core.containers.values() if c.preempt_deadline} - first
    assert again == set()
    assert len(rig.ask(jb, [Ask(gpus=4, count=2)])) == 2


def test_an_incomplete_gang_above_the_share_is_revoked_while_another_queue_waits() -> None:
    rig = Rig(TWO)
    big = rig.job("a", 32)
    # a's AM holds three servers (grants not yet started) and waits for the fourth; nobody else wanted GPUs.
    r = rig.core.allocate(big, 1, 0, [Ask(gpus=8, node_id=f"n{i}") for i in range(3)], [], [], rig.now)
    held = [g.container_id for g in r.grants]
    assert len(held) == 3 and rig.used("a") == 24
    assert rig.core.revoke_hoarded(rig.now) == []            # nobody waits: holding is fine
    jb = rig.job("b", 16)                                    # b now waits below its share of 16
    revoked = rig.core.revoke_hoarded(rig.now)
    assert len(revoked) == 1 and rig.used("a") == 16        # back down to a's share, newest grant first
    assert rig.core.containers[revoked[0]].exit.kind.name == "EXPIRED"
    r = rig.core.allocate(big, 1, 1, [], [], [], rig.now)
    assert [c.container_id for c in r.completed] == revoked and "incomplete" in r.completed[0].exit.diagnostics
    assert jb in rig.core.jobs


def test_a_running_gang_is_left_to_preemption() -> None:
    rig = Rig(TWO)
    big = rig.job("a", 24)
    rig.ask(big, [Ask(gpus=8, node_id=f"n{i}") for i in range(3)])   # started: these are learners now
    rig.core.jobs[big].state = rig.core.jobs[big].state.__class__.RUNNING
    rig.job("b", 16)
    assert rig.core.revoke_hoarded(rig.now) == []


def test_a_gang_the_am_has_launched_is_not_revoked_before_the_agent_reports_it() -> None:
    # The AM holds its whole gang and launched it; the agents have not reported the learners running yet. That
    # gang hoards nothing: taking a grant back now would fail an attempt for no reason.
    from gpurm.common.model import JobState, Learner
    from gpurm.rm.state.core import AttemptUpdate

    rig = Rig(TWO)
    big = rig.job("a", 24)
    r = rig.core.allocate(big, 1, 0, [Ask(gpus=8, node_id=f"n{i}") for i in range(3)], [], [], rig.now)
    learners = [Learner(rank, g.node_id, list(g.gpu_indices), g.container_id) for rank, g in enumerate(r.grants)]
    rig.core.allocate(big, 1, 1, [], [], [AttemptUpdate(1, JobState.ALLOCATING, learners)], rig.now)
    rig.job("b", 16)
    assert rig.core.revoke_hoarded(rig.now) == []
