"""Container CPU / memory readings (nodeagent/procstats.py) on a fake /proc and a fake cgroup folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.nodeagent.procstats import (
    CpuMeter,
    cpu_stat_usec,
    read_cgroup,
    read_container,
    read_processes,
    stat_cpu_ticks,
    statm_rss_pages,
)


def stat_line(pid: int, comm: str, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    # fields 3..13, then utime (14), stime, cutime, cstime, then the rest
    return (f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} {cutime} {cstime} "
            "20 0 1 0 12345 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n")


def fake_proc(root: Path, procs: dict[int, tuple[str, int]]) -> Path:
    for pid, (stat, pages) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(stat)
        (d / "statm").write_text(f"{pages * 3} {pages} 10 1 0 20 0\n")
    return root


def test_stat_cpu_ticks_sums_own_and_reaped_children_and_survives_odd_names() -> None:
    assert stat_cpu_ticks(stat_line(7, "python", 100, 50, 30, 20)) == 200
    # a command name with spaces and a ')' must not shift the fields
    assert stat_cpu_ticks(stat_line(8, "my (weird) prog", 1, 2, 3, 4)) == 10


def test_statm_and_cpu_stat_parsing() -> None:
    assert statm_rss_pages("300 100 10 1 0 20 0\n") == 100
    assert cpu_stat_usec("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n") == 2500000
    with pytest.raises(ValueError, match="usage_usec"):
        cpu_stat_usec("user_usec 1\n")


def test_read_processes_sums_live_processes_and_skips_vanished_ones(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {10: (stat_line(10, "a", 100, 100), 256), 11: (stat_line(11, "b", 50, 0, 50), 512)})
    r = read_processes([10, 11, 12], proc, ticks=100, page_size=4096)   # 12 has gone
    assert r.cpu_s == pytest.approx(3.0)
    assert r.rss_bytes == (256 + 512) * 4096
    assert r.source == "proc"
    (proc / "11" / "stat").write_text("garbage")
    assert read_processes([10, 11], proc, ticks=100, page_size=4096).rss_bytes == 256 * 4096


def test_a_cgroup_is_authoritative_and_a_cgroup_without_counters_falls_back(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.stat").write_text("usage_usec 4000000\nuser_usec 3000000\n")
    (cg / "memory.current").write_text("1048576\n")
    r = read_cgroup(cg)
    assert (r.cpu_s, r.rss_bytes, r.source) == (4.0, 1048576, "cgroup")
    proc = fake_proc(tmp_path / "proc", {5: (stat_line(5, "x", 10, 0), 1)})
    assert read_container([5], cg, proc).source == "cgroup"
    (cg / "memory.current").unlink()   # no memory controller: the processes are summed instead
    assert read_container([5], cg, proc).source == "proc"
    assert read_container([5], None, proc).source == "proc"


def test_cpu_meter_gives_cores_over_the_interval_never_negative() -> None:
    m = CpuMeter()
    assert m.update(100.0, 50.0) is None          # first reading: no interval yet
    assert m.update(102.0, 53.0) == pytest.approx(1.5)
    assert m.update(104.0, 10.0) == 0.0           # a process exited with its time: 0, and start over
    assert m.update(106.0, 14.0) == pytest.approx(2.0)
    assert m.update(106.0, 20.0) is None          # no time passed
