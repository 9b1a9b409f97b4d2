"""The shortcuts the simulator's hot paths take give the answers the plain computations give: incremental views,
the planner's per-view memo of failed plans and its cheap tie-breaking, GPU choice without NVLink islands."""

from __future__ import annotations

import random

import pytest

from gpurm.am.placement import ServerView, View, plan
from gpurm.common.gpus import choose_in_islands
from gpurm.common.jobspec import LocalityLevel as L


def random_servers(rng: random.Random, n: int = 12) -> list[ServerView]:
    out = []
    for k in range(n):
        total = rng.choice([2, 4, 8])
        free = tuple(sorted(rng.sample(range(total), rng.randint(0, total))))
        out.append(ServerView(f"n{k:02d}", f"r{k % 3}", total, free, tuple((i,) for i in range(total))))
    return out


def aggregates(v: View) -> tuple[object, ...]:
    return (v.servers, v.free_on, v.total_free, v.max_free, v.max_domain_free,
            [v.fewest_servers(g) for g in (1, 3, 8, 17)])


@pytest.mark.parametrize("seed", range(20))
def test_an_updated_view_equals_a_rebuilt_one(seed: int) -> None:
    rng = random.Random(seed)
    servers = random_servers(rng)
    view = View(servers)
    for _ in range(5):
        changed = []
        for k in rng.sample(range(len(servers)), rng.randint(1, 4)):
            s = servers[k]
            free = tuple(sorted(rng.sample(range(s.total), rng.randint(0, s.total))))
            servers[k] = ServerView(s.node_id, s.rack, s.total, free, s.islands)
            changed.append(servers[k])
        view = view.updated(changed)
        assert aggregates(view) == aggregates(View(servers))


@pytest.mark.parametrize("seed", range(30))
def test_the_salt_breaks_ties_but_never_decides_whether_a_plan_exists(seed: int) -> None:
    rng = random.Random(seed)
    view = View(random_servers(rng))
    for gpus in (1, 2, 3, 5, 8, 12):
        for level in L:
            plans = [plan(gpus, view, level, salt=salt) for salt in (None, 1, 7, 12345)]
            assert len({p is None for p in plans}) == 1
            if level in (L.NODE, L.ANY):   # one pool of servers: the greedy takes the same sizes whatever the salt
                shapes = {tuple(part.gpus for part in p.parts) for p in plans if p is not None}
                assert len(shapes) <= 1
            if plans[0] is None:       # remembered on the view: asked again, still none
                assert plan(gpus, view, level, salt=99) is None


def test_a_plan_with_salt_matches_the_plain_best_fit_order() -> None:
    servers = [ServerView("a", "r1", 8, (6, 7)), ServerView("b", "r1", 8, (7,)), ServerView("c", "r2", 8, (7,))]
    p = plan(1, servers, L.ANY, salt=5)
    assert p is not None and p.parts[0].node_id in ("b", "c")
    assert plan(1, servers, L.ANY, salt=5) == p              # the memo of tie keys changes nothing


@pytest.mark.parametrize("count", range(0, 6))
def test_gpus_without_nvlink_are_the_lowest_free(count: int) -> None:
    free = [1, 3, 4, 6, 7]
    singles = [[i] for i in range(8)]
    expected = sorted(free)[:count] if count <= len(free) else None
    assert choose_in_islands(free, singles, count) == expected
    assert choose_in_islands(free, singles, 2, preferred=[6, 7]) == [6, 7]
    # Real islands still keep a container on one of them.
    assert choose_in_islands([0, 4, 5, 6], [[0, 1, 2, 3], [4, 5, 6, 7]], 2) == [4, 5]


def test_cached_standing_follows_learners_starting_and_ending() -> None:
    from gpurm.common.gpus import GpuRecord
    from gpurm.common.jobspec import JobSpec
    from gpurm.rm.sched.scheduler import Ask
    from gpurm.rm.state.core import ContainerReport, NodeRegistration, RMCore, RMSettings

    core = RMCore(RMSettings())
    core.register_node(NodeRegistration("n1", "h", 1, "r1", "r1", [GpuRecord(i) for i in range(4)]), "s", 0.0)
    job = core.submit(JobSpec(gpus=2, command=["x"]), "alice", 1.0)
    (launch,) = [e for e in core.take_outbox() if type(e).__name__ == "LaunchAM"]
    core.node_heartbeat("n1", "s", [ContainerReport(launch.container_id, "RUNNING", pid=1)], 1.0)
    core.register_am(job.job_id, launch.am_attempt, 1.0)
    waiting = core.standing(job, 5.0)
    assert (waiting.attained_gpu_s, waiting.running_since) == (0.0, -1.0)
    assert core.standing(job, 50.0) is waiting                 # running nothing: unchanged by the clock
    r = core.allocate(job.job_id, launch.am_attempt, 0, [Ask(gpus=2, node_id="n1")], [], [], 10.0)
    (grant,) = r.grants
    assert core.standing(job, 10.0).running_since == -1.0     # granted, not started
    core.node_heartbeat("n1", "s", [ContainerReport(grant.container_id, "RUNNING", pid=2)], 10.0)
    s = core.standing(job, 20.0)
    assert (s.attained_gpu_s, s.running_since) == (20.0, 10.0)
    assert core.standing(job, 30.0).attained_gpu_s == 40.0
    core.node_heartbeat("n1", "s", [ContainerReport(grant.container_id, "EXITED", exit_code=1)], 40.0)
    done = core.standing(job, 100.0)
    assert (done.attained_gpu_s, done.running_since, done.waiting_since) == (60.0, -1.0, 40.0)
