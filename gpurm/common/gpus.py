"""The GPU model every process shares: a GPU's record as the agent discovers it and the RM keeps it, NVLink
islands, and which GPUs of a server a container gets (the RM's grants and the AM's plans use the same rule)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

LINK_NVLINK = 1  # pb.LINK_NVLINK; kept as a plain int so this module needs no protobuf
WHOLE_MILLI = 1000    # one GPU, in the thousandths that shares are counted in


@dataclass
class GpuRecord:
    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int = -1
    cpu_affinity: str = ""
    mig_enabled: bool = False
    healthy: bool = True
    health_reason: str = ""
    links: list[tuple[int, int, int]] = field(default_factory=list)  # (peer, link level, nvlinks)


def nvlink_islands(gpus: Iterable[GpuRecord]) -> list[list[int]]:
    """Connected groups of GPUs over NVLink (union-find); a GPU without NVLink is an island of one."""
    gpu_list = list(gpus)
    parent = {g.index: g.index for g in gpu_list}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in gpu_list:
        for peer, level, _ in g.links:
            if level == LINK_NVLINK and peer in parent:
                parent[find(g.index)] = find(peer)
    groups: dict[int, list[int]] = {}
    for g in gpu_list:
        groups.setdefault(find(g.index), []).append(g.index)
    return sorted((sorted(v) for v in groups.values()), key=lambda grp: grp[0])


def choose_in_islands(free: Iterable[int], islands: list[list[int]], count: int,
                      preferred: Iterable[int] = ()) -> list[int] | None:
    """Which of the `free` GPU indices a container of `count` GPUs gets, or None if too few are free.

    The preferred indices win when they are all free; otherwise keep the container on one NVLink island,
    choosing the island that fits most tightly (best fit leaves bigger islands whole for bigger asks).
    """
    free_list = sorted(free)
    if count <= 0 or len(free_list) < count:
        return None if count > 0 else []
    free_set = set(free_list)
    wanted = sorted(set(preferred))
    if len(wanted) == count and all(i in free_set for i in wanted):
        return wanted
    if len(islands) <= 1 or all(len(isl) == 1 for isl in islands):
        # One NVLink domain, none known, or no NVLink at all (every GPU an island of its own: the rules below
        # would pick the lowest free indices): any free GPUs are as good.
        return free_list[:count]
    groups = islands
    covered = {i for isl in groups for i in isl}
    groups = [*groups, *[[i] for i in free_list if i not in covered]]
    free_in = [[i for i in isl if i in free_set] for isl in groups]
    fitting = [f for f in free_in if len(f) >= count]
    if fitting:
        best = min(fitting, key=lambda f: (len(f), f[0]))
        return best[:count]
    # Spans islands: take the fullest islands first so the fewest are split.
    chosen: list[int] = []
    for f in sorted((f for f in free_in if f), key=lambda f: (-len(f), f[0])):
        chosen.extend(f[: count - len(chosen)])
        if len(chosen) == count:
            break
    return sorted(chosen)
