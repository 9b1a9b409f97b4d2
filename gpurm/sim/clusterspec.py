"""The simulated cluster (`gpurm sim --cluster SPEC`): a list of GPU servers with their racks.

SPEC is either
- `RxNxG`, e.g. `8x8x8`: R racks of N servers with G GPUs each; node ids `r{rack:02d}n{i:02d}`, racks
  `rack-{rack:02d}`; or
- a path to a file in Philly's `cluster_machine_list` format: header `machineId, number of GPUs, single GPU mem`
  (spaces after the commas allowed), one server per row; node id = machineId, GPUs = number of GPUs; the GPU
  memory column is not used. Philly's list names no racks, so servers are grouped into racks of 16 in file
  order, separately for each GPU count (a rack never mixes 2-GPU and 8-GPU servers, so locality-packed
  placement sees homogeneous racks); the racks are named `rack-<gpus>g-<k>` with k counting from 0.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

RACK_SIZE = 16  # servers per rack when the spec names no racks (a common top-of-rack switch size)
_GRID = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)
_LOOKS_LIKE_GRID = re.compile(r"^[\dx\s]+$", re.IGNORECASE)
_HEADER = ("machineid", "number of gpus", "single gpu mem")


@dataclass(frozen=True)
class SimServer:
    node_id: str
    rack: str
    gpus: int


def parse_cluster(spec: str) -> list[SimServer]:
    """Servers for SPEC (see the module docstring). Raises ValueError naming the spec and, for files, the line."""
    grid = _GRID.match(spec)
    if grid:
        racks, servers, gpus = (int(g) for g in grid.groups())
        if min(racks, servers, gpus) < 1:
            raise ValueError(f"--cluster {spec!r}: racks, servers per rack and GPUs per server must each be >= 1")
        return [SimServer(f"r{r:02d}n{i:02d}", f"rack-{r:02d}", gpus) for r in range(racks) for i in range(servers)]
    path = Path(spec)
    if not path.is_file():
        hint = " (a grid is RACKSxSERVERSxGPUS, e.g. 8x8x8)" if _LOOKS_LIKE_GRID.match(spec) else ""
        raise ValueError(f"--cluster {spec!r}: neither RACKSxSERVERSxGPUS (e.g. 8x8x8) nor an existing machine "
                         f"list file{hint}")
    return _read_machine_list(path)


def total_gpus(servers: Sequence[SimServer]) -> int:
    return sum(s.gpus for s in servers)


def fewest_servers_for(servers: Sequence[SimServer]) -> Callable[[int], int]:
    """A function: GPUs → the fewest servers of this cluster that together hold that many (0: more than it has).

    The biggest servers first is optimal for a count bound; precomputed once so a 24k-job trace costs a bisect
    per job, not a sort.
    """
    cumulative = list(accumulate(sorted((s.gpus for s in servers), reverse=True)))

    def fewest(gpus: int) -> int:
        if not cumulative or gpus > cumulative[-1]:
            return 0
        return bisect_left(cumulative, gpus) + 1

    return fewest


def _read_machine_list(path: Path) -> list[SimServer]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the machine list: {exc}") from exc
    if not lines or tuple(c.strip().lower() for c in lines[0].split(",")) != _HEADER:
        got = lines[0] if lines else "an empty file"
        raise ValueError(f"{path}:1: header: expected 'machineId, number of GPUs, single GPU mem', got {got!r}")
    rows: list[tuple[str, int]] = []
    first_line: dict[str, int] = {}
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        cells = [c.strip() for c in text.split(",")]
        if len(cells) not in (2, 3):
            raise ValueError(f"{path}:{number}: expected machineId, number of GPUs, single GPU mem; got {text!r}")
        node_id, gpus_text = cells[0], cells[1]
        if not node_id:
            raise ValueError(f"{path}:{number}: machineId: is empty")
        if node_id in first_line:
            raise ValueError(f"{path}:{number}: machineId: duplicate {node_id!r} (first on line "
                             f"{first_line[node_id]})")
        if not gpus_text.isdigit() or int(gpus_text) < 1:
            raise ValueError(f"{path}:{number}: number of GPUs: expected a whole number >= 1, got {gpus_text!r}")
        first_line[node_id] = number
        rows.append((node_id, int(gpus_text)))
    if not rows:
        raise ValueError(f"{path}: the machine list names no servers")
    seen_per_size: dict[int, int] = {}
    servers: list[SimServer] = []
    for node_id, gpus in rows:
        k = seen_per_size.get(gpus, 0)
        seen_per_size[gpus] = k + 1
        servers.append(SimServer(node_id, f"rack-{gpus}g-{k // RACK_SIZE}", gpus))
    return servers
