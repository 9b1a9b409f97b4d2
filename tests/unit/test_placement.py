"""The planner: table tests over fragmented clusters, mixed server sizes, rack ties and NVLink islands."""

from __future__ import annotations

import pytest

from gpurm.am.placement import ServerView, fewest_servers, plan
from gpurm.common.jobspec import LocalityLevel as L


def srv(node: str, rack: str, free: int, total: int = 8, islands: int = 1) -> ServerView:
    size = total // islands
    return ServerView(node, rack, total, tuple(range(total - free, total)),
                      tuple(tuple(range(k * size, (k + 1) * size)) for k in range(islands)))


def layout(p: object) -> list[tuple[str, int]]:
    assert p is not None
    return [(part.node_id, part.gpus) for part in p.parts]  # type: ignore[attr-defined]


CASES = [
    # name, servers, gpus, level, expected parts (None = no plan at this level now)
    ("node best fit", [srv("a", "r1", 8), srv("b", "r1", 4), srv("c", "r2", 6)], 4, L.NODE, [("b", 4)]),
    ("node impossible when fragmented", [srv("a", "r1", 3), srv("b", "r1", 3)], 4, L.NODE, None),
    ("packed two whole servers", [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8)], 16, L.PACKED,
     [("a", 8), ("b", 8)]),
    ("packed waits while fragmented", [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r1", 6)], 16, L.PACKED, None),
    ("rack takes three fragments", [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r1", 6)], 16, L.RACK,
     [("a", 6), ("b", 6), ("c", 4)]),
    ("rack never spans racks", [srv("a", "r1", 8), srv("b", "r2", 8)], 16, L.RACK, None),
    ("any spans racks", [srv("a", "r1", 8), srv("b", "r2", 8)], 16, L.ANY, [("a", 8), ("b", 8)]),
    ("packed: the tightest rack wins, the emptier one stays whole",
     [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8), srv("d", "r2", 8), srv("e", "r2", 8)], 16, L.PACKED,
     [("a", 8), ("b", 8)]),
    ("mixed 2- and 8-GPU servers: remainder best-fits a 2-GPU server, b2 stays whole",
     [srv("s1", "r1", 2, 2), srv("s2", "r1", 2, 2), srv("b1", "r1", 8), srv("b2", "r1", 8)], 10, L.PACKED,
     [("b1", 8), ("s1", 2)]),
    ("mixed: small job best-fits a 2-GPU server", [srv("s1", "r1", 2, 2), srv("b1", "r1", 8)], 2, L.NODE,
     [("s1", 2)]),
    ("best fit inside the rack: tightest last server", [srv("a", "r1", 8), srv("b", "r1", 5), srv("c", "r1", 3)],
     11, L.PACKED, [("a", 8), ("c", 3)]),
]


@pytest.mark.parametrize(("name", "servers", "gpus", "level", "expected"), CASES, ids=[c[0] for c in CASES])
def test_plan_table(name: str, servers: list[ServerView], gpus: int, level: L,
                    expected: list[tuple[str, int]] | None) -> None:
    p = plan(gpus, servers, level)
    if expected is None:
        assert p is None
    else:
        assert layout(p) == expected
        assert p is not None and p.level is level and p.gpus == gpus


def test_tie_between_racks_is_broken_by_name() -> None:
    servers = [srv("x", "r2", 8), srv("y", "r2", 8), srv("a", "r1", 8), srv("b", "r1", 8)]
    assert layout(plan(16, servers, L.PACKED)) == [("a", 8), ("b", 8)]


def test_nvlink_island_kept_whole() -> None:
    # Two islands of 4; free: 1 GPU in island 0, all 4 of island 1 -> a 4-GPU learner gets island 1.
    s = ServerView("a", "r1", 8, (3, 4, 5, 6, 7), ((0, 1, 2, 3), (4, 5, 6, 7)))
    p = plan(4, [s], L.NODE)
    assert p is not None and p.parts[0].gpu_indices == (4, 5, 6, 7)


def test_avoided_servers_are_skipped() -> None:
    servers = [srv("a", "r1", 8), srv("b", "r1", 8)]
    assert layout(plan(8, servers, L.NODE, avoid={"a"})) == [("b", 8)]


def test_fewest_servers() -> None:
    assert fewest_servers(16, [srv("a", "r", 0), srv("b", "r", 0), srv("c", "r", 0)]) == 2
    assert fewest_servers(3, [srv("a", "r", 0, 2), srv("b", "r", 0, 2)]) == 2
    assert fewest_servers(9, [srv("a", "r", 0, 8)]) == 2      # cannot fit at all: more than exist


# Fragmentation-aware packing (best fit at the server and the rack scale): small jobs fill what is already broken,
# so whole servers and whole racks stay free for the big jobs that need them.

@pytest.mark.parametrize("level", [L.NODE, L.PACKED, L.RACK])
def test_small_job_fills_a_used_server_instead_of_breaking_a_whole_one(level: L) -> None:
    # r1 has more candidate servers, both whole; r2's only server is already in use and fits the job exactly.
    servers = [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 2)]
    assert layout(plan(2, servers, level)) == [("c", 2)]


@pytest.mark.parametrize("level", [L.NODE, L.PACKED])
def test_equally_full_servers_go_to_the_fullest_rack(level: L) -> None:
    # a and c both leave 2 GPUs over; r2 (3 free in all) is fuller than r1 (11 free), so r1 keeps its whole server.
    servers = [srv("a", "r1", 3), srv("b", "r1", 8), srv("c", "r2", 3), srv("d", "r2", 0)]
    assert layout(plan(1, servers, level)) == [("c", 1)]


def test_server_fit_comes_before_rack_fit() -> None:
    # c fits exactly (nothing left over) although its rack is the emptier one: keeping a's 2 GPUs matters more.
    servers = [srv("a", "r1", 2), srv("b", "r1", 0), srv("c", "r2", 1), srv("d", "r2", 8)]
    assert layout(plan(1, servers, L.PACKED)) == [("c", 1)]


def test_multi_server_job_takes_whole_servers_in_the_tightest_rack() -> None:
    # r1: two whole servers and a half-used one (20 free); r2: three whole servers (24 free). The 16-GPU job takes
    # r1's whole servers, and a 24-GPU job can still be packed on r2 afterwards.
    servers = [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r1", 4),
               srv("d", "r2", 8), srv("e", "r2", 8), srv("f", "r2", 8)]
    first = plan(16, servers, L.PACKED)
    assert layout(first) == [("a", 8), ("b", 8)]
    assert first is not None
    taken = {p.node_id for p in first.parts}
    after = [srv(s.node_id, s.rack, 0) if s.node_id in taken else s for s in servers]
    assert layout(plan(24, after, L.PACKED)) == [("d", 8), ("e", 8), ("f", 8)]


def test_fewest_servers_then_least_left_over_then_tightest_rack() -> None:
    # Every rack can hold 12 GPUs on 2 servers. r2 would leave 4 GPUs over on d; r1 and r3 leave none, and r1 is
    # the tighter rack (12 free against r3's 13).
    servers = [srv("a", "r1", 8), srv("b", "r1", 4),
               srv("c", "r2", 8), srv("d", "r2", 8),
               srv("e", "r3", 6), srv("f", "r3", 6), srv("g", "r3", 1)]
    assert layout(plan(12, servers, L.PACKED)) == [("a", 8), ("b", 4)]
    assert layout(plan(12, servers, L.RACK)) == [("a", 8), ("b", 4)]


def test_a_stream_of_small_jobs_leaves_a_whole_rack_for_a_big_one() -> None:
    # Two racks of two 8-GPU servers, one GPU used on a. Twelve 1-GPU jobs planned one after the other (each
    # seeing the ones before placed) fill a, then b (a whole server, but in the fuller rack): rack r2 stays whole
    # and a 16-GPU job is packed there. (Preferring the rack with more candidate servers broke c instead.)
    free = {"a": 7, "b": 8, "c": 8, "d": 8}
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
    for salt in range(12):
        p = plan(1, [srv(n, racks[n], f) for n, f in free.items()], L.PACKED, salt=salt)
        assert p is not None
        free[p.parts[0].node_id] -= 1
    assert free == {"a": 0, "b": 3, "c": 8, "d": 8}
    assert layout(plan(16, [srv(n, racks[n], f) for n, f in free.items()], L.PACKED)) == [("c", 8), ("d", 8)]
