"""Borrowed capacity ordered by a policy (queues.yaml `borrowing`, rm/sched/borrowing.py): which jobs borrow, the
order the scheduling pass serves borrowers in, and who may preempt whom. Through the pure RM core with a fake clock
and AMs played by the test (tests/unit/test_fair_scheduling.py's rig), and `borrowers` on its own."""

from __future__ import annotations

import pytest

from gpurm.common.model import ContainerPhase
from gpurm.queues.config import parse_queues
from gpurm.queues.fairshare import compute_shares
from gpurm.queues.tree import Borrowing, Policy
from gpurm.rm.sched.borrowing import Runner, borrowers
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.server.metrics import RMMetrics
from gpurm.rm.state.core import ContainerReport
from gpurm.rm.state.queuebook import QueueBook
from tests.unit.test_fair_scheduling import Rig
from tests.unit.test_metrics import samples

NO_FAIR_SHARE = "defaults: {fair_share_preemption_timeout: off, min_share_preemption_timeout: off}\n"


def three(borrowing: str, defaults: str = "") -> str:
    head = f"borrowing: {borrowing}\n" if borrowing else ""
    return f"{head}{defaults}queues:\n  a: {{}}\n  b: {{}}\n  c: {{}}\n"


def two(borrowing: str, defaults: str = NO_FAIR_SHARE, a: str = "{}") -> str:
    return f"borrowing: {borrowing}\n{defaults}queues:\n  a: {a}\n  b: {{}}\n"


def rig_at(queues: str, nodes: int) -> Rig:
    rig = Rig(queues, nodes=nodes)
    rig.now = 1.0                 # a learner started at 0 reads as not started
    return rig


def run(rig: Rig, queue: str, gpus: int, node: str) -> str:
    """A job of `queue` granted `gpus` on `node` now, its learners running."""
    j = rig.job(queue, gpus)
    assert rig.ask(j, [Ask(gpus=gpus, node_id=node)])
    return j


def deadlines(rig: Rig) -> set[str]:
    return {c.job_id for c in rig.core.containers.values() if c.preempt_deadline}


# ---------------------------------------------------------------- who borrows


def test_borrowers_are_the_jobs_wholly_beyond_the_steady_share_best_ranked_first_keeping_it() -> None:
    book = QueueBook(parse_queues("borrowing: las\nqueues:\n  a: {}\n  b: {preemptible: false}\n"))
    steady = {"root.a": 4, "root.b": 4}
    running = [Runner("x", "root.a", 4, (1.0, 0.0, 1)), Runner("y", "root.a", 2, (0.0, 0.0, 2)),
               Runner("z", "root.a", 2, (0.0, 0.0, 3)), Runner("w", "root.a", 1, (2.0, 0.0, 4)),
               Runner("p", "root.b", 8, (0.0, 0.0, 5)), Runner("q", "root.b", 8, (3.0, 0.0, 6))]
    # y and z (the best ranks) fill a's 4 GPUs; x and w lie wholly beyond. b is not preemptible: it lends nothing.
    assert borrowers(book, steady, running) == {"x", "w"}
    # A job that straddles the share is inside it: 3 + 3 GPUs on a share of 4 leave nobody wholly beyond.
    assert borrowers(book, steady, [Runner("s", "root.a", 3, (0.0, 0.0, 1)),
                                    Runner("t", "root.a", 3, (1.0, 0.0, 2))]) == set()
    # A queue with no steady share (weight 0) borrows everything it runs.
    assert borrowers(book, {"root.a": 0}, [Runner("u", "root.a", 1, (0.0, 0.0, 1))]) == {"u"}


def test_the_shown_preemptible_jobs_are_the_borrowers_by_rank_not_the_newest() -> None:
    rig = rig_at(two("las"), 2)
    first = rig.job("a", 8)
    second = rig.job("a", 8)
    rig.ask(second, [Ask(gpus=8, node_id="n1")])      # started first ...
    rig.now += 10
    rig.ask(first, [Ask(gpus=8, node_id="n0")])       # ... but submitted later: both at las level 0
    rig.now += 10
    rig.core.tick(rig.now)
    assert rig.core.preemptible_jobs() == {second}     # by rank (the submit order breaks the tie), not by start


# ---------------------------------------------------------------- the order borrowed GPUs go in


@pytest.mark.parametrize("borrowing", ["", "las"])
def test_borrowed_gpus_go_to_the_best_ranked_job_of_any_queue(borrowing: str) -> None:
    rig = rig_at(three(borrowing), 3)
    run(rig, "a", 8, "n0")
    run(rig, "b", 8, "n1")                            # a and b at their steady share (8), c idle
    wa, wb = rig.job("a", 8), rig.job("b", 8)
    rig.core.jobs[wa].attained_gpu_s = 5000.0         # ran before: las level 1
    rig.ask(wa, [Ask(gpus=8)], schedule=False)
    rig.ask(wb, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    # fair: a and b are equally served (8 of an instantaneous share of 12): the path breaks the tie. las: b's
    # fresh job outranks a's, whatever its queue.
    assert g.job_id == (wb if borrowing else wa)
    assert rig.core.containers[g.container_id].preemptible      # beyond its queue's steady share


def test_a_queue_below_its_steady_share_is_served_before_any_borrower() -> None:
    rig = rig_at(three("las"), 3)
    run(rig, "a", 8, "n0")
    run(rig, "a", 8, "n1")                            # a borrows 8
    wa, wb = rig.job("a", 8), rig.job("b", 8)
    rig.core.jobs[wb].attained_gpu_s = 50000.0        # las level 2: ranks behind a's fresh job ...
    rig.ask(wa, [Ask(gpus=8)], schedule=False)
    rig.ask(wb, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    assert g.job_id == wb                             # ... but b's job is inside b's steady share: guaranteed
    assert not rig.core.containers[g.container_id].preemptible


def test_a_gang_that_starts_below_the_steady_share_is_inside_it_though_it_straddles_it() -> None:
    rig = rig_at("borrowing: las\nqueues:\n  a: {}\n  b: {}\n  c: {}\n  d: {}\n", 4)   # steady shares of 8
    run(rig, "a", 8, "n0")
    borrower = run(rig, "a", 8, "n1")
    run(rig, "b", 4, "n2")                            # b uses 4 of 8
    wa, wb = rig.job("a", 8), rig.job("b", 8)
    rig.core.jobs[wb].attained_gpu_s = 50000.0
    rig.ask(wa, [Ask(gpus=8)], schedule=False)
    rig.ask(wb, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    assert g.job_id == wb                             # 4 + 8 > 8, but it starts below b's share: guaranteed
    rig.core.node_heartbeat(g.node_id, "s" + g.node_id[1:], [ContainerReport(g.container_id, "RUNNING", pid=1)],
                            rig.now)
    rig.now = 5000.0
    rig.core.tick(rig.now)
    assert rig.core.preemptible_jobs() == {borrower}  # b's straddler (12 of 8) is not a borrower


def test_the_pass_ranks_borrowers_by_the_borrowing_policy_not_the_leaf_policy() -> None:
    # fifo leaves, borrowing las: inside the guarantee each queue keeps its own order, beyond it las ranks.
    rig = rig_at(three("las"), 3)
    run(rig, "a", 8, "n0")
    run(rig, "b", 8, "n1")
    old_b = rig.job("b", 8)
    fresh_a = rig.job("a", 8)
    rig.core.jobs[old_b].attained_gpu_s = 5000.0
    rig.ask(old_b, [Ask(gpus=8)], schedule=False)
    rig.ask(fresh_a, [Ask(gpus=8)], schedule=False)
    (g,) = rig.core.schedule(rig.now)
    assert g.job_id == fresh_a


# ---------------------------------------------------------------- preemption of borrowers


def test_a_better_ranked_waiting_job_preempts_a_borrower_of_another_queue() -> None:
    rig = rig_at(three("las", NO_FAIR_SHARE), 3)
    keep = run(rig, "a", 8, "n0")                     # inside a's steady share (8)
    borrower = run(rig, "a", 8, "n1")                 # wholly beyond it
    run(rig, "b", 8, "n2")                            # b at its steady share: its next job would borrow
    rig.now = 200.0
    wb = rig.job("b", 8)
    rig.core.tick(rig.now)
    assert deadlines(rig) == set()                    # both at las level 0 (1,600 GPU-s), and not run 300 s yet
    rig.now = 2000.0                                  # 16,000 GPU-s each: level 1; b's new job is at level 0
    rig.core.tick(rig.now)
    assert deadlines(rig) == {borrower}               # the borrower, never a job inside its queue's share
    assert rig.core.borrow.preemptions == 1
    assert samples(RMMetrics(lambda: rig.core).render())[("gpurm_borrowing_preemptions_total", ())] == 1
    c = next(c for c in rig.core.containers.values() if c.job_id == borrower and c.preempt_deadline)
    assert c.preempted_for == "root.b" and c.preempt_deadline == rig.now + 15.0   # a's grace (default 15 s)
    assert "outranked by" in rig.core.jobs[borrower].waiting_reason and "las" in rig.core.jobs[borrower].waiting_reason
    assert wb in rig.core.nudged                      # its AM is told to plan now
    rig.now += 1
    rig.core.tick(rig.now)
    assert rig.core.borrow.preemptions == 1           # one room per waiting job while its victim stops
    # The victim stops; the GPUs it frees are held for b (a's own AM cannot win them back).
    rig.now += 15
    rig.core.tick(rig.now)
    for n in list(rig.core.stops):
        for o in rig.core.take_stops(n, rig.now):
            rig.end(o.container_id)
    assert rig.ask(borrower, [Ask(gpus=8)]) == []
    assert len(rig.ask(wb, [Ask(gpus=8)])) == 1
    assert keep not in deadlines(rig)


def test_no_borrower_is_preempted_under_fair() -> None:
    rig = rig_at(f"{NO_FAIR_SHARE}queues:\n  a: {{}}\n  b: {{}}\n", 2)
    run(rig, "a", 8, "n0")
    run(rig, "a", 8, "n1")
    rig.job("b", 8)
    for t in (2000.0, 4000.0):
        rig.now = t
        rig.core.tick(rig.now)
    assert deadlines(rig) == set() and rig.core.borrow.preemptions == 0


def test_a_job_inside_its_queues_steady_share_is_never_preempted_for_a_borrower() -> None:
    rig = rig_at(two("las"), 2)
    run(rig, "a", 8, "n0")                            # a's whole steady share: level 2 by the time b waits
    run(rig, "b", 8, "n1")
    rig.now = 50000.0
    rig.job("b", 8)                                   # b's next job would borrow; it outranks a's, but a lends none
    rig.core.tick(rig.now)
    assert deadlines(rig) == set()


def test_a_non_preemptible_queue_lends_nothing_to_take_back() -> None:
    rig = rig_at(two("las", a="{preemptible: false}"), 2)
    run(rig, "a", 8, "n0")
    run(rig, "a", 8, "n1")
    rig.now = 5000.0
    rig.job("b", 8)
    rig.core.tick(rig.now)
    assert deadlines(rig) == set()


def test_a_queue_below_its_steady_share_takes_it_back_from_borrowers_whatever_the_rank() -> None:
    rig = rig_at(two("las"), 2)
    run(rig, "a", 8, "n0")
    borrower = run(rig, "a", 8, "n1")
    rig.now = 2000.0                                  # a's borrower at las level 1
    wb = rig.job("b", 8)
    rig.core.jobs[wb].attained_gpu_s = 50000.0        # b's job ran before: level 2, behind a's borrower ...
    rig.core.jobs[wb].idle_since = rig.now
    rig.core.tick(rig.now)
    assert deadlines(rig) == {borrower}               # ... but it fits in b's steady share: its guarantee
    assert "takes its steady share back" in rig.core.jobs[borrower].waiting_reason
    assert rig.core.borrow.preemptions == 1


def test_the_waiting_job_must_outrank_the_borrower() -> None:
    rig = rig_at(three("las", NO_FAIR_SHARE), 3)
    run(rig, "a", 8, "n0")
    run(rig, "a", 8, "n1")
    run(rig, "b", 8, "n2")                            # b at its steady share: its next job would borrow too
    rig.now = 2000.0                                  # a's borrower at las level 1
    wb = rig.job("b", 8)
    rig.core.jobs[wb].attained_gpu_s = 5000.0         # b's job ran before: level 1 too (not starved yet)
    rig.core.jobs[wb].idle_since = rig.now
    rig.core.tick(rig.now)
    assert deadlines(rig) == set()
    rig.core.jobs[wb].attained_gpu_s = 0.0            # a fresh one (level 0) outranks the borrower
    rig.core.standings.runs_changed(wb)
    rig.now += 1.5
    rig.core.tick(rig.now)
    assert len(deadlines(rig)) == 1


# ---------------------------------------------------------------- guarantees under a borrowing policy


@pytest.mark.parametrize("borrowing", ["", "las"])
def test_fair_share_preemption_restores_the_steady_share_not_the_instantaneous_one(borrowing: str) -> None:
    # c is idle: a and b have an instantaneous share of 12, a steady share of 8. b uses 4 and wants 12.
    defaults = "defaults: {fair_share_preemption_timeout: 60s, min_share_preemption_timeout: off}\n"
    rig = rig_at(three(borrowing, defaults), 3)
    run(rig, "a", 8, "n0")
    run(rig, "a", 8, "n1")
    run(rig, "a", 4, "n2")
    run(rig, "b", 4, "n2")
    wb = rig.job("b", 8)
    rig.ask(wb, [Ask(gpus=8)])
    for dt in (1.0, 61.0, 62.0):
        rig.now = dt
        rig.core.tick(rig.now)
    # fair: 4 < 0.5 x 12: starved, and a's newest job goes. las: 4 >= 0.5 x 8: b keeps half its guarantee, and the
    # rest comes by rank (a's jobs, fresh, rank as b's: nobody is preempted).
    assert bool(deadlines(rig)) == (not borrowing)


@pytest.mark.parametrize("borrowing", ["", "las"])
def test_fair_share_preemption_under_a_borrowing_policy_takes_only_borrowers(borrowing: str) -> None:
    rig = rig_at(f"{'borrowing: ' + borrowing + chr(10) if borrowing else ''}"
                 "defaults: {fair_share_preemption_timeout: 60s, min_share_preemption_timeout: off}\n"
                 "queues:\n  a: {}\n  b: {}\n", 2)
    first, second = rig.job("a", 8), rig.job("a", 8)
    rig.ask(second, [Ask(gpus=8, node_id="n1")])      # the second submitted starts first ...
    rig.now = 1.5
    rig.ask(first, [Ask(gpus=8, node_id="n0")])       # ... the first submitted is the newest started
    wb = rig.job("b", 8)
    rig.ask(wb, [Ask(gpus=8)])
    for t in (2.0, 70.0):  # b starved (0 of 8) from 2 s
        rig.now = t
        rig.core.tick(rig.now)
    # fair takes the newest started; las only its borrower: the job ranked last (las level 0 both: submit order).
    assert deadlines(rig) == ({second} if borrowing else {first})
    assert rig.core.borrow.preemptions == 0           # a fair-share preemption, not a borrower's


# ---------------------------------------------------------------- the config


def test_borrowing_is_fair_by_default_and_takes_a_policy() -> None:
    assert parse_queues("queues:\n  a: {}\n").borrowing is Borrowing.FAIR
    assert Borrowing.FAIR.policy is None
    for name in ("fair", "las", "gittins"):
        tree = parse_queues(f"borrowing: {name}\nqueues:\n  a: {{}}\n")
        assert tree.borrowing is Borrowing(name)
    assert parse_queues("borrowing: gittins\nqueues:\n  a: {}\n").borrowing.policy is Policy.GITTINS


@pytest.mark.parametrize(("value", "says"), [("lifo", "'lifo'"), ("srtf", "gpurm sim --borrowing srtf"),
                                             ("[las]", "must be a string")])
def test_a_bad_borrowing_is_refused_naming_the_field(value: str, says: str) -> None:
    from gpurm.common.fields import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_queues(f"borrowing: {value}\nqueues:\n  a: {{}}\n", "q.yaml")
    (problem,) = info.value.problems
    assert problem.startswith("q.yaml: borrowing") and says in problem


def test_a_refresh_switches_borrowing_and_a_refused_one_leaves_it() -> None:
    from gpurm.common.fields import ConfigError

    rig = rig_at(two("las"), 2)
    assert rig.core.queues.borrowing is Policy.LAS
    with pytest.raises(ConfigError):
        parse_queues("borrowing: maybe\nqueues:\n  a: {}\n  b: {}\n")
    assert rig.core.queues.borrowing is Policy.LAS     # nothing was applied
    assert rig.core.replace_tree(parse_queues("queues:\n  a: {}\n  b: {}\n")) == []
    assert rig.core.queues.borrowing is None
    shares = compute_shares(rig.core.queues.tree.share_tree({"root.a": 8}), 16)
    assert rig.core.queues.between(shares) == shares.instantaneous


def test_a_grant_never_started_holds_no_place_among_the_borrowers() -> None:
    rig = rig_at(two("las"), 2)
    run(rig, "a", 8, "n0")
    j = rig.job("a", 8)
    r = rig.core.allocate(j, 1, 0, [Ask(gpus=8, node_id="n1")], [], [], rig.now)   # granted, not started
    assert r.grants and rig.core.containers[r.grants[0].container_id].phase is ContainerPhase.ALLOCATED
    rig.now = 5000.0
    rig.job("b", 8)
    rig.core.tick(rig.now)
    assert deadlines(rig) == set()                    # nothing started to preempt: its AM may still launch it
