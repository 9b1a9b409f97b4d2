"""The simulated cluster: RxNxG grids, Philly machine lists, rack grouping, bad specs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpurm.sim.clusterspec import RACK_SIZE, SimServer, fewest_servers_for, parse_cluster, total_gpus
from tests.conftest import philly_data

DATA = Path(__file__).resolve().parents[1] / "data" / "sim"
HEADER = "machineId, number of GPUs, single GPU mem\n"


def test_grid() -> None:
    servers = parse_cluster("8x8x8")
    assert len(servers) == 64
    assert total_gpus(servers) == 512
    assert len({s.rack for s in servers}) == 8
    assert servers[0] == SimServer("r00n00", "rack-00", 8)
    assert servers[9] == SimServer("r01n01", "rack-01", 8)
    assert servers[-1] == SimServer("r07n07", "rack-07", 8)
    assert len({s.node_id for s in servers}) == 64


def test_small_grid() -> None:
    assert parse_cluster("1x2x4") == [SimServer("r00n00", "rack-00", 4), SimServer("r00n01", "rack-00", 4)]


def test_machine_list_groups_racks_per_gpu_count() -> None:
    assert parse_cluster(str(DATA / "machines_small")) == [
        SimServer("m0", "rack-2g-0", 2),
        SimServer("m1", "rack-8g-0", 8),
        SimServer("m2", "rack-2g-0", 2),
    ]


def test_machine_list_racks_of_sixteen(tmp_path: Path) -> None:
    rows = "".join(f"n{i},8, 24GB\n" for i in range(40))
    (tmp_path / "list").write_text(HEADER + rows)
    servers = parse_cluster(str(tmp_path / "list"))
    assert Counter(s.rack for s in servers) == {"rack-8g-0": RACK_SIZE, "rack-8g-1": RACK_SIZE, "rack-8g-2": 8}
    assert [s.rack for s in servers[15:17]] == ["rack-8g-0", "rack-8g-1"]  # file order


def test_real_machine_list() -> None:
    servers = parse_cluster(str(philly_data("cluster_machine_list")))
    assert len(servers) == 552
    assert total_gpus(servers) == 2490
    assert Counter(s.gpus for s in servers) == {2: 321, 8: 231}
    racks: dict[str, set[int]] = {}
    for s in servers:
        racks.setdefault(s.rack, set()).add(s.gpus)
    assert all(len(sizes) == 1 for sizes in racks.values())  # no rack mixes server sizes
    assert len(racks) == 21 + 15  # ceil(321 / 16) + ceil(231 / 16)


def test_fewest_servers() -> None:
    fewest = fewest_servers_for(parse_cluster(str(DATA / "machines_small")))  # 2, 8, 2 GPUs
    assert [fewest(g) for g in (1, 8, 9, 10, 11, 12, 13)] == [1, 1, 2, 2, 3, 3, 0]
    assert fewest_servers_for(parse_cluster("8x8x8"))(32) == 4


@pytest.mark.parametrize("spec", ["8x8", "0x8x8", "8x8x0", "axbxc", "", "no/such/file"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="--cluster"):
        parse_cluster(spec)


@pytest.mark.parametrize(("text", "where"), [
    ("machine, gpus\nm0,2, 12GB\n", ":1: header"),
    ("", ":1: header"),
    (HEADER + "m0,2, 12GB\nm1,two, 12GB\n", ":3: number of GPUs"),
    (HEADER + "m0,0, 12GB\n", ":2: number of GPUs"),
    (HEADER + "m0,2, 12GB\nm0,8, 24GB\n", ":3: machineId: duplicate 'm0' (first on line 2)"),
    (HEADER + ",2, 12GB\n", ":2: machineId"),
    (HEADER + "m0\n", ":2: expected"),
    (HEADER, "names no servers"),
])
def test_bad_machine_lists(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "list"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        parse_cluster(str(path))
    assert str(info.value).startswith(str(path))
    assert where in str(info.value)
