"""Process-group helpers: every container is a session leader, so its group is the unit the agent kills.

Zombies count as gone: an orphan reparented to an init that does not reap (some container runtimes) stays a
zombie forever, yet it holds no GPU and runs no code.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Collection
from pathlib import Path

from gpurm.nodeagent.cgroups import cgroup_pids

PROC = Path("/proc")


def _stat_fields(pid_dir: Path) -> list[str] | None:
    try:
        raw = (pid_dir / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = raw[raw.rfind(b")") + 2:].decode(errors="replace").split()
    return rest  # rest[0] = state, rest[1] = ppid, rest[2] = pgrp


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    if pid <= 0:
        return False
    fields = _stat_fields(PROC / str(pid))
    if fields is None:
        if PROC.is_dir():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return bool(fields) and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`."""
    if pgid <= 0:
        return []
    try:
        os.killpg(pgid, 0)  # cheap: no process at all in the group, so no /proc scan
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    if not PROC.is_dir():  # not Linux: the kernel's answer, zombies included
        return [pgid]
    out = []
    want = str(pgid)
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and len(fields) > 2 and fields[2] == want and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the whole group; False when the group no longer exists."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member switched user (later: containers run as their user); the agent runs as root then.
        return True
    return True


async def wait_gone(members: Callable[[], Collection[int]], timeout_s: float) -> bool:
    """Wait until `members()` (a /proc scan) finds no live process; False on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    poll_s = 0.01
    while members():
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(poll_s, left))
        poll_s = min(poll_s * 1.5, 0.2)  # a /proc scan costs: poll fast at first, then back off
    return True


async def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process is left in the group; False on timeout."""
    return await wait_gone(lambda: group_members(pgid), timeout_s)


async def kill_group(pgid: int, timeout_s: float = 5.0) -> bool:
    """SIGKILL the group until nothing in it lives (a member may fork while we kill); False on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while group_members(pgid):
        signal_group(pgid, signal.SIGKILL)
        if await wait_group_gone(pgid, min(0.5, max(0.0, deadline - loop.time()))):
            return True
        if loop.time() >= deadline:
            return False
    return True


# ---------------------------------------------------------------- a container's whole process tree

MARKER_ENV = "GPURM_CONTAINER_KEY"


def start_time(pid: int) -> int:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22); 0 when unknown. A pid
    with another start time than the one recorded is a different process that reused the number."""
    fields = _stat_fields(PROC / str(pid))
    try:
        return int(fields[19]) if fields else 0
    except (IndexError, ValueError):
        return 0


def same_process(pid: int, started: int) -> bool:
    """True while `pid` is alive and is the process that started at `started` (0: not checked)."""
    if not pid_alive(pid):
        return False
    return started == 0 or start_time(pid) in (0, started)


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment holds `GPURM_CONTAINER_KEY=<marker>`: a container's descendants that
    left its process group (setsid, setpgid) keep the environment they were started with."""
    if not marker or not PROC.is_dir():
        return []
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    out = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def has_marker(pid: int, marker: str) -> bool:
    try:
        env = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in env.split(b"\0")


def container_processes(pgid: int, cgroup: Path | None, marker: str, *, trust_group: bool = True) -> set[int]:
    """Every live process of a container: its cgroup's (authoritative where there is one), its process
    group's, and those carrying its environment marker (scanned only without a cgroup).

    `trust_group=False` (the group's leader is gone and was not our child, so its id may have been reused):
    only group members that carry the marker count.
    """
    members = group_members(pgid)
    if not trust_group:
        members = [p for p in members if has_marker(p, marker)]
    found = set(members)
    if cgroup is not None and (cgroup / "cgroup.procs").exists():
        found.update(p for p in cgroup_pids(cgroup) if pid_alive(p))
    else:
        found.update(marked_processes(marker))
    found.discard(os.getpid())
    return found
