"""`placement: spread`: the planner's spread plans and the Master's per-server cap (relaxing, strict, any)."""

from __future__ import annotations

import random

import pytest

from gpurm.am.master import Held, Launch, Master, Phase
from gpurm.am.placement import ServerView, plan, plan_spread, spread_shape_cap
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel, LocalityMode, Placement


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def layout(p: object) -> list[tuple[str, int]]:
    assert p is not None
    return sorted((part.node_id, part.gpus) for part in p.parts)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the planner

def test_four_gpus_go_one_per_server_where_four_servers_have_one_free() -> None:
    servers = [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r1", 8), srv("d", "r1", 8)]
    assert layout(plan_spread(4, servers, cap=1)) == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    assert layout(plan(4, servers, LocalityLevel.PACKED)) == [("a", 4)]     # the same job packed: one server


def test_distinct_racks_come_first_then_distinct_servers() -> None:
    servers = [srv("a1", "r1", 8), srv("a2", "r1", 8), srv("a3", "r1", 8),
               srv("b1", "r2", 8), srv("c1", "r3", 8)]
    p = plan_spread(3, servers, cap=1)
    assert p is not None and sorted(part.rack for part in p.parts) == ["r1", "r2", "r3"]
    p = plan_spread(4, servers, cap=1)
    assert p is not None and len({part.node_id for part in p.parts}) == 4
    assert {part.rack for part in p.parts} == {"r1", "r2", "r3"}


def test_fullest_servers_first_so_whole_servers_stay_free() -> None:
    servers = [srv("whole", "r1", 8), srv("busy", "r1", 1), srv("half", "r1", 4)]
    assert layout(plan_spread(2, servers, cap=1)) == [("busy", 1), ("half", 1)]


def test_cap_bounds_the_gpus_per_server_and_waits_when_it_cannot() -> None:
    servers = [srv("a", "r1", 8), srv("b", "r2", 8)]
    assert plan_spread(4, servers, cap=1) is None           # only two servers: one per server cannot be
    assert layout(plan_spread(4, servers, cap=2)) == [("a", 2), ("b", 2)]
    assert layout(plan_spread(5, servers, cap=0)) in ([("a", 3), ("b", 2)], [("a", 2), ("b", 3)])
    # No cap still spreads over every server that has a free GPU, evenly.
    assert layout(plan_spread(6, [srv("a", "r1", 8), srv("b", "r1", 1), srv("c", "r2", 8)], cap=0)) in (
        [("a", 3), ("b", 1), ("c", 2)], [("a", 2), ("b", 1), ("c", 3)])
    assert plan_spread(9, [srv("a", "r1", 4), srv("b", "r1", 4)], cap=0) is None


def test_avoided_servers_and_busy_gpus_are_left_out() -> None:
    servers = [srv("a", "r1", 8), srv("b", "r1", 0), srv("c", "r2", 8), srv("d", "r2", 8)]
    assert layout(plan_spread(2, servers, cap=1, avoid=["a"])) == [("c", 1), ("d", 1)]
    assert plan_spread(3, servers, cap=1, avoid=["a"]) is None
    p = plan_spread(1, [srv("a", "r1", 3)], cap=1)
    assert p is not None and p.parts[0].gpu_indices == (5,)   # a free GPU (5, 6, 7 are free)


def test_salt_breaks_ties_between_equal_servers() -> None:
    servers = [srv(f"n{k}", "r1", 8) for k in range(16)]
    picks = {layout(plan_spread(1, servers, cap=1, salt=s))[0][0] for s in range(20)}
    assert len(picks) > 1


@pytest.mark.parametrize("gpus, sizes, cap", [
    (4, [8, 8, 8, 8], 1), (4, [8, 8], 2), (5, [8, 8], 3), (8, [8], 8), (9, [8], 0), (4, [8, 8, 1, 1], 1),
    (6, [8, 1, 1], 4), (3, [], 0)])
def test_shape_cap_is_the_least_cap_a_full_cluster_could_give(gpus: int, sizes: list[int], cap: int) -> None:
    assert spread_shape_cap(gpus, sizes) == cap


# ---------------------------------------------------------------- the Master

def spread_job(gpus: int, mode: LocalityMode = LocalityMode.PREFER) -> JobSpec:
    return JobSpec(gpus=gpus, command=["serve"], placement=Placement.SPREAD,
                   locality=Locality(timeout_s=60, backoff_base_s=10, backoff_max_s=600, mode=mode))


def grant_all(m: Master, now: float) -> None:
    for k, (node, _gpus, idx) in enumerate(m.asks()):
        m.on_grant(Held(f"c-{node}-{k}", node, "r", f"h-{node}", 1, idx), now)


def launch_of(m: Master) -> Launch:
    (launch,) = [a for a in m.take_actions() if isinstance(a, Launch)]
    return launch


def test_master_spreads_four_learners_with_the_torchrun_env() -> None:
    m = Master(spread_job(4), 0.0, rng=random.Random(1))
    m.on_view([srv(n, r, 8) for n, r in (("a", "r1"), ("b", "r1"), ("c", "r2"), ("d", "r2"))], 0.0)
    assert sorted((n, g) for n, g, _ in m.asks()) == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    grant_all(m, 0.0)
    launch = launch_of(m)
    envs = [env for _, _, env in launch.learners]
    assert sorted(e["NODE_RANK"] for e in envs) == ["0", "1", "2", "3"]
    assert all(e["NNODES"] == "4" and e["WORLD_SIZE"] == "4" and e["NPROC_PER_NODE"] == "1" for e in envs)
    assert m.attempt.level == "spread:1"


def test_prefer_allows_one_more_per_server_after_each_timeout() -> None:
    m = Master(spread_job(6), 0.0, rng=random.Random(2))
    # Three servers of 8 for six GPUs: the shape allows two per server at best, so that is where it starts; c has
    # one free GPU now, so two per server does not fit yet.
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 1)], 1.0)
    assert m.cap == 2 and m.attempt.level == "spread:2"
    assert m.asks() == []
    m.take_reports(1.0)
    assert "6 GPUs spread, at most 2 per server" in m.attempt.waiting_reason
    m.step(61.0)                          # its level clock started when the view came (1.0)
    assert m.phase is Phase.BACKOFF and "then trying spread:3" in m.waiting_reason(61.0)
    m.step(m.backoff_until)
    assert m.cap == 3 and m.attempt.level == "spread:3"
    assert sorted((n, g) for n, g, _ in m.asks()) == [("a", 3), ("b", 2), ("c", 1)] or \
        sorted((n, g) for n, g, _ in m.asks()) == [("a", 2), ("b", 3), ("c", 1)]


def test_strict_never_allows_more_per_server() -> None:
    m = Master(spread_job(4, LocalityMode.STRICT), 0.0, rng=random.Random(3))
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8), srv("d", "r2", 0)], 0.0)
    assert m.cap == 1 and m.asks() == []
    now = 0.0
    for _ in range(4):
        now += 60
        m.step(now)
        assert m.phase is Phase.BACKOFF
        assert "locality strict" in m.waiting_reason(now)
        now = m.backoff_until
        m.step(now)
        assert m.cap == 1 and m.asks() == []
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8), srv("d", "r2", 2)], now)
    assert sorted(n for n, _, _ in m.asks()) == ["a", "b", "c", "d"]


def test_locality_any_spreads_over_what_is_free_without_waiting() -> None:
    m = Master(spread_job(4, LocalityMode.ANY), 0.0, rng=random.Random(4))
    m.on_view([srv("a", "r1", 8), srv("b", "r2", 8), srv("c", "r2", 0)], 0.0)
    assert m.cap == 0 and m.attempt.level == "spread:any"
    assert sorted((n, g) for n, g, _ in m.asks()) == [("a", 2), ("b", 2)]


def test_a_pack_job_is_unchanged_by_the_field() -> None:
    job = JobSpec(gpus=4, command=["train"], locality=Locality(timeout_s=60))
    m = Master(job, 0.0, rng=random.Random(5))
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 8)], 0.0)
    assert [(n, g) for n, g, _ in m.asks()] == [("a", 4)] and m.attempt.level == "packed" and not m.spread


def test_catching_up_raises_the_cap_cycle_by_cycle_and_only_then_skips_idle_cycles() -> None:
    # A full cluster: nothing fits at any cap. A driver that skips timer events (the simulator) must still see the
    # cap go 1 -> 2 -> 3 -> no cap, as stepping through every deadline would.
    full = [srv(n, "r1", 0) for n in "abcd"]
    stepped = Master(spread_job(4), 0.0, rng=random.Random(9))
    stepped.on_view(full, 0.0)
    skipped = Master(spread_job(4), 0.0, rng=random.Random(9))
    skipped.on_view(full, 0.0)
    caps = [stepped.cap]
    while (deadline := stepped.next_deadline()) is not None and deadline <= 5000:
        stepped.step(deadline)
        if stepped.cap != caps[-1]:
            caps.append(stepped.cap)
    assert caps == [1, 2, 3, 0]
    skipped.catch_up(5000)
    assert (skipped.cap, skipped.backoffs, skipped.backoff_until, skipped.phase) == \
        (stepped.cap, stepped.backoffs, stepped.backoff_until, stepped.phase)
    skipped.take_reports(5000)
    assert skipped.attempt.level == "spread:any"
