"""An idle AM's back-off cycles skipped arithmetically (`Master.catch_up`, am/acquire.py `idle_at_last_level`):
whenever the plan at its last level fails on its view, every cycle until a new view fails alike, so catching up
skips them without planning, and ends in exactly the state stepping through every deadline reaches. Pure: a
fake clock, no driver."""

from __future__ import annotations

import random

from gpurm.am.master import Master, Phase
from gpurm.am.placement import ServerView, View, plan
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel, LocalityMode

DAY = 86_400.0


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def spec(gpus: int, mode: LocalityMode = LocalityMode.PREFER, share: int = 0) -> JobSpec:
    return JobSpec(gpus=gpus, command=["train"], gpu_share_milli=share,
                   locality=Locality(timeout_s=60, backoff_base_s=10, backoff_max_s=600,
                                     start_level=LocalityLevel.PACKED, mode=mode))


def twins(job: JobSpec, servers: list[ServerView]) -> tuple[Master, Master]:
    """Two AMs of one job with the same random stream, having planned on one view at 0 and given up the first
    level (or one of its own) at its timeout: backing off."""
    pair = []
    for _ in range(2):
        m = Master(job, 0.0, rng=random.Random(7))
        m.on_view(servers, 0.0)
        m.step(m.next_deadline() or 0.0)
        pair.append(m)
    return pair[0], pair[1]


def step_through(m: Master, now: float) -> None:
    """What catch_up stands for: a step at every deadline up to `now`, in order."""
    while (deadline := m.next_deadline()) is not None and deadline <= now:
        m.step(deadline)


def state(m: Master) -> tuple[object, ...]:
    return (m.phase, m.level, m.level_since, m.backoffs, m.backoff_until, m.plan, m.cap, m.skipped,
            m.attempt.level, m.releases, dict(m.held), m.rng.getstate())


def test_a_one_server_job_is_skipped_while_no_server_has_its_gpus() -> None:
    # Two racks of four servers with 4 free GPUs each: 16 free per rack, so the aggregates cannot rule out an
    # 8-GPU job at `packed`, yet no single server holds it (the one-server rule keeps it at `packed`).
    servers = [srv(f"r{r}s{s}", f"r{r}", 4) for r in range(2) for s in range(4)]
    skipped, stepped = twins(spec(8), servers)
    assert skipped.level is LocalityLevel.PACKED and skipped.phase is Phase.BACKOFF
    assert not skipped.view.cannot_fit(8, LocalityLevel.PACKED)
    assert skipped.stuck()                     # what lets catch_up skip its cycles without planning
    skipped.catch_up(3 * DAY)
    step_through(stepped, 3 * DAY)
    assert state(skipped) == state(stepped)
    assert skipped.backoffs > 100


def test_a_two_gpu_job_is_skipped_while_no_server_has_two_free() -> None:
    servers = [srv(f"s{s}", "r0", 1) for s in range(8)]
    skipped, stepped = twins(spec(2), servers)
    assert skipped.stuck()
    skipped.catch_up(DAY)
    step_through(stepped, DAY)
    assert state(skipped) == state(stepped) and skipped.backoffs > 50


def test_a_strict_job_whose_rack_has_the_gpus_but_not_on_few_enough_servers() -> None:
    # 16 GPUs at `packed` need two whole servers of one rack: this rack has 16 free, on four servers.
    servers = [srv("a", "r1", 4), srv("b", "r1", 4), srv("c", "r1", 4), srv("d", "r1", 4), srv("e", "r2", 0)]
    skipped, stepped = twins(spec(16, mode=LocalityMode.STRICT), servers)
    assert skipped.level is LocalityLevel.PACKED and skipped.stuck()
    skipped.catch_up(DAY)
    step_through(stepped, DAY)
    assert state(skipped) == state(stepped) and skipped.backoffs > 50


def test_the_servers_to_avoid_count_in_the_proof() -> None:
    # At `any`, the only free GPUs are on a server the job avoids (its learner failed there): every plan fails.
    servers = [srv("bad", "r1", 8), srv("b", "r1", 0)]
    skipped, stepped = twins(spec(4, mode=LocalityMode.ANY), servers)
    for m in (skipped, stepped):
        m.avoid.add("bad")
        m.step(m.next_deadline() or 0.0)         # the back-off ends: the plan, avoiding it, fails
    assert skipped.phase is Phase.PLANNING and skipped.level is LocalityLevel.ANY and skipped.plan is None
    assert skipped.stuck()
    skipped.catch_up(DAY)
    step_through(stepped, DAY)
    assert state(skipped) == state(stepped) and skipped.backoffs > 50


def test_a_plan_that_would_succeed_is_made_at_the_first_back_off_end() -> None:
    # The view it backed off in has a whole free server now (the plan was taken, then freed): nothing is skipped.
    skipped, stepped = twins(spec(8), [srv("a", "r1", 4), srv("b", "r1", 4)])
    for m in (skipped, stepped):
        m.view = m.view.updated([srv("a", "r1", 8)])
    assert not skipped.stuck()
    skipped.catch_up(DAY)
    step_through(stepped, DAY)
    assert state(skipped) == state(stepped)
    assert skipped.backoffs > 50           # each cycle planned and asked; nobody granted, it timed out


def test_a_shared_gpu_job_is_never_skipped() -> None:
    # A share of one GPU plans without the view (the RM knows where shares fit): each back-off ends in asks.
    skipped, stepped = twins(spec(1, mode=LocalityMode.ANY, share=500), [srv("a", "r1", 0)])
    assert skipped.phase is Phase.BACKOFF and not skipped.stuck()
    skipped.catch_up(DAY)
    step_through(stepped, DAY)
    assert state(skipped) == state(stepped)


def test_the_aggregates_decide_a_plan_exactly_where_they_claim_to() -> None:
    # View.fits against the planner itself, on random clusters (racks of servers of 4 or 8 GPUs, some busy).
    rng = random.Random(3)
    decided = 0
    for _ in range(400):
        servers = [srv(f"r{r}s{s}", f"r{r}", rng.choice((0, 0, 1, 2, 3, 4, 6, 8)) % (size + 1), size)
                   for r in range(rng.randint(1, 3)) for s in range(rng.randint(1, 4))
                   for size in [rng.choice((4, 8))]]
        view = View(servers)
        for gpus in (1, 2, 3, 4, 6, 8, 12, 16, 24):
            for level in LocalityLevel:
                fits = view.fits(gpus, level)
                if fits is not None:
                    decided += 1
                    assert fits == (plan(gpus, servers, level) is not None), (gpus, level, servers)
    assert decided > 10_000
