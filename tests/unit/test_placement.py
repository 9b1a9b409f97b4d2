"""The planner: table tests over fragmented clusters, mixed server sizes, rack ties and NVLink islands."""

from __future__ import annotations

import pytest

from gpurm.am.placement import ServerView, fewest_servers, plan
from gpurm.rm.jobspec import LocalityLevel as L


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
    ("packed: rack with most candidates wins", [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8),
                                                 srv("d", "r2", 8), srv("e", "r2", 8)], 16, L.PACKED,
     [("c", 8), ("d", 8)]),
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
