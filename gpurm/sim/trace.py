"""Job traces for `gpurm sim`: four formats loaded into one list of `TraceJob`s.

Every loader yields jobs with `submit_s` counted from the trace's first submission (the earliest job submits at
0.0), sorted by (submit_s, line). A malformed row stops loading with a `TraceError` whose message reads
`<file>:<line>: <field>: <reason>`; only the first bad row is reported, because after one bad row the rest of a
file is rarely worth reading. (Just over 500 lines: four formats, each documented here beside its loader.)

Formats (`--format`):

`philly-csv`
    The per-job table published with the Pollux artifact: header `timestamp,duration,num_gpus,gpu_time,cluster`
    (column order free, extra columns ignored). `timestamp` is the submission time, `%Y-%m-%d %H:%M:%S`, read as
    UTC; `duration` is the run time in seconds; `gpu_time` must equal `duration * num_gpus` within 1%; `cluster`
    (Philly's virtual cluster) is the queue. Rows have no ids: job ids are `t<line>`.

`tiresias`
    The Tiresias simulator's CSV: header `job_id,num_gpu,submit_time,iterations,model_name,duration,interval`.
    Required columns are `job_id`, `num_gpu`, `submit_time` and `duration` (seconds); `model_name` becomes the
    job's name; optional `queue` and `user` columns are read when present (the queue is `default` otherwise);
    `iterations` and `interval` are ignored.

`philly-joblog`
    Philly's original `cluster_job_log` (msr-fiddle/philly-traces): one JSON array of jobs, each
    `{"status", "vc", "jobid", "user", "submitted_time", "attempts": [{"start_time", "end_time",
    "detail": [{"ip", "gpus": [...]}]}]}`. Times are `%Y-%m-%d %H:%M:%S`, read as UTC; `"None"` or null means
    unknown. `vc` is the queue. GPUs: the total over the `detail` entries of the last attempt that lists any.
    Duration: the sum over attempts of end - start, counting only attempts with both times. A job with no
    submission time, no attempt with both times, or no GPUs in any attempt is skipped (listed in
    `Trace.skipped`); an attempt that ends before it starts is ignored (listed in `Trace.fixed`). The line of a
    job is its index in the array + 1.

`jsonl`
    gpurm's own format: one JSON object per line, e.g.
    `{"id": "j1", "submit": 0.0, "gpus": 4, "duration": 3600, "queue": "research.nlp", "user": "alice",
    "name": "bert"}`. `submit` (seconds, any origin) , `gpus` and `duration` (seconds, or a duration string
    such as `"2h"`) are required; `id` (default `t<line>`), `queue` (default `default`), `user`, `name` and
    `locality` are optional; other keys are rejected (a typo must not pass silently). `locality` is the job
    file's (docs/jobs.md): a mode (`"strict"`, `"prefer"`, `"any"`) or a mapping of `mode`, `start_level`,
    `timeout`, `backoff_base` and `backoff_max`; what it leaves out is the run's default. `placement` is the job
    file's too: `"pack"` (the default) or `"spread"`. `gpus` may also be a fraction below one (`0.5`): a job on
    a share of one GPU, as the job file's `gpus: 0.5`. Blank lines and lines starting with `#` are ignored.

Rules shared by all formats: `gpus` is an integer >= 1 (jsonl also takes a fraction of one GPU); a negative
duration is an error, a duration of 0 is kept as 1 s and listed in `Trace.fixed` (the simulator needs positive
run times; the real Philly table has no such rows); job ids are unique; a queue name is dot-separated segments
of `[A-Za-z0-9_-]` (`research.nlp` names a nested leaf queue).

Window (`--window START,END`): jobs submitted in [START, END) are kept and re-based so the first kept job
submits at 0. For formats with dates (`philly-csv`, `philly-joblog`) a bound is a date/time (`2017-10-03`,
`2017-10-03 12:00`, `2017-10-03T12:00:00`, UTC) or an offset from the trace's first submission (`0`, `86400`,
`36h`, `2d`); for the others, offsets only. An empty bound is open.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from gpurm.common.fields import parse_duration
from gpurm.common.jobspec import Locality, LocalityLevel, LocalityMode, Placement, share_milli

FORMATS = ("philly-csv", "philly-joblog", "tiresias", "jsonl")
DEFAULT_QUEUE = "default"
_QUEUE = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")
# Relative tolerance for philly-csv's redundant gpu_time column: it is rounded in the published table.
_GPU_TIME_TOLERANCE = 0.01
_ZERO_DURATION_S = 1.0


class TraceError(ValueError):
    """A trace (or a window over it) was rejected; the message names the file, the line and the field."""

    def __init__(self, source: str, line: int | None, field_name: str, reason: str) -> None:
        self.source = source
        self.line = line
        self.field = field_name
        self.reason = reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {field_name}: {reason}")


@dataclass(frozen=True)
class TraceLocality:
    """A trace job's own locality settings (the job file's `locality`, docs/jobs.md); None fields: the run's."""

    mode: LocalityMode | None = None
    start_level: LocalityLevel | None = None
    timeout_s: float | None = None
    backoff_base_s: float | None = None
    backoff_max_s: float | None = None

    def over(self, base: Locality) -> Locality:
        """`base` (the run's settings) with this job's own settings in place of its defaults."""
        return Locality(
            timeout_s=base.timeout_s if self.timeout_s is None else self.timeout_s,
            backoff_base_s=base.backoff_base_s if self.backoff_base_s is None else self.backoff_base_s,
            backoff_max_s=base.backoff_max_s if self.backoff_max_s is None else self.backoff_max_s,
            start_level=base.start_level if self.start_level is None else self.start_level,
            mode=base.mode if self.mode is None else self.mode)


@dataclass(frozen=True)
class TraceJob:
    job_id: str  # unique; from the trace if it has ids, else "t<line>"
    submit_s: float  # seconds since the trace's first submission (the earliest job submits at 0.0)
    gpus: int  # >= 1
    duration_s: float  # run time at full speed, > 0
    queue: str  # queue path below root, e.g. "6214e9" or "research.nlp"
    user: str = ""
    name: str = ""
    line: int = 0  # 1-based line (or JSON array index + 1) it came from
    # Locality sensitivity for the `placement` run-time model (sim/runtime.py), 0 (indifferent) to 1 (VGG-like).
    # None: from the locality mode, else the model name, else the configured mix (runtime.sensitivity_of).
    sensitivity: float | None = None
    locality: TraceLocality | None = None   # the job's own locality settings (jsonl only); None: the run's
    placement: Placement = Placement.PACK   # the job file's `placement` (jsonl only)
    max_gpus: int = 0                       # elastic: grows up to this many GPUs (0: rigid; see make_elastic)
    gpu_share_milli: int = 0                # below one GPU (jsonl `gpus: 0.5`): thousandths of one shared GPU


@dataclass
class Trace:
    jobs: list[TraceJob]  # sorted by (submit_s, line)
    start_epoch: float | None  # absolute time (Unix seconds) of submit_s == 0 when the format has dates
    source: str
    fmt: str = ""
    fixed: list[tuple[int, str]] = field(default_factory=list)  # (line, what was changed) for kept jobs
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why) for jobs left out

    def gpu_seconds(self) -> float:
        """Offered work: the sum of gpus x duration over the jobs."""
        return math.fsum((j.gpu_share_milli / 1000 if j.gpu_share_milli else j.gpus) * j.duration_s
                         for j in self.jobs)

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last submission."""
        return self.jobs[-1].submit_s - self.jobs[0].submit_s if self.jobs else 0.0

    def queues(self) -> list[str]:
        return sorted({j.queue for j in self.jobs})


@dataclass
class _Raw:
    """One job as read, before windowing: `at` is absolute (epoch seconds) or the file's own offset."""

    at: float
    line: int
    job_id: str
    gpus: int
    duration_s: float
    queue: str
    user: str
    name: str
    locality: TraceLocality | None = None
    placement: Placement = Placement.PACK
    gpu_share_milli: int = 0


@dataclass
class _Read:
    jobs: list[_Raw] = field(default_factory=list)
    fixed: list[tuple[float | None, int, str]] = field(default_factory=list)  # (at, line, reason)
    skipped: list[tuple[float | None, int, str]] = field(default_factory=list)


def tile(trace: Trace, copies: int) -> Trace:
    """The trace repeated `copies` times back to back: a bigger workload of the same shape, for measuring how the
    simulator's cost grows (scripts/bench/sim_speed --tile; the shared Philly window has 24,137 jobs, Philly 82k).

    Copy k (from 0) is every job shifted by k periods, the period being the trace's span plus its mean gap between
    submissions (rounded up to a whole second), so copies neither overlap nor leave a hole; its job ids and users
    get the suffix `~k` (copy 0 keeps the originals), so every job is distinct (the `placement` model's
    sensitivity draw, seeded by the job id, differs per copy) while the queues stay the same. The offered load per
    second, and so the load factor on the same cluster, is the original's. Deterministic: the same trace and
    count give the same jobs."""
    if copies < 1:
        raise ValueError(f"tile: copies must be at least 1, got {copies}")
    if copies == 1 or not trace.jobs:
        return trace
    # Whole seconds, so shifted submissions stay as exact as the originals.
    gap = math.ceil(trace.span_s / (len(trace.jobs) - 1)) if len(trace.jobs) > 1 else 1.0
    period = trace.span_s + max(gap, 1.0)
    jobs = list(trace.jobs)
    for k in range(1, copies):
        shift = k * period
        jobs.extend(dataclasses.replace(j, job_id=f"{j.job_id}~{k}", user=f"{j.user}~{k}" if j.user else "",
                                        submit_s=j.submit_s + shift, line=j.line + k * len(trace.jobs))
                    for j in trace.jobs)
    return dataclasses.replace(trace, jobs=jobs, source=f"{trace.source} x{copies}")


def make_elastic(trace: Trace, share: float, factor: float, seed: int = 0) -> Trace:
    """The trace with a share of its jobs made elastic (`gpurm sim --elastic-share`): each job is chosen with
    probability `share`, drawn from the seed and its job id (the same jobs whatever else changes), and may grow
    from its own size (the minimum, at which the trace's duration holds) to `factor` times it."""
    if not 0 <= share <= 1:
        raise ValueError(f"--elastic-share: must be between 0 and 1, got {share:g}")
    if factor < 1:
        raise ValueError(f"--elastic-max: must be at least 1 (times the job's GPUs), got {factor:g}")
    if share == 0 or factor == 1:
        return trace
    jobs = []
    for j in trace.jobs:
        draw = zlib.crc32(f"elastic:{seed}:{j.job_id}".encode()) / 2**32
        most = math.floor(j.gpus * factor)
        jobs.append(dataclasses.replace(j, max_gpus=most) if draw < share and most > j.gpus else j)
    return dataclasses.replace(trace, jobs=jobs)


def split_window(text: str) -> tuple[str, str]:
    """`START,END` as given to `--window` → (START, END); either may be empty (open)."""
    start, sep, end = text.partition(",")
    if not sep or "," in end:
        raise ValueError(f"--window: expected START,END (e.g. 2017-10-03,2017-10-05 or 0,2d), got {text!r}")
    return start.strip(), end.strip()


def load_trace(path: Path, fmt: str, window: tuple[str, str] | None = None) -> Trace:
    """Read `path` in format `fmt` (one of FORMATS), cut to `window` when given."""
    source = str(path)
    loaders: dict[str, tuple[Callable[[IO[str], str], _Read], bool]] = {
        "philly-csv": (_read_philly_csv, True),
        "philly-joblog": (_read_philly_joblog, True),
        "tiresias": (_read_tiresias, False),
        "jsonl": (_read_jsonl, False),
    }
    if fmt not in loaders:
        raise TraceError(source, None, "--format", f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    reader, has_dates = loaders[fmt]
    try:
        with _open(path) as f:
            read = reader(f, source)
    except OSError as exc:
        raise TraceError(source, None, "file", exc.strerror or str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise TraceError(source, None, "file", f"not UTF-8 text ({exc.reason})") from exc
    _check_unique(read.jobs, source, "jobid" if fmt == "philly-joblog" else "id" if fmt == "jsonl" else "job_id")
    return _finish(read, source, fmt, has_dates, window)


def _open(path: Path) -> IO[str]:
    # utf-8-sig: a byte-order mark left by a spreadsheet export must not become part of the first column's name.
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


# ----------------------------------------------------------------------------------------------- windowing


def _finish(read: _Read, source: str, fmt: str, has_dates: bool, window: tuple[str, str] | None) -> Trace:
    if not read.jobs:
        raise TraceError(source, None, "jobs", "the trace holds no usable jobs")
    origin = min(r.at for r in read.jobs)
    lo, hi = -math.inf, math.inf
    if window is not None:
        lo, hi = _window_bounds(window, origin, has_dates, source)
    kept = [r for r in read.jobs if lo <= r.at < hi]
    if not kept:
        raise TraceError(source, None, "--window",
                         f"no job is submitted in [{window[0] if window else ''}, {window[1] if window else ''})")
    base = min(r.at for r in kept)
    kept.sort(key=lambda r: (r.at, r.line))
    jobs = [TraceJob(r.job_id, r.at - base, r.gpus, r.duration_s, r.queue, r.user, r.name, r.line,
                     locality=r.locality, placement=r.placement, gpu_share_milli=r.gpu_share_milli) for r in kept]

    def inside(items: list[tuple[float | None, int, str]]) -> list[tuple[int, str]]:
        # Notes about jobs outside the window would be noise; those without a known time are always kept.
        return sorted((line, why) for at, line, why in items if at is None or lo <= at < hi)

    return Trace(jobs=jobs, start_epoch=base if has_dates else None, source=source, fmt=fmt,
                 fixed=inside(read.fixed), skipped=inside(read.skipped))


def _window_bounds(window: tuple[str, str], origin: float, has_dates: bool, source: str) -> tuple[float, float]:
    bounds = [
        _window_bound(text, origin, has_dates, source, default)
        for text, default in zip(window, (-math.inf, math.inf), strict=True)
    ]
    lo, hi = bounds
    if lo >= hi:
        raise TraceError(source, None, "--window", f"START must come before END, got {window[0]!r},{window[1]!r}")
    return lo, hi


def _window_bound(text: str, origin: float, has_dates: bool, source: str, default: float) -> float:
    text = text.strip()
    if not text:
        return default
    try:
        return origin + parse_duration(text)
    except ValueError:
        pass
    if not has_dates:
        raise TraceError(source, None, "--window",
                         f"{text!r}: this format has no dates; give offsets from its first submission "
                         "in seconds or as 36h, 2d")
    try:
        return _epoch(datetime.fromisoformat(text))
    except ValueError:
        raise TraceError(source, None, "--window",
                         f"{text!r}: expected a date/time (2017-10-03, 2017-10-03 12:00) or an offset "
                         "(0, 86400, 36h, 2d)") from None


# ------------------------------------------------------------------------------------------- field checks


def _epoch(moment: datetime) -> float:
    # Naive times are UTC: only differences matter to the simulator, and UTC has no DST jumps.
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")


def _timestamp(text: str, source: str, line: int, name: str) -> float:
    stripped = text.strip()
    if _TIME.match(stripped):
        try:
            return _epoch(datetime.fromisoformat(stripped))
        except ValueError:
            pass
    raise TraceError(source, line, name, f"expected a time like 2017-10-02 00:01:55, got {text!r}")


def _gpus(text: object, source: str, line: int, name: str) -> int:
    value: int | None = None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and _INTEGER.match(text):
        value = int(text)
    if value is None:
        raise TraceError(source, line, name, f"expected a whole number of GPUs, got {text!r}")
    if value < 1:
        raise TraceError(source, line, name, f"must be at least 1, got {value}")
    return value


def _number(text: object, source: str, line: int, name: str) -> float:
    try:
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise ValueError
        value = float(text)
    except ValueError:
        raise TraceError(source, line, name, f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(source, line, name, f"must be finite, got {text!r}")
    return value


def _duration(value: float, source: str, line: int, name: str, read: _Read, at: float | None) -> float:
    if value < 0:
        raise TraceError(source, line, name, f"must not be negative, got {value:g}")
    if value == 0:
        read.fixed.append((at, line, f"{name}: 0 s, run as {_ZERO_DURATION_S:g} s"))
        return _ZERO_DURATION_S
    return value


def _queue(text: object, source: str, line: int, name: str) -> str:
    if not isinstance(text, str) or not _QUEUE.match(text):
        raise TraceError(source, line, name,
                         f"a queue name is dot-separated parts of letters, digits, _ and -, got {text!r}")
    return text


def _check_unique(jobs: list[_Raw], source: str, name: str) -> None:
    first: dict[str, int] = {}
    for r in jobs:
        seen = first.setdefault(r.job_id, r.line)
        if seen != r.line:
            raise TraceError(source, r.line, name, f"duplicate id {r.job_id!r} (first on line {seen})")


# ------------------------------------------------------------------------------------------------ CSV formats


def _csv_rows(f: IO[str], source: str, required: tuple[str, ...], fmt: str,
              ) -> Iterator[tuple[int, Mapping[str, str]]]:
    """(line, row) for every non-blank data row, after checking the header names every required column."""
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise TraceError(source, 1, "header", f"the file is empty; a {fmt} trace starts with {','.join(required)}")
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(source, 1, "header",
                         f"missing column(s) {', '.join(missing)} (got {','.join(names)}); "
                         f"a {fmt} trace has {','.join(required)} — is --format right?")
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(names):
            raise TraceError(source, reader.line_num, "row",
                             f"expected {len(names)} fields ({','.join(names)}), got {len(row)}")
        yield reader.line_num, dict(zip(names, row, strict=True))


_PHILLY_CSV = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


def _read_philly_csv(f: IO[str], source: str) -> _Read:
    read = _Read()
    for line, row in _csv_rows(f, source, _PHILLY_CSV, "philly-csv"):
        at = _timestamp(row["timestamp"], source, line, "timestamp")
        raw_duration = _number(row["duration"], source, line, "duration")
        gpus = _gpus(row["num_gpus"], source, line, "num_gpus")
        gpu_time = _number(row["gpu_time"], source, line, "gpu_time")
        if not math.isclose(gpu_time, raw_duration * gpus, rel_tol=_GPU_TIME_TOLERANCE, abs_tol=1e-6):
            raise TraceError(source, line, "gpu_time",
                             f"{gpu_time:g} is not duration x num_gpus = {raw_duration * gpus:g} (within 1%)")
        duration = _duration(raw_duration, source, line, "duration", read, at)
        queue = _queue(row["cluster"].strip(), source, line, "cluster")
        read.jobs.append(_Raw(at, line, f"t{line}", gpus, duration, queue, "", ""))
    return read


_TIRESIAS = ("job_id", "num_gpu", "submit_time", "duration")


def _read_tiresias(f: IO[str], source: str) -> _Read:
    read = _Read()
    for line, row in _csv_rows(f, source, _TIRESIAS, "tiresias"):
        job_id = row["job_id"].strip()
        if not job_id:
            raise TraceError(source, line, "job_id", "is empty")
        gpus = _gpus(row["num_gpu"], source, line, "num_gpu")
        at = _number(row["submit_time"], source, line, "submit_time")
        if at < 0:
            raise TraceError(source, line, "submit_time", f"must not be negative, got {at:g}")
        duration = _duration(_number(row["duration"], source, line, "duration"), source, line, "duration", read,
                             at)
        queue = _queue(row["queue"].strip(), source, line, "queue") if "queue" in row else DEFAULT_QUEUE
        read.jobs.append(_Raw(at, line, job_id, gpus, duration, queue, row.get("user", "").strip(),
                              row.get("model_name", "").strip()))
    return read


# ---------------------------------------------------------------------------------------------- JSON formats


def _read_jsonl(f: IO[str], source: str) -> _Read:
    read = _Read()
    known = ("id", "submit", "gpus", "duration", "queue", "user", "name", "locality", "placement")
    for line, text in enumerate(f, start=1):
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise TraceError(source, line, "json", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(source, line, "json", f"expected an object {{...}}, got {type(obj).__name__}")
        unknown = sorted(k for k in obj if k not in known)
        if unknown:
            raise TraceError(source, line, unknown[0], f"unknown field (known: {', '.join(known)})")
        for key in ("submit", "gpus", "duration"):
            if key not in obj:
                raise TraceError(source, line, key, "is required")
        at = _seconds(obj["submit"], source, line, "submit")
        share = _share(obj["gpus"], source, line)
        gpus = 1 if share else _gpus(obj["gpus"], source, line, "gpus")
        duration = _duration(_seconds(obj["duration"], source, line, "duration"), source, line, "duration", read,
                             at)
        job_id = _text(obj.get("id", f"t{line}"), source, line, "id", allow_int=True)
        if not job_id:
            raise TraceError(source, line, "id", "is empty")
        queue = _queue(obj.get("queue", DEFAULT_QUEUE), source, line, "queue")
        locality = _locality(obj["locality"], source, line) if "locality" in obj else None
        placement = _placement(obj["placement"], source, line) if "placement" in obj else Placement.PACK
        read.jobs.append(_Raw(at, line, job_id, gpus, duration, queue, _text(obj.get("user", ""), source, line,
                                                                              "user"),
                              _text(obj.get("name", ""), source, line, "name"), locality, placement, share))
    return read


def _share(value: object, source: str, line: int) -> int:
    """A jsonl job's `gpus` below one (0.5): its thousandths of one shared GPU; 0 for whole GPUs."""
    if not isinstance(value, float):
        return 0
    try:
        return share_milli(str(value))
    except ValueError as exc:
        raise TraceError(source, line, "gpus", str(exc)) from None


def _placement(value: object, source: str, line: int) -> Placement:
    if isinstance(value, str):
        try:
            return Placement.parse(value)
        except ValueError as exc:
            raise TraceError(source, line, "placement", str(exc)) from None
    raise TraceError(source, line, "placement", f"must be one of pack, spread; got {str(value)[:80]!r}")


_LOCALITY_KEYS = ("mode", "start_level", "timeout", "backoff_base", "backoff_max")


def _locality(value: object, source: str, line: int) -> TraceLocality:
    """A jsonl job's `locality`: a mode (the job file's shorthand) or a mapping of the job file's keys."""
    if isinstance(value, str):
        return TraceLocality(mode=_locality_mode(value, source, line, "locality"))
    if not isinstance(value, dict):
        raise TraceError(source, line, "locality", f"expected a mode (strict, prefer, any) or a mapping of "
                                                   f"{', '.join(_LOCALITY_KEYS)}, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in _LOCALITY_KEYS)
    if unknown:
        raise TraceError(source, line, f"locality.{unknown[0]}",
                         f"unknown field (known: {', '.join(_LOCALITY_KEYS)})")
    mode = _locality_mode(value["mode"], source, line, "locality.mode") if "mode" in value else None
    level = _start_level(value["start_level"], source, line) if "start_level" in value else None
    times = {k: _seconds(value[k], source, line, f"locality.{k}") if k in value else None
             for k in ("timeout", "backoff_base", "backoff_max")}
    return TraceLocality(mode, level, times["timeout"], times["backoff_base"], times["backoff_max"])


def _start_level(text: object, source: str, line: int) -> LocalityLevel:
    try:
        if isinstance(text, str):
            return LocalityLevel.parse(text)
    except ValueError:
        pass
    raise TraceError(source, line, "locality.start_level", f"must be one of node, packed, rack, any; got {text!r}")


def _locality_mode(text: object, source: str, line: int, name: str) -> LocalityMode:
    try:
        if isinstance(text, str):
            return LocalityMode.parse(text)
    except ValueError:
        pass
    raise TraceError(source, line, name, f"must be one of strict, prefer, any; got {text!r}")


def _seconds(value: object, source: str, line: int, name: str) -> float:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise TraceError(source, line, name, str(exc)) from None
    seconds = _number(value, source, line, name)
    if seconds < 0:
        raise TraceError(source, line, name, f"must not be negative, got {seconds:g}")
    return seconds


def _text(value: object, source: str, line: int, name: str, *, allow_int: bool = False) -> str:
    if isinstance(value, str):
        return value
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TraceError(source, line, name, f"must be a string, got {value!r}")


def _maybe_time(value: object, source: str, line: int, name: str) -> float | None:
    """A joblog time: None for null, "" or "None" (Philly logged missing times so), else the epoch."""
    if value is None or value in ("", "None"):
        return None
    if not isinstance(value, str):
        raise TraceError(source, line, name, f"expected a time string or null, got {value!r}")
    return _timestamp(value, source, line, name)


def _read_philly_joblog(f: IO[str], source: str) -> _Read:
    try:
        data: Any = json.load(f)
    except json.JSONDecodeError as exc:
        # For a JSON document the text line is the useful place to point at.
        raise TraceError(source, exc.lineno, "json", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, list):
        raise TraceError(source, 1, "json", f"expected a JSON array of jobs, got {type(data).__name__}")
    read = _Read()
    for index, job in enumerate(data):
        line = index + 1
        if not isinstance(job, dict):
            raise TraceError(source, line, "job", f"expected an object, got {type(job).__name__}")
        for key in ("jobid", "vc", "submitted_time"):
            if key not in job:
                raise TraceError(source, line, key, "is required")
        job_id = _text(job["jobid"], source, line, "jobid")
        if not job_id:
            raise TraceError(source, line, "jobid", "is empty")
        queue = _queue(job["vc"], source, line, "vc")
        user = _text(job.get("user") or "", source, line, "user")
        at = _maybe_time(job["submitted_time"], source, line, "submitted_time")
        attempts = job.get("attempts") or []
        if not isinstance(attempts, list):
            raise TraceError(source, line, "attempts", f"expected a list, got {type(attempts).__name__}")
        duration = 0.0
        usable = 0
        gpus = 0
        for k, attempt in enumerate(attempts):
            where = f"attempts[{k}]"
            if not isinstance(attempt, dict):
                raise TraceError(source, line, where, f"expected an object, got {type(attempt).__name__}")
            attempt_gpus = _attempt_gpus(attempt.get("detail"), source, line, where)
            if attempt_gpus:
                gpus = attempt_gpus  # the last attempt that lists GPUs wins
            start = _maybe_time(attempt.get("start_time"), source, line, f"{where}.start_time")
            end = _maybe_time(attempt.get("end_time"), source, line, f"{where}.end_time")
            if start is None or end is None:
                continue
            if end < start:
                read.fixed.append((at, line, f"{where}: end_time before start_time, attempt ignored"))
                continue
            duration += end - start
            usable += 1
        if at is None:
            read.skipped.append((None, line, "no submitted_time"))
            continue
        if not usable or not gpus:
            why = ("no attempts (never ran)" if not attempts
                   else "no attempt with both start_time and end_time" if not usable
                   else "no attempt lists GPUs")
            read.skipped.append((at, line, why))
            continue
        duration = _duration(duration, source, line, "attempts", read, at)
        read.jobs.append(_Raw(at, line, job_id, gpus, duration, queue, user, ""))
    return read


def _attempt_gpus(detail: object, source: str, line: int, where: str) -> int:
    if detail is None:
        return 0
    if not isinstance(detail, list):
        raise TraceError(source, line, f"{where}.detail", f"expected a list, got {type(detail).__name__}")
    total = 0
    for i, entry in enumerate(detail):
        gpus = entry.get("gpus") if isinstance(entry, dict) else None
        if not isinstance(gpus, list):
            raise TraceError(source, line, f"{where}.detail[{i}].gpus", f"expected a list of GPU names, got {gpus!r}")
        total += len(gpus)
    return total
