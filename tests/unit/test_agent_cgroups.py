"""cgroup v2 setup and limits against a temp dir standing in for the cgroup root; run-as decisions; log files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpurm.nodeagent.cgroups import CgroupManager, CgroupMode, Limits, find_cgroup2_mount, share_limits
from gpurm.nodeagent.config import ConfigError, load_agent_config, parse_size
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.identity import RunAsMode
from gpurm.nodeagent.logfiles import LOG_FILE, LogWriter, logical_size, read_range

MIB = 1024 * 1024


def fake_root(tmp_path: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.procs").write_text("")
    (root / "cgroup.controllers").write_text(controllers + "\n")
    return root


def test_share_limits_in_proportion_to_gpus() -> None:
    lim = share_limits(2, 8, 64, 512_000)
    assert lim == Limits(cpu_quota_us=16 * 100_000, memory_bytes=128_000 * MIB)
    assert (lim.cpu_max(), lim.memory_max()) == ("1600000 100000", str(128_000 * MIB))
    # a grant naming its share wins; a GPU-less container (an AM) is not limited
    assert share_limits(1, 8, 64, 512_000, cpus=3, memory_mib=1000) == Limits(300_000, 1000 * MIB)
    assert share_limits(0, 8, 64, 512_000).cpu_max() == "max"
    assert share_limits(0, 8, 64, 512_000).memory_max() == "max"
    assert share_limits(1, 3, 4, 3000).cpu_quota_us == 133_333


def test_setup_writes_limits_under_a_writable_root(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    cg = CgroupManager.setup(root, "node-1-abcd")
    assert cg.mode is CgroupMode.LIMIT and cg.warning == "" and cg.base == root / "gpurm" / "node-1-abcd"
    # controllers handed down at every level
    for level in (root, root / "gpurm", cg.base):
        assert (level / "cgroup.subtree_control").read_text() == "+cpu +memory"
    path = cg.create("job-1-c1", share_limits(2, 8, 64, 8192))
    assert path == cg.base / "job-1-c1"
    assert (path / "cpu.max").read_text() == "1600000 100000"
    assert (path / "memory.max").read_text() == str(2048 * MIB)
    assert cg.path("job-1-c1") == path


def test_setup_without_cpu_and_memory_controllers_tracks_only(tmp_path: Path) -> None:
    root = fake_root(tmp_path, controllers="pids")
    cg = CgroupManager.setup(root, "n")
    assert cg.mode is CgroupMode.TRACK and cg.enabled
    assert "no cpu / memory controller" in cg.warning
    path = cg.create("c", share_limits(1, 1, 4, 100))
    assert path is not None and path.is_dir() and not (path / "cpu.max").exists()


@pytest.mark.parametrize("make", ["missing", "not-cgroup2", "unwritable"])
def test_unusable_root_is_skipped_with_a_warning(tmp_path: Path, make: str) -> None:
    if make == "missing":
        root = tmp_path / "nope"
    elif make == "not-cgroup2":
        root = tmp_path / "plain"
        root.mkdir()
    else:
        root = fake_root(tmp_path)
        (root / "gpurm").write_text("a file where the gpurm level should go: mkdir fails")
    cg = CgroupManager.setup(root, "n")
    assert cg.mode is CgroupMode.OFF and not cg.enabled and cg.base is None
    assert "without CPU / memory limits" in cg.warning
    assert cg.create("c", share_limits(1, 1, 1, 1)) is None
    assert cg.remove(None)


def test_supervisor_logs_one_warning_when_cgroups_are_unusable(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    sup = ContainerSupervisor("n", tmp_path / "state")
    sup.cgroup_root = str(tmp_path / "no-cgroup-here")
    with caplog.at_level(logging.INFO, logger="gpurm.nodeagent.containers"):
        assert sup.open() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a cgroup v2 hierarchy" in warnings[0].getMessage()
    assert sup.cgroups.mode is CgroupMode.OFF


def test_find_cgroup2_mount(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755\n"
        "35 30 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "36 30 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    assert find_cgroup2_mount(info) == Path("/sys/fs/cgroup/unified")
    info.write_text("35 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert find_cgroup2_mount(info) == Path("/sys/fs/cgroup")
    info.write_text("36 30 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    assert find_cgroup2_mount(info) is None
    assert find_cgroup2_mount(tmp_path / "missing") is None


# ---------------------------------------------------------------- config

def test_container_config_keys() -> None:
    cfg = load_agent_config(None, {"gpus": {"fake": 1}, "memory_mib": 1000, "containers": {
        "log_max_size": "1MiB", "log_keep": 5, "run_as": "agent", "cgroup_root": "off"}})
    cc = cfg.containers
    assert (cc.log_max_size, cc.log_keep, cc.run_as, cc.cgroup_root) == (MIB, 5, RunAsMode.AGENT, "off")
    default = load_agent_config(None, {"gpus": {"fake": 1}, "memory_mib": 1000}).containers
    assert (default.log_max_size, default.log_keep, default.run_as, default.cgroup_root) == (
        100 * MIB, 3, RunAsMode.USER, "auto")
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, {"gpus": {"fake": 1}, "memory_mib": 1000, "containers": {
            "log_max_size": "lots", "log_keep": -1, "run_as": "root", "cgroup_root": "relative/dir"}})
    text = "\n".join(info.value.problems)
    for key in ("log_max_size", "log_keep", "run_as", "cgroup_root"):
        assert f"containers.{key}" in text, text
    assert [parse_size(v) for v in (0, "500B", "64KiB", "1.5GB", "2 MiB")] == [0, 500, 65536, 1_500_000_000,
                                                                                2 * MIB]


# ---------------------------------------------------------------- rotated logs, logical offsets

def test_log_rotation_keeps_offsets_logical(tmp_path: Path) -> None:
    w = LogWriter(tmp_path, max_size=100, keep=2)
    payload = b"".join(f"{i:09d}\n".encode() for i in range(50))   # 500 bytes in 10-byte lines
    for i in range(0, 500, 30):
        w.write(payload[i:i + 30])
    w.close()
    names = sorted(p.name for p in tmp_path.glob(f"{LOG_FILE}*") if not p.name.endswith("index"))
    assert names == [LOG_FILE, f"{LOG_FILE}.1", f"{LOG_FILE}.2"]
    assert all((tmp_path / n).stat().st_size <= 120 for n in names)
    assert logical_size(tmp_path) == 500
    tail = read_range(tmp_path, -25, 100)
    assert tail.data == payload[-25:] and tail.start == 475 and tail.size == 500
    # from 0: what was rotated away is skipped, the rest is contiguous up to the end
    got = read_range(tmp_path, 0, 1000)
    assert got.start > 0 and got.data == payload[got.start:]
    mid = read_range(tmp_path, got.start + 5, 7)
    assert mid.data == payload[got.start + 5:got.start + 12] and mid.start == got.start + 5
    # a writer reopening the same file (a restarted launcher) continues the logical count
    w2 = LogWriter(tmp_path, max_size=100, keep=2)
    w2.write(b"more\n")
    w2.close()
    assert logical_size(tmp_path) == 505 and read_range(tmp_path, 500, 10).data == b"more\n"


def test_read_range_without_an_index_reads_a_plain_file(tmp_path: Path) -> None:
    (tmp_path / LOG_FILE).write_bytes(b"gpurm: cannot start\n")
    assert read_range(tmp_path, 0, 100).data == b"gpurm: cannot start\n"
    assert read_range(tmp_path / "missing", 0, 100).size == 0


def test_stale_empty_cgroups_are_swept(tmp_path: Path) -> None:
    import os

    from gpurm.nodeagent.cgroups import sweep_stale

    top = tmp_path / "gpurm"
    old_empty, old_busy, fresh = top / "a-1" / "c-old", top / "a-1" / "c-busy", top / "b-2" / "c-new"
    for d in (old_empty, old_busy, fresh):
        d.mkdir(parents=True)
    # Plain dirs stand in for cgroups (rmdir of a real empty cgroup succeeds despite its interface files);
    # something inside c-busy makes its rmdir fail, as a busy cgroup's would.
    (old_busy / "child").mkdir()
    for d in (old_empty, old_busy, top / "a-1"):
        os.utime(d, (0, 0))
    assert sweep_stale(top, min_age_s=60) == 1
    assert not old_empty.exists() and old_busy.exists() and fresh.exists() and (top / "a-1").exists()
