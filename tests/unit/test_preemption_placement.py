"""Placement-aware fair-share preemption (rm/sched/preemption.py with a Placement): victims are chosen so that their
GPUs,
with the idle ones, make a room the starving queue's waiting job can use at its locality level, or nobody is
preempted. Pure: hand-made clusters, an injected `now`."""

from __future__ import annotations

from gpurm.queues.config import parse_queues
from gpurm.rm.sched import preemption
from gpurm.rm.sched.preemption import Candidate, Placement, Waiter
from gpurm.rm.sched.priority import Room
from gpurm.rm.state.queuebook import QueueBook

TIMEOUT = "defaults: {fair_share_preemption_timeout: 10s, min_share_preemption_timeout: off}\n"


class Book:
    """A queue book with jobs placed by hand: job -> (queue, started, {server: GPUs})."""

    def __init__(self, queues: str, servers: list[Room]) -> None:
        self.book = QueueBook(parse_queues(TIMEOUT + queues))
        self.servers = servers
        self.jobs: dict[str, tuple[str, float, dict[str, int]]] = {}

    def run(self, job_id: str, queue: str, started: float, where: dict[str, int]) -> None:
        gpus = sum(where.values())
        self.book.want(f"root.{queue}", gpus)
        self.book.charge(f"root.{queue}", "u", gpus)
        self.jobs[job_id] = (f"root.{queue}", started, where)

    def decide(self, waiting: dict[str, list[Waiter]], placed: bool = True) -> list[str]:
        for queue, ws in waiting.items():
            for w in ws:
                self.book.want(f"root.{queue}", w.gpus)
        used: dict[str, int] = {}
        for _, _, where in self.jobs.values():
            for node, g in where.items():
                used[node] = used.get(node, 0) + g
        servers = [Room(r.node_id, r.domain, r.size, r.size - used.get(r.node_id, 0)) for r in self.servers]
        capacity = sum(r.size for r in servers)
        candidates = [Candidate(j, q, sum(where.values()), started, i)
                      for i, (j, (q, started, where)) in enumerate(self.jobs.items())]
        held = {j: where for j, (_, _, where) in self.jobs.items()}
        placement = Placement(servers, held, {f"root.{q}": ws for q, ws in waiting.items()}) if placed else None
        shares = self.book.shares(capacity)
        assert preemption.decide(self.book, shares, 0.0, candidates, {}, placement) == []   # starving starts
        decisions = preemption.decide(self.book, shares, 20.0, candidates, {}, placement)
        return sorted(v.job_id for d in decisions for v in d.victims)


def two_servers(size: int = 8, racks: tuple[str, str] = ("r0", "r0")) -> list[Room]:
    return [Room("n0", racks[0], size, size), Room("n1", racks[1], size, size)]


def flooded() -> Book:
    # Queue a holds both 8-GPU servers in four 4-GPU jobs, alternating servers; the newest two sit on different
    # servers. b's share is 8.
    b = Book("queues:\n  a: {}\n  b: {}\n", two_servers())
    b.run("a1", "a", 1.0, {"n0": 4})
    b.run("a2", "a", 2.0, {"n1": 4})
    b.run("a3", "a", 3.0, {"n0": 4})
    b.run("a4", "a", 4.0, {"n1": 4})
    return b


def test_without_placement_the_newest_jobs_go_wherever_they_run() -> None:
    # Today's choice, kept when no placement is given: 4 GPUs freed on each server, useless to a one-server job.
    assert flooded().decide({"b": [Waiter("b-1", 8, "packed")]}, placed=False) == ["a3", "a4"]


def test_victims_free_one_whole_server_for_a_job_that_needs_one() -> None:
    # An 8-GPU job at `packed` needs one whole server: the two jobs on n1 (the newest server's) go.
    assert flooded().decide({"b": [Waiter("b-1", 8, "packed")]}) == ["a2", "a4"]


def test_at_any_level_as_few_servers_as_will_do() -> None:
    # `any` may span servers, but a room on one server costs as many GPUs and keeps the job whole.
    assert flooded().decide({"b": [Waiter("b-1", 8, "any")]}) == ["a2", "a4"]


def test_nobody_is_preempted_when_no_usable_room_can_be_made() -> None:
    # prod (not preemptible) holds 4 GPUs on each server: no server can be emptied for b's one-server job, so a's
    # job is left alone (today's choice would free 4 GPUs b cannot use).
    queues = "queues:\n  a: {}\n  b: {weight: 2}\n  prod: {preemptible: false}\n"
    for placed, expected in ((False, ["a2"]), (True, [])):
        b = Book(queues, two_servers())
        b.run("p1", "prod", 0.5, {"n0": 4})
        b.run("p2", "prod", 0.6, {"n1": 4})
        b.run("a1", "a", 1.0, {"n0": 4})
        b.run("a2", "a", 2.0, {"n1": 4})
        assert b.decide({"b": [Waiter("b-1", 8, "packed")]}, placed=placed) == expected


def test_a_multi_server_job_gets_its_room_inside_one_rack() -> None:
    # Four 4-GPU servers, two racks; a holds all of them. b's 8-GPU job at `packed` needs two servers of one rack:
    # the newest job's rack is emptied (a3, a4 on n1 / n3 would be one per rack).
    servers = [Room("n0", "r0", 4, 4), Room("n1", "r0", 4, 4), Room("n2", "r1", 4, 4), Room("n3", "r1", 4, 4)]
    b = Book("queues:\n  a: {}\n  b: {}\n", servers)
    b.run("a1", "a", 1.0, {"n0": 4})
    b.run("a2", "a", 2.0, {"n2": 4})
    b.run("a3", "a", 3.0, {"n1": 4})
    b.run("a4", "a", 4.0, {"n3": 4})
    assert b.decide({"b": [Waiter("b-1", 8, "packed")]}) == ["a2", "a4"]
    b = Book("queues:\n  a: {}\n  b: {}\n", servers)
    for job, start, node in (("a1", 1.0, "n0"), ("a2", 2.0, "n2"), ("a3", 3.0, "n1"), ("a4", 4.0, "n3")):
        b.run(job, "a", start, {node: 4})
    assert b.decide({"b": [Waiter("b-1", 8, "packed")]}, placed=False) == ["a3", "a4"]   # one per rack


def test_a_waiting_job_that_fits_in_idle_gpus_needs_no_victim() -> None:
    # 4 GPUs idle on n1; b's first job (4 GPUs) takes them, its second (4) gets the newest job's server share.
    b = Book("queues:\n  a: {}\n  b: {}\n", two_servers())
    b.run("a1", "a", 1.0, {"n0": 4})
    b.run("a2", "a", 2.0, {"n0": 4})
    b.run("a3", "a", 3.0, {"n1": 4})
    assert b.decide({"b": [Waiter("b-1", 4, "packed"), Waiter("b-2", 4, "packed")]}) == ["a3"]


def test_a_spread_job_gets_its_room_as_at_any() -> None:
    # The same cluster; b's 8-GPU job reports `spread:2` (a spread AM's level): its room is sized as at `any`, the
    # newest jobs first wherever they run (a3 on n1, a4 on n3: one per rack is fine for it), not inside one rack.
    servers = [Room("n0", "r0", 4, 4), Room("n1", "r0", 4, 4), Room("n2", "r1", 4, 4), Room("n3", "r1", 4, 4)]
    for level in ("any", "spread:2", "spread:any"):
        b = Book("queues:\n  a: {}\n  b: {}\n", servers)
        for job, start, node in (("a1", 1.0, "n0"), ("a2", 2.0, "n2"), ("a3", 3.0, "n1"), ("a4", 4.0, "n3")):
            b.run(job, "a", start, {node: 4})
        assert b.decide({"b": [Waiter("b-1", 8, level)]}) == ["a3", "a4"], level
