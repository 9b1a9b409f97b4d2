"""What a simulated run measured: per-job results, the allocation timeline, and the summary built from them.

Definitions used in `summary.json`:
- *finished* jobs are those with a finish time (SUCCEEDED, FAILED or KILLED); JCT (finish - submit) and
  queueing delay (first start - submit) statistics are over finished jobs only; `unfinished` counts the rest.
- Percentiles are nearest-rank: the p-th percentile of n sorted values is the value at rank ceil(p/100 x n)
  (1-based), so it is always one of the values; statistics of an empty set are null.
- `makespan_s` runs from the first submission to the last finish (0 when nothing finished).
- `gpu_utilization` is the integral of allocated GPUs over the makespan (the timeline is a step function: a
  sample holds until the next one) divided by capacity x makespan.
- `locality` is the fraction of finished multi-GPU jobs that ran on `fewest_servers` servers (null when there
  are none).
- `per_queue` is keyed by queue path below root (`research.nlp`; a `root.` prefix is dropped).
- `per_queue[q].gpu_time_share` is q's part of all GPU-time allocated during the makespan (the shares sum to 1;
  all are 0 when nothing was allocated).
- `queue_by_size` is the average queueing delay of finished jobs of 1, 2-4, 5-8 and more than 8 GPUs.
- `load_factor` is the offered GPU-time over capacity x the span of submissions.
- `locality_by_size`: `locality` for finished jobs of 2-4, 5-8, 9-16 and 17+ GPUs (`LOCALITY_CLASSES`; null
  where there are none); `queue_by_class` / `jobs_by_class`: average queueing delay and count of finished jobs
  for 1 GPU and the same classes; `queue_p99_by_class` their p99 queueing delay; `queue_ratio_by_class` each
  class's average queueing over the one-GPU jobs' (floor 600 s: a class is starved when far above 1; null where a
  class has no finished jobs).
- `mean_slowdown`: the time-weighted mean placement slowdown: the sum over jobs of the integral of 1 / rate over
  the time their learners made progress, divided by that time (1.0: everything ran at full speed, as always
  under the `ideal` run-time model); `mean_slowdown_multi_server`: the same over jobs whose last placement spanned
  more than one server (null when none).
- `gpu_hours_lost_preemption` / `gpu_hours_lost_failures`: GPU-time held without producing kept work, because of
  preemption or infrastructure failures: the work since the last checkpoint of an interrupted attempt plus the
  restart cost of the attempt after it (0 under `ideal`, whose checkpoints are instant and restarts free).
- `avg_jct_excess_s` / `p50_jct_excess_s` / `p99_jct_excess_s`: JCT minus the trace's run time, over finished
  jobs: everything a job lost to waiting, slow placements and preemption.
- `per_queue[q].below_share_s`: seconds queue q spent below its instantaneous fair share while it wanted more
  GPUs than it had (the RM's `QueueBook.waiting`, taken after every settle: the set holds until the next);
  `fairness`: the queue with the most such time (`worst_queue`, `max_below_share_s`, and that as a share of the
  makespan) and the mean over the queues that ever were below their share.
- `per_queue[q].below_guarantee_s`: seconds queue q used fewer GPUs than min(its demand, its steady share): its
  guarantee unmet; `fairness.worst_guarantee_queue`, `max_below_guarantee_s`, `max_below_guarantee_fraction`
  (of the makespan) and `mean_below_guarantee_s` summarize it as for the share.

Nothing here imports matplotlib: plots live in `plots.py`, so reading a summary stays cheap.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

log = logging.getLogger(__name__)

STATES = ("SUCCEEDED", "FAILED", "KILLED", "REJECTED", "UNFINISHED")
SIZE_CLASSES = ("1", "2-4", "5-8", ">8")
LOCALITY_CLASSES = ("2-4", "5-8", "9-16", "17+")   # multi-GPU jobs, by how many 8-GPU servers they need
SUMMARY_FILE = "summary.json"
JOBS_FILE = "jobs.csv"
QUEUE_TIMELINE_FILE = "queue_timeline.csv"


def queue_key(name: str) -> str:
    """A queue as summaries name it: its path below root (`research.nlp`), whether given as that or as
    `root.research.nlp` (the trace names queues the first way, the RM's timeline the second)."""
    return name[len("root."):] if name.startswith("root.") else name


def size_class(gpus: int) -> str:
    """The Philly paper's job-size buckets: "1", "2-4", "5-8", ">8"."""
    if gpus <= 1:
        return "1"
    if gpus <= 4:
        return "2-4"
    if gpus <= 8:
        return "5-8"
    return ">8"


def locality_class(gpus: int) -> str:
    """The class of a job in LOCALITY_CLASSES, or "1" for a one-GPU job: the size classes, with ">8" split."""
    if gpus <= 8:
        return size_class(gpus)
    return "9-16" if gpus <= 16 else "17+"


RATIO_FLOOR_S = 600.0     # the one-GPU jobs' queueing taken as at least this when classes are compared


def _ratios(means: Mapping[str, float | None]) -> dict[str, float | None]:
    base = max(means.get("1") or 0.0, RATIO_FLOOR_S)
    return {c: (m / base if m is not None else None) for c, m in means.items()}


def _share_packed(jobs: Sequence[JobResult]) -> float | None:
    placed = [r for r in jobs if r.servers > 0]
    return sum(1 for r in placed if r.servers <= r.fewest_servers) / len(placed) if placed else None


def _weighted_slowdown(jobs: Sequence[JobResult]) -> float | None:
    run = math.fsum(r.run_s for r in jobs)
    return math.fsum(r.slowdown * r.run_s for r in jobs) / run if run > 0 else None


@dataclass
class JobResult:
    job_id: str
    queue: str
    gpus: int
    submit_s: float
    start_s: float | None  # first start of any attempt
    finish_s: float | None
    duration_s: float  # run time at full speed, from the trace
    attempts: int
    preemptions: int
    retries: int
    servers: int  # servers of its last (successful) placement; 0 if never placed
    fewest_servers: int  # the fewest servers it could have used in this cluster
    gpu_seconds_served: float  # GPU-seconds it actually ran, lost work of failed / preempted attempts included
    state: str  # one of STATES
    # The run-time model's figures (sim/runtime.py); under `ideal` a job runs at full speed and loses nothing.
    sensitivity: float = 0.0  # its locality sensitivity (0 under `ideal`)
    run_s: float = 0.0  # seconds its learners made progress (restarts excluded), all attempts
    slowdown: float = 1.0  # run_s-weighted mean of 1 / rate over them (1 = full speed)
    lost_preemption_gpu_s: float = 0.0  # GPU-time lost to preemption (work since the checkpoint, restarts)
    lost_failure_gpu_s: float = 0.0  # the same for infrastructure failures

    @property
    def finished(self) -> bool:
        return self.finish_s is not None

    @property
    def queue_s(self) -> float:
        """Queueing delay: first start - submit (0 if it never started)."""
        return self.start_s - self.submit_s if self.start_s is not None else 0.0

    @property
    def jct_s(self) -> float | None:
        """Job completion time: finish - submit (None while unfinished)."""
        return self.finish_s - self.submit_s if self.finish_s is not None else None


@dataclass
class Timeline:
    """Allocated GPUs over time as a step function: sample i holds from times[i] until times[i + 1].

    `per_queue[q][i]` is queue q's allocation at times[i]; every list has one entry per time.
    """

    times: list[float] = field(default_factory=list)
    allocated: list[float] = field(default_factory=list)     # GPUs (a job below one GPU counts its fraction)
    per_queue: dict[str, list[float]] = field(default_factory=dict)
    # Fairness: seconds each leaf queue spent below its instantaneous fair share while it wanted more GPUs than
    # it had (the RM's `QueueBook.waiting`), and the set below it since `_below_since`.
    below_share_s: dict[str, float] = field(default_factory=dict)
    # The same for the guarantee: seconds each queue used less than min(its demand, its steady share).
    below_guarantee_s: dict[str, float] = field(default_factory=dict)
    _below: frozenset[str] = frozenset()
    _below_since: float = 0.0
    _under: frozenset[str] = frozenset()
    _under_since: float = 0.0

    def mark_below(self, now: float, below: Iterable[str], under: Iterable[str] | None = None) -> None:
        """From `now` on, the queues in `below` are the ones below their share with unmet demand, and those in
        `under` (when given) the ones below their guarantee."""
        below = frozenset(below)
        if below != self._below:
            self._close(self.below_share_s, self._below, self._below_since, now)
            self._below, self._below_since = below, now
        if under is not None:
            under = frozenset(under)
            if under != self._under:
                self._close(self.below_guarantee_s, self._under, self._under_since, now)
                self._under, self._under_since = under, now

    def close_below(self, now: float) -> None:
        """Count the time since the last change for the queues below their share (and guarantee) then."""
        self._close(self.below_share_s, self._below, self._below_since, now)
        self._close(self.below_guarantee_s, self._under, self._under_since, now)
        self._below_since = self._under_since = now

    @staticmethod
    def _close(seconds: dict[str, float], members: frozenset[str], since: float, now: float) -> None:
        for name in members:
            seconds[name] = seconds.get(name, 0.0) + max(0.0, now - since)

    def record(self, now: float, per_queue: Mapping[str, float]) -> None:
        """Append the allocation per queue at `now` (queues not named hold 0).

        Several changes at one instant keep only the last, so the step function has no zero-width steps.
        """
        if self.times and now < self.times[-1]:
            raise ValueError(f"timeline: time went backwards ({now} after {self.times[-1]})")
        if self.times and now == self.times[-1]:
            self.allocated[-1] = sum(per_queue.values())
            for name, values in self.per_queue.items():
                values[-1] = per_queue.get(name, 0)
            for name in per_queue.keys() - self.per_queue.keys():
                self.per_queue[name] = [0] * (len(self.times) - 1) + [per_queue[name]]
            return
        n = len(self.times)
        self.times.append(now)
        self.allocated.append(sum(per_queue.values()))
        for name, values in self.per_queue.items():
            values.append(per_queue.get(name, 0))
        for name in per_queue.keys() - self.per_queue.keys():
            self.per_queue[name] = [0] * n + [per_queue[name]]

    def integral(self, start: float, end: float) -> float:
        """GPU-seconds allocated in [start, end]."""
        return _step_integral(self.times, self.allocated, start, end)

    def queue_integrals(self, start: float, end: float) -> dict[str, float]:
        """GPU-seconds allocated to each queue in [start, end]."""
        return {q: _step_integral(self.times, v, start, end) for q, v in self.per_queue.items()}


def _step_integral(times: Sequence[float], values: Sequence[float], start: float, end: float) -> float:
    if not times or end <= start:
        return 0.0
    total = 0.0
    # Begin at the sample in force at `start`; before the first sample nothing is allocated.
    i = max(bisect_right(times, start) - 1, 0)
    n = len(times)
    while i < n and times[i] < end:
        lo = max(times[i], start)
        hi = min(times[i + 1], end) if i + 1 < n else end
        if hi > lo:
            total += values[i] * (hi - lo)
        i += 1
    return total


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None for none)."""
    if not sorted_values:
        return None
    rank = max(math.ceil(p / 100.0 * len(sorted_values)), 1)
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def load_factor(trace_gpu_seconds: float, capacity_gpus: int, span_s: float) -> float:
    """Offered GPU-time / (capacity x span of submissions); infinite when every job submits at once."""
    if capacity_gpus <= 0:
        raise ValueError(f"load factor: capacity must be positive, got {capacity_gpus}")
    if span_s <= 0:
        return math.inf if trace_gpu_seconds > 0 else 0.0
    return trace_gpu_seconds / (capacity_gpus * span_s)


def _delay_stats(jobs: Sequence[JobResult]) -> dict[str, object]:
    done = [r for r in jobs if r.finish_s is not None]
    jcts = sorted(r.finish_s - r.submit_s for r in done if r.finish_s is not None)
    waits = sorted(r.queue_s for r in done)
    return {
        "avg_jct_s": _mean(jcts),
        "p50_jct_s": percentile(jcts, 50),
        "p99_jct_s": percentile(jcts, 99),
        "avg_queue_s": _mean(waits),
        "p50_queue_s": percentile(waits, 50),
        "p99_queue_s": percentile(waits, 99),
    }


def summarize(results: list[JobResult], timeline: Timeline, capacity_gpus: int, load_factor: float, wall_s: float,
              extra: dict[str, object] | None = None) -> dict[str, object]:
    """The run's summary (see the module docstring for every definition)."""
    done = [r for r in results if r.finish_s is not None]
    first_submit = min((r.submit_s for r in results), default=0.0)
    last_finish = max((r.finish_s for r in done if r.finish_s is not None), default=first_submit)
    makespan = last_finish - first_submit
    allocated_gpu_s = timeline.integral(first_submit, last_finish)
    utilization = allocated_gpu_s / (capacity_gpus * makespan) if makespan > 0 and capacity_gpus > 0 else 0.0
    if utilization > 1.0 + 1e-9:
        log.warning("timeline allocates more than the capacity of %d GPUs (utilization %.3f)", capacity_gpus,
                    utilization)

    placed_multi = [r for r in done if r.gpus > 1 and r.servers > 0]
    locality = _share_packed(placed_multi)
    by_class: dict[str, list[JobResult]] = {c: [] for c in ("1", *LOCALITY_CLASSES)}
    for r in done:
        by_class[locality_class(r.gpus)].append(r)
    excess = sorted(r.finish_s - r.submit_s - r.duration_s for r in done if r.finish_s is not None)

    below: dict[str, float] = {}
    for name, seconds in timeline.below_share_s.items():
        below[queue_key(name)] = below.get(queue_key(name), 0.0) + seconds
    under: dict[str, float] = {}
    for name, seconds in timeline.below_guarantee_s.items():
        under[queue_key(name)] = under.get(queue_key(name), 0.0) + seconds
    queue_gpu_s: dict[str, float] = {}
    for name, gpu_s in timeline.queue_integrals(first_submit, last_finish).items():
        queue_gpu_s[queue_key(name)] = queue_gpu_s.get(queue_key(name), 0.0) + gpu_s
    total_queue_gpu_s = math.fsum(queue_gpu_s.values())
    by_queue: dict[str, list[JobResult]] = {}
    for r in results:
        by_queue.setdefault(queue_key(r.queue), []).append(r)
    per_queue: dict[str, object] = {}
    for name in sorted(by_queue.keys() | queue_gpu_s.keys() | below.keys()):
        jobs = by_queue.get(name, [])
        per_queue[name] = {
            "jobs": len(jobs),
            "finished": sum(1 for r in jobs if r.finished),
            **_delay_stats(jobs),
            "preemptions": sum(r.preemptions for r in jobs),
            "retries": sum(r.retries for r in jobs),
            "gpu_seconds_allocated": queue_gpu_s.get(name, 0.0),
            "gpu_time_share": queue_gpu_s.get(name, 0.0) / total_queue_gpu_s if total_queue_gpu_s > 0 else 0.0,
            "below_share_s": below.get(name, 0.0),
            "below_guarantee_s": under.get(name, 0.0),
        }

    by_size: dict[str, list[float]] = {c: [] for c in SIZE_CLASSES}
    for r in done:
        by_size[size_class(r.gpus)].append(r.queue_s)
    states = {s: 0 for s in STATES}
    for r in results:
        states[r.state] = states.get(r.state, 0) + 1

    summary: dict[str, object] = {
        "jobs": len(results),
        "finished": len(done),
        "unfinished": sum(1 for r in results if r.state == "UNFINISHED"),
        "states": states,
        "gpus": capacity_gpus,
        "load_factor": load_factor,
        "makespan_s": makespan,
        **_delay_stats(results),
        "gpu_utilization": utilization,
        "gpu_seconds_allocated": allocated_gpu_s,
        "gpu_seconds_served": math.fsum(r.gpu_seconds_served for r in results),
        "locality": locality,
        "preemptions": sum(r.preemptions for r in results),
        "retries": sum(r.retries for r in results),
        "per_queue": per_queue,
        "queue_by_size": {c: _mean(v) for c, v in by_size.items()},
        "jobs_by_size": {c: len(v) for c, v in by_size.items()},
        "locality_by_size": {c: _share_packed(by_class[c]) for c in LOCALITY_CLASSES},
        "queue_by_class": {c: _mean([r.queue_s for r in v]) for c, v in by_class.items()},
        "queue_p99_by_class": {c: percentile(sorted(r.queue_s for r in v), 99) for c, v in by_class.items()},
        "queue_ratio_by_class": _ratios({c: _mean([r.queue_s for r in v]) for c, v in by_class.items()}),
        "jobs_by_class": {c: len(v) for c, v in by_class.items()},
        "mean_slowdown": _weighted_slowdown(results),
        "mean_slowdown_multi_server": _weighted_slowdown([r for r in results if r.servers > 1]),
        "gpu_hours_lost_preemption": math.fsum(r.lost_preemption_gpu_s for r in results) / 3600.0,
        "gpu_hours_lost_failures": math.fsum(r.lost_failure_gpu_s for r in results) / 3600.0,
        "fairness": {**_fairness(below, makespan), **_guarantees(under, makespan)},
        "avg_jct_excess_s": _mean(excess),
        "p50_jct_excess_s": percentile(excess, 50),
        "p99_jct_excess_s": percentile(excess, 99),
        "percentiles": "nearest-rank",
        "wall_s": wall_s,
    }
    for key, value in (extra or {}).items():
        if key in summary:
            raise ValueError(f"summary: extra key {key!r} would replace a computed metric")
        summary[key] = value
    return summary


def _fairness(below: Mapping[str, float], makespan: float) -> dict[str, object]:
    """How long queues spent below their fair share while they wanted more: the worst queue and the mean over
    the queues that ever were (seconds, and as a share of the makespan)."""
    return _worst_and_mean(below, makespan, "worst_queue", "below_share")


def _guarantees(under: Mapping[str, float], makespan: float) -> dict[str, object]:
    """How long queues used less than min(their demand, their steady share): the same figures."""
    return _worst_and_mean(under, makespan, "worst_guarantee_queue", "below_guarantee")


def _worst_and_mean(seconds: Mapping[str, float], makespan: float, worst_key: str, what: str) -> dict[str, object]:
    """The queue with the most `seconds` (ties: the first by name), its seconds and share of the makespan, and the
    mean over the queues named, under the keys `worst_key`, max_`what`_s, max_`what`_fraction, mean_`what`_s."""
    if not seconds:
        return {worst_key: None, f"max_{what}_s": 0.0, f"mean_{what}_s": 0.0, f"max_{what}_fraction": 0.0}
    worst = max(sorted(seconds), key=lambda q: seconds[q])
    return {worst_key: worst, f"max_{what}_s": seconds[worst],
            f"mean_{what}_s": math.fsum(seconds.values()) / len(seconds),
            f"max_{what}_fraction": seconds[worst] / makespan if makespan > 0 else 0.0}


def _json_safe(value: object) -> object:
    # JSON has no Infinity or NaN; a reader should see null rather than choke on a non-standard token.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_summary(out: Path, summary: Mapping[str, object]) -> None:
    """`out/summary.json`: sorted keys, indent 2, non-finite numbers as null."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_json_safe(summary), sort_keys=True, indent=2, allow_nan=False)
    (out / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")


_JOB_COLUMNS = [f.name for f in fields(JobResult)]
_DERIVED_COLUMNS = ["queue_s", "jct_s"]
_RUNTIME_COLUMNS = ("sensitivity", "run_s", "slowdown", "lost_preemption_gpu_s", "lost_failure_gpu_s")


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same float
    return str(value)


def write_jobs_csv(out: Path, results: Iterable[JobResult]) -> None:
    """`out/jobs.csv`: one row per job (every JobResult field, then queue_s and jct_s); empty cell = none."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / JOBS_FILE).open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_JOB_COLUMNS + _DERIVED_COLUMNS)
        for r in results:
            writer.writerow([_cell(getattr(r, c)) for c in _JOB_COLUMNS] + [_cell(r.queue_s), _cell(r.jct_s)])


def read_jobs_csv(path: Path) -> list[JobResult]:
    """JobResults back from a jobs.csv written by `write_jobs_csv` (to compare runs)."""
    results: list[JobResult] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _JOB_COLUMNS if c not in (reader.fieldnames or []) and c not in _RUNTIME_COLUMNS]
        if missing:
            raise ValueError(f"{path}:1: header: missing column(s) {', '.join(missing)}")
        for row in reader:
            cell = _CellReader(path, reader.line_num, row)
            results.append(JobResult(
                job_id=row["job_id"], queue=row["queue"], gpus=cell.count("gpus"), submit_s=cell.number("submit_s"),
                start_s=cell.optional("start_s"), finish_s=cell.optional("finish_s"),
                duration_s=cell.number("duration_s"), attempts=cell.count("attempts"),
                preemptions=cell.count("preemptions"), retries=cell.count("retries"), servers=cell.count("servers"),
                fewest_servers=cell.count("fewest_servers"), gpu_seconds_served=cell.number("gpu_seconds_served"),
                state=row["state"], **cell.optional_fields(),
            ))
    return results


@dataclass
class _CellReader:
    """Typed cells of one jobs.csv row; a bad cell is a ValueError naming the file, line and column."""

    path: Path
    line: int
    row: Mapping[str, str]

    def _bad(self, column: str, expected: str) -> ValueError:
        return ValueError(f"{self.path}:{self.line}: {column}: expected {expected}, got {self.row[column]!r}")

    def number(self, column: str) -> float:
        try:
            return float(self.row[column])
        except ValueError:
            raise self._bad(column, "a number") from None

    def optional(self, column: str) -> float | None:
        return self.number(column) if self.row[column] else None

    def optional_fields(self) -> dict[str, float]:
        """The run-time model's columns, where the file has them (files written before them keep defaults)."""
        return {c: self.number(c) for c in _RUNTIME_COLUMNS if self.row.get(c)}

    def count(self, column: str) -> int:
        try:
            return int(self.row[column])
        except ValueError:
            raise self._bad(column, "a whole number") from None


def write_queue_timeline_csv(out: Path, timeline: Timeline) -> None:
    """`out/queue_timeline.csv`: time_s, allocated, then one column of allocated GPUs per queue."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(timeline.per_queue)
    with (out / QUEUE_TIMELINE_FILE).open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time_s", "allocated", *names])
        columns = [timeline.per_queue[n] for n in names]
        for i, t in enumerate(timeline.times):
            writer.writerow([_cell(t), timeline.allocated[i], *(c[i] for c in columns)])
