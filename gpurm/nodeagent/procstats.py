"""How much CPU and memory a container uses: parsing of /proc and cgroup v2 files, and summing over its processes.

Where the container has a cgroup (v2), its own counters are authoritative: `cpu.stat` (usage_usec: every
process that ever ran in it, exited ones included) and `memory.current` (resident memory plus page cache it is
charged for). Without one the agent sums over the container's live processes (`ContainerSupervisor.processes`):
utime + stime (+ cutime + cstime: children already reaped, e.g. by the launcher) from /proc/<pid>/stat, and
resident pages from /proc/<pid>/statm. A process that exits between two samples takes its unreaped time with it,
so CPU is a rate over the interval, never negative (`CpuMeter`).

Everything here reads files below a root it is given, so unit tests run it on a fake /proc in a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MAX_READ = 64 * 1024   # no /proc or cgroup file we read is larger


@dataclass(frozen=True)
class Reading:
    cpu_s: float        # CPU seconds consumed so far (cumulative)
    rss_bytes: int      # resident memory now
    source: str         # "cgroup" | "proc"


def stat_cpu_ticks(text: str) -> int:
    """utime + stime + cutime + cstime from a /proc/<pid>/stat line (the command may hold spaces and ')')."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); utime is field 14 -> rest[11]; stime, cutime, cstime follow.
    return sum(int(v) for v in rest[11:15])


def statm_rss_pages(text: str) -> int:
    """Resident pages: the second field of /proc/<pid>/statm."""
    return int(text.split()[1])


def cpu_stat_usec(text: str) -> int:
    """usage_usec from a cgroup v2 cpu.stat."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise ValueError("cpu.stat has no usage_usec line")


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_READ).decode(errors="replace")


def read_processes(pids: Iterable[int], proc: Path = PROC, *, ticks: int = CLOCK_TICKS,
                   page_size: int = PAGE_SIZE) -> Reading:
    """Summed over live processes; one that vanished (or cannot be parsed) counts as nothing."""
    total_ticks = 0
    pages = 0
    for pid in set(pids):
        with contextlib.suppress(OSError, ValueError, IndexError):
            t = stat_cpu_ticks(_read(proc / str(pid) / "stat"))
            p = statm_rss_pages(_read(proc / str(pid) / "statm"))
            total_ticks += t
            pages += p
    return Reading(cpu_s=total_ticks / ticks, rss_bytes=pages * page_size, source="proc")


def read_cgroup(path: Path) -> Reading:
    """The cgroup's own counters; raises OSError / ValueError when it has none (no cpu or memory controller)."""
    usec = cpu_stat_usec(_read(path / "cpu.stat"))
    current = int(_read(path / "memory.current").strip())
    return Reading(cpu_s=usec / 1e6, rss_bytes=current, source="cgroup")


def read_container(pids: Iterable[int], cgroup: Path | None, proc: Path = PROC) -> Reading:
    """The cgroup's counters where it has them, else the sum over `pids`."""
    if cgroup is not None:
        with contextlib.suppress(OSError, ValueError):
            return read_cgroup(cgroup)
    return read_processes(pids, proc)


class CpuMeter:
    """Cores in use over the last interval, from cumulative CPU seconds. The first reading gives None (no
    interval yet); a counter that went back (a process that exited took its time with it) gives 0 for that
    interval and starts over from the new value."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None   # (wall time, cpu seconds)

    def update(self, now: float, cpu_s: float) -> float | None:
        last, self._last = self._last, (now, cpu_s)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (cpu_s - last[1]) / (now - last[0]))
