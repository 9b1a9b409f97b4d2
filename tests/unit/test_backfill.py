"""The backfill walk (rm/sched/backfill.py), the waiting book (rm/sched/waiting.py) and the planning view with
reservations (rm/state/planview.py, am/placement.py): who gets a reservation, who is told to plan, which GPUs a job
may plan on. Pure: hand-made clusters, estimated ends given, an injected `now`."""

from __future__ import annotations

from gpurm.am.placement import BACKFILL_MARGIN_S, plan
from gpurm.common.jobspec import LocalityLevel
from gpurm.rm.sched.backfill import Waiter, WalkSettings, walk
from gpurm.rm.sched.behind import Behind
from gpurm.rm.sched.elastic import ElasticBook
from gpurm.rm.sched.reservations import Reservations
from gpurm.rm.sched.waiting import WaitingBook
from gpurm.rm.state.planview import PlanView
from tests.unit.test_reservations import Ends, cluster, fill_with_one_gpu_jobs

PACKED = LocalityLevel.PACKED


def setup(servers: int = 2) -> tuple[Ends, Reservations, PlanView]:
    c = cluster({"r1": servers})
    ends = Ends(c)
    res = Reservations(c, ends, limit=1)
    return ends, res, PlanView(c, ElasticBook(c), res)


def waiter(job_id: str, gpus: int, since: float = 0.0, run_s: float = 1000.0,
           level: LocalityLevel | None = PACKED) -> Waiter:
    return Waiter(job_id, gpus, level, since, run_s)


def test_the_first_job_that_cannot_be_placed_gets_the_reservation_and_later_ones_do_not() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    ends.finish("r1-n0", "r1-n0-c3")                      # one GPU free: a one-GPU job fits, an 8-GPU job does not
    told = walk([iter([waiter("small", 1), waiter("big", 8), waiter("big2", 8)])], pv.current(), res,
                WalkSettings(), set(), now=0.0)
    assert told == []                                     # nothing is ready; fitting jobs find GPUs themselves
    assert list(res.by_job) == ["big"]
    assert res.by_job["big"].parts == {"r1-n1": 8}        # the server expected to free soonest


def test_a_job_waits_reserve_after_before_it_gets_a_reservation() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    settings = WalkSettings(reserve_after_s=600.0)
    walk([iter([waiter("big", 8, since=0.0)])], pv.current(), res, settings, set(), now=599.0)
    assert not res.by_job
    walk([iter([waiter("big", 8, since=0.0)])], pv.current(), res, settings, set(), now=600.0)
    assert list(res.by_job) == ["big"]


def test_a_ready_reservation_tells_its_holder_to_plan_and_a_relaxed_holder_keeps_its_servers() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    walk([iter([waiter("big", 8)])], pv.current(), res, WalkSettings(), set(), now=0.0)
    for i in range(8):
        ends.finish("r1-n1", f"r1-n1-c{i}")
    ready = set(res.ready(400.0))
    assert ready == {"big"}
    assert walk([iter([waiter("big", 8)])], pv.current(), res, WalkSettings(), ready, now=400.0) == ["big"]
    # Its AM relaxed to RACK: the server reserved for PACKED suits RACK too, and what drained there is kept.
    walk([iter([waiter("big", 8, level=LocalityLevel.RACK)])], pv.current(), res, WalkSettings(), ready, 401.0)
    assert res.by_job["big"].level is LocalityLevel.RACK and res.by_job["big"].parts == {"r1-n1": 8}
    # A holder whose plans no longer suit its servers (a stricter level) loses them.
    walk([iter([waiter("big", 8, level=LocalityLevel.NODE)])], pv.current(), res, WalkSettings(), ready, 402.0)
    assert "big" not in res.by_job or res.by_job["big"].level is LocalityLevel.NODE


def test_spread_jobs_and_shares_get_no_reservation() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    walk([iter([waiter("spread", 8, level=None)])], pv.current(), res, WalkSettings(), set(), now=0.0)
    assert not res.by_job


def test_reserved_gpus_leave_the_view_for_others_and_come_back_for_the_holder_and_short_jobs() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    res.reserve("big", 8, PACKED, now=0.0)                # r1-n1, expected free at 350
    for i in range(1, 5):
        ends.finish("r1-n1", f"r1-n1-c{i}")               # four GPUs free there, held for "big"
    view = pv.current()
    s = view.reserved_on["r1-n1"]
    assert s.free == () and len(s.reserved) == 4 and s.reserved_for == "big"
    assert view.total_free == 0
    assert view.for_job("big", 0.0, 5000.0).total_free == 4
    # A one-GPU job may backfill only when it is expected to end (with the margin) before 350.
    assert view.for_job("short", 0.0, 350.0 - BACKFILL_MARGIN_S).total_free == 4
    assert view.for_job("long", 0.0, 351.0 - BACKFILL_MARGIN_S).total_free == 0
    assert plan(1, view.for_job("long", 0.0, 1000.0), PACKED) is None
    res.release("big")
    assert pv.current().total_free == 4                   # the view follows the release (the servers touched)


def test_the_waiting_book_keeps_each_queue_in_rank_order_and_promotes_the_starved_once() -> None:
    book = WaitingBook()
    book.put("b", "root.q", (0.0, 2.0, 0), starve_at=100.0)
    book.put("a", "root.q", (0.0, 1.0, 0), starve_at=float("inf"))
    book.put("c", "root.other", (0.0, 3.0, 0), starve_at=float("inf"))
    assert list(book.in_order("root.q", 10)) == ["a", "b"]
    assert list(book.in_order("root.q", 1)) == ["a"]
    v = book.version
    book.put("a", "root.q", (0.0, 1.0, 0), starve_at=float("inf"))
    assert book.version == v                              # the same rank again: no change
    assert book.due(99.0) == [] and book.next_due() == 100.0
    assert book.due(100.0) == ["b"] and book.due(200.0) == []
    book.discard("b")
    book.discard("b")
    assert "b" not in book and len(book) == 2 and sorted(book.leaves()) == ["root.other", "root.q"]


def test_the_first_starving_job_in_the_order_gets_the_reservation() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    behind = Behind(behind=2.0)                           # starving past 1,200 s (the floor)
    # The first job in the order has not waited long enough, nor has the next queue's; the second job has.
    queues = [iter([waiter("fresh", 8, since=500.0), waiter("old", 8, since=0.0)]),
              iter([waiter("other", 8, since=100.0)])]
    walk(queues, pv.current(), res, WalkSettings(), set(), 1250.0, behind)
    assert list(res.by_job) == ["old"]


def test_only_a_starving_job_gets_a_reservation() -> None:
    ends, res, pv = setup()
    fill_with_one_gpu_jobs(ends.c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    behind = Behind(behind=2.0)
    for _ in range(20):
        behind.started(1, 1500.0)                         # one-GPU jobs queue 1,500 s: starving past 3,000 s
    walk([iter([waiter("big", 8, since=0.0)])], pv.current(), res, WalkSettings(), set(), 2999.0, behind)
    assert not res.by_job
    walk([iter([waiter("big", 8, since=0.0)])], pv.current(), res, WalkSettings(), set(), 3000.0, behind)
    assert list(res.by_job) == ["big"]
