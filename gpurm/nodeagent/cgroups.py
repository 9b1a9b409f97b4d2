"""cgroup v2 for containers: CPU and memory limits in proportion to GPUs, and a sure list of every process.

Layout: `<cgroup v2 mount>/gpurm/<agent>/<container_id>`, where `<agent>` is the node id plus a short hash of
the agent's state dir (two agents on one machine, as in tests and dev clusters, never share a directory; one
agent keeps the same directory across restarts, so it finds its containers again).

Placement: the container's launcher (`gpurm.nodeagent.shim`, still running as the agent's user) writes its own
pid into the container's `cgroup.procs` *before* it forks the command, so the command and everything it forks
start inside the cgroup (Python has no `clone_into_cgroup`; `preexec_fn` runs after the user switch, when the
process may no longer move itself). A process cannot leave the cgroup without write access to a common
ancestor, so `cgroup.procs` names every descendant, even one that escaped into its own session.

The containers' cgroups live outside the agent's own (systemd unit) cgroup on purpose: stopping or restarting
the agent's unit never touches them (see configs/gpurm-agent.service).

Where cgroup v2 is not mounted or not writable, the agent runs containers without limits, logs one warning at
startup, and finds descendants through process groups and the GPURM_CONTAINER_KEY environment marker.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
CPU_PERIOD_US = 100_000
MIB = 1024 * 1024
WANTED_CONTROLLERS = ("cpu", "memory")
STALE_AGE_S = 600.0


class CgroupMode(Enum):
    OFF = "off"        # no cgroups: no limits; processes found by group and environment
    TRACK = "track"    # cgroups, but no cpu / memory controller: every process is listed, nothing is limited
    LIMIT = "limit"    # cgroups with cpu.max and memory.max


@dataclass(frozen=True)
class Limits:
    """cpu.max and memory.max for one container; None = no limit."""

    cpu_quota_us: int | None
    memory_bytes: int | None
    cpu_period_us: int = CPU_PERIOD_US

    def cpu_max(self) -> str:
        return "max" if self.cpu_quota_us is None else f"{self.cpu_quota_us} {self.cpu_period_us}"

    def memory_max(self) -> str:
        return "max" if self.memory_bytes is None else str(self.memory_bytes)


def share_limits(gpus: float, node_gpus: int, node_cpus: int, node_memory_mib: int, *, cpus: int = 0,
                 memory_mib: int = 0) -> Limits:
    """The container's share of the node: `cpus` / `memory_mib` when the grant names them, else the node's
    CPUs and memory * gpus / node_gpus. A GPU-less container (an AM) gets no limit."""
    if cpus > 0:
        cpu_share: float | None = float(cpus)
    elif gpus > 0 and node_gpus > 0 and node_cpus > 0:
        cpu_share = node_cpus * gpus / node_gpus
    else:
        cpu_share = None
    if memory_mib > 0:
        mem: int | None = memory_mib * MIB
    elif gpus > 0 and node_gpus > 0 and node_memory_mib > 0:
        mem = int(node_memory_mib * MIB * gpus // node_gpus)
    else:
        mem = None
    quota = None if cpu_share is None else max(1000, round(cpu_share * CPU_PERIOD_US))
    return Limits(cpu_quota_us=quota, memory_bytes=mem)


def find_cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where cgroup v2 is mounted (the unified /sys/fs/cgroup, or the `unified` mount of a hybrid setup)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    found: list[Path] = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep or not right.split() or right.split()[0] != "cgroup2":
            continue
        fields = left.split()
        if len(fields) > 4:
            found.append(Path(fields[4].replace("\\040", " ")))
    if not found:
        return None
    preferred = Path("/sys/fs/cgroup")
    return preferred if preferred in found else found[0]


def agent_cgroup_name(node_id: str, state_dir: Path) -> str:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"{node_id}-{digest}"


@dataclass
class CgroupManager:
    """Creates, lists, signals and removes the containers' cgroups under `base`."""

    mode: CgroupMode
    base: Path | None = None
    warning: str = ""             # why cgroups are off or limits are not enforced (logged once, at setup)
    controllers: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def disabled(cls, why: str = "") -> CgroupManager:
        return cls(CgroupMode.OFF, None, why)

    @classmethod
    def setup(cls, root: Path | None, name: str) -> CgroupManager:
        """Prepare `<root>/gpurm/<name>` (root None = where cgroup v2 is mounted). Never raises: a root that
        is missing, not cgroup v2 or not writable gives an OFF manager whose `warning` says why."""
        fallback = ("containers run without CPU / memory limits; their processes are found by process "
                    "group and environment")
        if root is None:
            root = find_cgroup2_mount()
            if root is None:
                return cls.disabled(f"cgroup v2 is not mounted: {fallback}")
        if not (root / "cgroup.procs").is_file():
            return cls.disabled(f"{root} is not a cgroup v2 hierarchy: {fallback}")
        base = root / "gpurm" / name
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return cls.disabled(f"cgroup v2 at {root} is not writable ({exc.strerror or exc}): {fallback}")
        if not os.access(base, os.W_OK):
            return cls.disabled(f"cgroup v2 at {root} is not writable: {fallback}")
        sweep_stale(root / "gpurm")
        available = set(_read_words(root / "cgroup.controllers"))
        enabled = frozenset(c for c in WANTED_CONTROLLERS if c in available)
        # Each level hands the controllers down to its children; the gpurm levels hold no process, so the
        # "no internal processes" rule is kept.
        for level in (root, root / "gpurm", base):
            if enabled:
                _enable(level / "cgroup.subtree_control", sorted(enabled))
        granted = frozenset(c for c in enabled
                            if c in {w.lstrip("+") for w in _read_words(base / "cgroup.subtree_control")})
        missing = [c for c in WANTED_CONTROLLERS if c not in granted]
        if missing:
            return cls(CgroupMode.TRACK, base,
                       f"cgroup v2 at {root} has no {' / '.join(missing)} controller for gpurm: those limits "
                       f"are not enforced (processes are still tracked through {base})", granted)
        return cls(CgroupMode.LIMIT, base, "", granted)

    @property
    def enabled(self) -> bool:
        return self.mode is not CgroupMode.OFF and self.base is not None

    def path(self, container_id: str) -> Path | None:
        return self.base / container_id if self.enabled and self.base is not None else None

    def create(self, container_id: str, limits: Limits) -> Path | None:
        """The container's cgroup with its limits written; None when cgroups are off or it cannot be made."""
        path = self.path(container_id)
        if path is None:
            return None
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            log.warning("container %s: cannot create cgroup %s: %s", container_id, path, exc.strerror or exc)
            return None
        if "cpu" in self.controllers:
            _write(path / "cpu.max", limits.cpu_max(), container_id)
        if "memory" in self.controllers:
            _write(path / "memory.max", limits.memory_max(), container_id)
        return path

    def remove(self, path: Path | None) -> bool:
        """rmdir the container's cgroup (it must be empty); True when it is gone."""
        if path is None:
            return True
        try:
            path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("cannot remove cgroup %s: %s", path, exc.strerror or exc)
            return False
        return True

    def remove_base_if_empty(self) -> None:
        if self.base is not None:
            with contextlib.suppress(OSError):
                self.base.rmdir()


def sweep_stale(top: Path, min_age_s: float = STALE_AGE_S) -> int:
    """rmdir empty container cgroups (and then empty agent levels) under `<root>/gpurm` older than
    `min_age_s`: left by agents that were killed and never came back (dev clusters, tests). A live container
    always has its launcher inside, and a new one is joined within seconds of its mkdir, so neither is touched.
    Returns how many were removed."""
    removed = 0
    now = time.time()
    try:
        agents = [d for d in top.iterdir() if d.is_dir()]
    except OSError:
        return 0
    for agent in agents:
        with contextlib.suppress(OSError):
            for cg in [d for d in agent.iterdir() if d.is_dir()]:
                with contextlib.suppress(OSError):
                    if now - cg.stat().st_mtime >= min_age_s and not cgroup_pids(cg):
                        cg.rmdir()
                        removed += 1
            if now - agent.stat().st_mtime >= min_age_s:
                agent.rmdir()  # fails while anything is left in it
    return removed


def cgroup_pids(path: Path) -> list[int]:
    """Processes in the cgroup (exited ones leave it at once); [] when it does not exist."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def join_cgroup(path: Path, pid: int = 0) -> None:
    """Move `pid` (0 = the caller) into the cgroup. Raises OSError."""
    (path / "cgroup.procs").write_text(str(pid or os.getpid()))


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> int:
    """Send `sig` to each pid; the number it reached."""
    sent = 0
    for pid in pids:
        if pid <= 0 or pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
        except PermissionError:
            log.debug("no permission to signal %d", pid)
    return sent


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _enable(subtree_control: Path, controllers: list[str]) -> None:
    try:
        subtree_control.write_text(" ".join(f"+{c}" for c in controllers))
        return
    except OSError:
        pass
    for c in controllers:  # all at once failed: each on its own, so one missing controller costs only itself
        with contextlib.suppress(OSError):
            subtree_control.write_text(f"+{c}")


def _write(path: Path, value: str, container_id: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("container %s: cannot write %s=%s: %s", container_id, path.name, value,
                        exc.strerror or exc)


def set_memory_high(path: Path, mib: float | None) -> None:
    """Write the container's memory.high (None: "max", no throttling); raises OSError when it cannot."""
    (path / "memory.high").write_text("max" if mib is None else str(int(mib * MIB)))
