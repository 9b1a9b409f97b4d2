"""Which locality level an attempt is at and goes to next, and for a `placement: spread` job, which cap of GPUs per
server. Reads the `Master`'s spec, view, level and cap; changes nothing.

An attempt starts at its job's start level (`any` for `locality: any`, a spread job and a GPU share); a level the
cluster's shape can never give the job is skipped at once (`shape_floor`, and `why_skipped` says so in its status);
after a back-off it goes one level looser, except that `strict` stays at its best level and a multi-GPU `prefer`
job that fits on one server stays at `packed` (`keeps_one_server`). A spread job's cap starts at 1 GPU per server
(or none for `any`), floored to what the cluster's shape allows, and `prefer` raises it by one per back-off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurm.am.placement import spread_shape_cap
from gpurm.common.jobspec import LocalityLevel, LocalityMode

if TYPE_CHECKING:
    from gpurm.am.master import Master


def level_label(m: Master) -> str:
    """The attempt's level as reported: a locality level, or for a spread job `spread:N` (at most N GPUs per
    server) or `spread:any` (no cap)."""
    if m.spread:
        return f"spread:{m.cap}" if m.cap else "spread:any"
    return m.level.label


def first_cap(m: Master) -> int:
    """A spread job's first cap: one GPU per server, or no cap for `locality: any` (spread over whatever is
    free now, without waiting); cap_floor raises it to what the cluster's shape allows."""
    return 0 if m.spec.locality.mode is LocalityMode.ANY else 1


def cap_floor(m: Master, cap: int) -> int:
    """`cap`, or the least cap the cluster's shape allows when `cap` is below it (8 GPUs over 4 servers: 2 per
    server); 0 (no cap) once a cap no longer limits anything (it reaches the job's GPUs or the biggest server's).
    No change without a view."""
    if cap == 0:
        return 0
    gpus = m.spec.gpus
    if len(m.view):
        sizes = [s.total for s in m.view.servers]
        least = spread_shape_cap(gpus, sizes)
        if least == 0:
            return 0
        cap = max(cap, least)
        if cap >= max(sizes):
            return 0
    return 0 if cap >= gpus else cap


def next_cap(m: Master) -> int:
    """A spread job's cap after a back-off: `strict` keeps its first (floored) cap, `prefer` allows one GPU more
    per server each time, up to no cap."""
    if m.spec.locality.mode is LocalityMode.STRICT:
        return cap_floor(m, first_cap(m))
    return 0 if m.cap == 0 else cap_floor(m, m.cap + 1)


def first_level(m: Master) -> LocalityLevel:
    """Where an attempt starts: `any` for a job that does not care about locality (or a spread job, which has no
    locality level), else its start level."""
    if m.spec.locality.mode is LocalityMode.ANY or m.spread or m.spec.shared:
        return LocalityLevel.ANY
    return m.spec.locality.start_level


def shape_floor(m: Master, level: LocalityLevel) -> LocalityLevel:
    """`level`, or the first level after it that the cluster's shape can satisfy for this job (a 24-GPU job
    on 8-GPU servers is never at `node`; a 48-GPU job on racks of 32 GPUs never in one rack): waiting at
    the others would only waste their timeouts. Decided from the view's servers (sizes, racks), not from
    what is free; `any` when the cluster is too small for the job altogether, and no skip without a view."""
    if not len(m.view) or m.view.satisfiable(m.spec.gpus, level):
        return level
    for candidate in (LocalityLevel.PACKED, LocalityLevel.RACK):
        if candidate > level and m.view.satisfiable(m.spec.gpus, candidate):
            return candidate
    return LocalityLevel.ANY


def why_skipped(m: Master, wanted: LocalityLevel, level: LocalityLevel) -> str:
    """Why the levels from `wanted` up to `level` were skipped: the job's status says it, so a start level
    the cluster cannot give (`--start-level node` for 16 GPUs on 8-GPU servers) is not silently ignored."""
    gpus = m.spec.gpus
    why = {LocalityLevel.NODE: f"no server has {gpus} GPUs",
           LocalityLevel.PACKED: f"no rack holds {gpus} GPUs on {m.view.fewest_servers(gpus)} servers",
           LocalityLevel.RACK: f"no rack has {gpus} GPUs"}
    parts = [f"{lv.label} ({why[lv]})" for lv in (LocalityLevel.NODE, LocalityLevel.PACKED, LocalityLevel.RACK)
             if wanted <= lv < level]
    return f"skipped {', '.join(parts)}: the cluster's shape can never give them" if parts else ""


def next_level(m: Master) -> LocalityLevel:
    """The level to try after a back-off: one looser (`any` stays `any`); a strict job stays at the best level
    the cluster's shape allows it from its start level; so does a multi-GPU `prefer` job that fits on one
    server, once at `packed` (one server for it), unless its AM relaxes by cost: see keeps_one_server."""
    if m.spec.locality.mode is LocalityMode.STRICT or m.spread:
        return shape_floor(m, first_level(m))
    if keeps_one_server(m):
        return m.level
    return LocalityLevel(min(m.level + 1, LocalityLevel.ANY))


def keeps_one_server(m: Master) -> bool:
    """A multi-GPU job that fits on one server is not split across servers unless it says `locality: any`, or
    its AM relaxes by expected cost (then the cost decides, as for any job). Splitting it moves its all-reduce
    from NVLink / PCIe onto the network, and with small jobs packed best fit (placement.py) whole servers do come
    free. Measured on the Philly window (8x8x8, las, ideal run times,
    seeds 0-2): locality 68-70% -> 98%, average queueing delay down 10-20%, average JCT unchanged within the
    seeds' spread; letting such jobs split after 30 min, 2 h or 6 h of waiting did worse on all three."""
    gpus = m.spec.gpus
    return (m.relax is None and gpus > 1 and m.level is LocalityLevel.PACKED and len(m.view) > 0
            and m.view.fewest_servers(gpus) == 1)
