"""A container's usage series: one sample per `telemetry.container_interval`, as JSON lines.

The agent appends one line per sample to `<container dir>/usage.jsonl`:

    {"t": 12.0, "cpu": 1.52, "mem_mib": 812.4, "gpu": 73.0}

`t` is seconds since the container's first sample, `cpu` the cores in use over the last interval, `mem_mib` the
resident memory, `gpu` the utilisation averaged over the container's GPUs (null when there is no reading). The
file is bounded (`nodeagent/series.py`); this module only formats and parses lines, so the evaluation
(`scripts/bench/rightsize`) and the unit tests read exactly what the agent wrote.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

SERIES_FILE = "usage.jsonl"
MAX_SERIES_BYTES = 4 * 1024 * 1024   # a series read back (bench, tests) is never larger than this
MAX_LINE = 200


class SeriesError(ValueError):
    """A series that cannot be read: too big, or a line that is not a sample (names the line)."""


@dataclass(frozen=True)
class Sample:
    t: float              # seconds since the series began
    cpu: float            # cores
    mem_mib: float
    gpu: float | None     # utilisation %, averaged over the container's GPUs

    def line(self) -> str:
        gpu = None if self.gpu is None else round(self.gpu, 1)
        return json.dumps({"t": round(self.t, 3), "cpu": round(self.cpu, 3), "mem_mib": round(self.mem_mib, 1),
                           "gpu": gpu}, separators=(",", ":"))


def _number(data: dict[str, object], key: str, n: int, *, optional: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise SeriesError(f"line {n}: {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def parse_line(text: str, n: int = 1) -> Sample:
    if len(text) > MAX_LINE:
        raise SeriesError(f"line {n}: longer than {MAX_LINE} characters")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SeriesError(f"line {n}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SeriesError(f"line {n}: expected an object with t, cpu, mem_mib, gpu")
    t, cpu, mem = (_number(data, k, n) for k in ("t", "cpu", "mem_mib"))
    assert t is not None and cpu is not None and mem is not None
    return Sample(t=t, cpu=cpu, mem_mib=mem, gpu=_number(data, "gpu", n, optional=True))


def parse_series(text: str) -> list[Sample]:
    """Every sample of a series file, in time order; blank lines are skipped, anything else bad is an error."""
    if len(text) > MAX_SERIES_BYTES:
        raise SeriesError(f"series larger than {MAX_SERIES_BYTES} bytes")
    out = [parse_line(line, n) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    for n, (a, b) in enumerate(itertools.pairwise(out), 2):
        if b.t < a.t:
            raise SeriesError(f"sample {n}: t={b.t} goes back in time (previous t={a.t})")
    return out


def format_series(samples: Iterable[Sample]) -> str:
    return "".join(s.line() + "\n" for s in samples)
