"""Reservations (rm/sched/reservations.py): the servers that free soonest by the estimates are reserved for a job
that cannot be placed, nobody but a job expected to end in time is granted their GPUs, and the reservation is ready
once its GPUs are free. Pure: a hand-made cluster, estimated ends given, an injected `now`."""

from __future__ import annotations

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import LocalityLevel
from gpurm.rm.sched.reservations import READY_HOLD_S, Reservations
from gpurm.rm.state.cluster import Cluster, Node


def cluster(racks: dict[str, int], gpus: int = 8) -> Cluster:
    c = Cluster()
    for rack, servers in racks.items():
        for k in range(servers):
            c.upsert(Node(f"{rack}-n{k}", "h", 1, rack, rack, {i: GpuRecord(i) for i in range(gpus)}))
    return c


class Ends:
    """Expected ends per server: container id -> (end, indices); filled as the test allocates."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.by_node: dict[str, dict[str, tuple[float, tuple[int, ...]]]] = {}

    def run(self, node_id: str, cid: str, indices: list[int], end: float) -> None:
        self.c.allocate(node_id, indices, cid)
        self.by_node.setdefault(node_id, {})[cid] = (end, tuple(indices))

    def finish(self, node_id: str, cid: str) -> None:
        _, indices = self.by_node[node_id].pop(cid)
        self.c.release(node_id, indices, cid)

    def __call__(self, node_id: str, now: float) -> list[tuple[float, tuple[int, ...]]]:
        return list(self.by_node.get(node_id, {}).values())


def fill_with_one_gpu_jobs(c: Cluster, ends: Ends, when: dict[str, float]) -> None:
    """Every GPU of every server busy with a one-GPU job ending at `when[server]` (GPU 0 a little later)."""
    for node_id in c.nodes:
        for i in range(8):
            ends.run(node_id, f"{node_id}-c{i}", [i], when[node_id] + (50 if i == 0 else 0))


def test_the_server_expected_to_free_soonest_is_reserved() -> None:
    c = cluster({"r1": 3})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 900.0, "r1-n1": 300.0, "r1-n2": 600.0})
    res = Reservations(c, ends, limit=2)
    r = res.reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    assert r is not None
    assert r.parts == {"r1-n1": 8}
    assert r.start == 350.0                 # its last GPU (GPU 0) is expected free then
    assert res.held_on("r1-n1") == ("big", 0)


def test_only_jobs_expected_to_end_before_the_reservation_may_take_its_gpus() -> None:
    c = cluster({"r1": 2})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    res = Reservations(c, ends)
    res.reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    ends.finish("r1-n1", "r1-n1-c3")                         # one GPU came free on the reserved server
    assert res.held_on("r1-n1") == ("big", 1)
    assert res.allows("big", "r1-n1", 1, expected_end=10_000.0)          # the holder
    assert not res.allows("small", "r1-n1", 1, expected_end=1_000.0)     # would delay it
    assert res.allows("small", "r1-n1", 1, expected_end=340.0)           # backfill: done before it starts
    assert res.allows("small", "r1-n0", 1, expected_end=1e9)             # another server: not reserved


def test_the_reservation_is_ready_when_its_gpus_are_free_and_lapses_if_not_taken() -> None:
    c = cluster({"r1": 2})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 900.0, "r1-n1": 300.0})
    res = Reservations(c, ends)
    res.reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    assert res.ready(100.0) == []
    for i in range(8):
        ends.finish("r1-n1", f"r1-n1-c{i}")
    assert res.ready(360.0) == ["big"]
    assert res.ready(360.0 + READY_HOLD_S) == ["big"]
    assert res.ready(361.0 + READY_HOLD_S) == []               # never taken: given up
    assert res.held_on("r1-n1") == ("", 0) and not res.by_job


def test_a_two_server_job_gets_two_servers_of_one_rack_and_servers_are_reserved_once() -> None:
    c = cluster({"r1": 2, "r2": 2})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 100.0, "r1-n1": 800.0, "r2-n0": 300.0, "r2-n1": 400.0})
    res = Reservations(c, ends, limit=3)
    r = res.reserve("j16", 16, LocalityLevel.PACKED, now=0.0)
    assert r is not None and r.parts == {"r2-n0": 8, "r2-n1": 8}     # rack 2 is whole by 450, rack 1 by 850
    assert r.start == 450.0
    # The next job cannot have those servers: it gets rack 1's soonest.
    r2 = res.reserve("j8", 8, LocalityLevel.PACKED, now=0.0)
    assert r2 is not None and r2.parts == {"r1-n0": 8}
    # The limit holds, and a job cannot hold two reservations.
    assert res.reserve("j16", 16, LocalityLevel.PACKED, now=0.0) is None
    assert res.release("j16") and res.reserve("other", 8, LocalityLevel.PACKED, now=0.0) is not None


def test_no_reservation_when_no_placement_is_expected_or_the_limit_is_zero() -> None:
    c = cluster({"r1": 1})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 100.0})
    assert Reservations(c, ends, limit=0).reserve("j", 8, LocalityLevel.PACKED, 0.0) is None
    assert Reservations(c, ends).reserve("j", 16, LocalityLevel.ANY, 0.0) is None    # bigger than the cluster


def test_a_start_estimate_that_passed_is_estimated_again() -> None:
    c = cluster({"r1": 1})
    ends = Ends(c)
    fill_with_one_gpu_jobs(c, ends, {"r1-n0": 100.0})
    res = Reservations(c, ends)
    r = res.reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    assert r is not None and r.start == 150.0
    # The jobs ran longer than expected: at 200 the estimate says 500 now.
    for i in range(8):
        ends.by_node["r1-n0"][f"r1-n0-c{i}"] = (500.0, (i,))
    assert res.ready(200.0) == []
    assert r.start == 500.0


def test_a_one_server_job_reserves_the_server_that_would_idle_least_not_the_one_freeing_first() -> None:
    c = cluster({"r1": 2})
    ends = Ends(c)
    # r1-n0: seven GPUs free at 100, the eighth at 1,000 (7 x 900 GPU-s idle while it drains);
    # r1-n1: all eight at 1,100 (nothing idles). Draining r1-n1 costs 8 x 1,100 against 7 x 900 + 8 x 1,000.
    for i in range(8):
        ends.run("r1-n0", f"a{i}", [i], 1000.0 if i == 0 else 100.0)
        ends.run("r1-n1", f"b{i}", [i], 1100.0)
    r = Reservations(c, ends).reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    assert r is not None and r.parts == {"r1-n1": 8} and r.start == 1100.0
    # By the soonest alone (the rule before), r1-n0.
    c2 = cluster({"r1": 2})
    ends2 = Ends(c2)
    for i in range(8):
        ends2.run("r1-n0", f"a{i}", [i], 1000.0 if i == 0 else 100.0)
        ends2.run("r1-n1", f"b{i}", [i], 1100.0)
    r2 = Reservations(c2, ends2, by_idle=False).reserve("big", 8, LocalityLevel.PACKED, now=0.0)
    assert r2 is not None and r2.parts == {"r1-n0": 8} and r2.start == 1000.0


def test_idle_cost_counts_only_the_gpus_the_job_needs_and_prefers_a_much_sooner_server() -> None:
    c = cluster({"r1": 2})
    ends = Ends(c)
    # A four-GPU job: r1-n0 has four GPUs free at 100 (three more at 5,000): idle 0 until 100, cost 4 x 100;
    # r1-n1 frees all eight at 3,000: cost 4 x 3,000. GPUs beyond the need idle for nobody's reservation.
    for i in range(8):
        ends.run("r1-n0", f"a{i}", [i], 100.0 if i < 4 else 5000.0)
        ends.run("r1-n1", f"b{i}", [i], 3000.0)
    r = Reservations(c, ends).reserve("four", 4, LocalityLevel.PACKED, now=0.0)
    assert r is not None and r.parts == {"r1-n0": 4} and r.start == 100.0
