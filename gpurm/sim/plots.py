"""PNG plots of a simulated run: JCT CDFs, queueing delay by job size, utilization and queue shares over time.

matplotlib is imported inside `write_plots` only, so `gpurm sim` without plots (and every import of the sim
package) does not pay for it. Figures are drawn with matplotlib's object API on the Agg canvas, never through
pyplot: no display is needed and no process-wide figure registry or backend switch is touched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpurm.sim.metrics import LOCALITY_CLASSES, SIZE_CLASSES, JobResult, Timeline, locality_class, queue_key, size_class

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

MAX_POINTS = 5000  # a 14-day replay has far more allocation changes than a figure has pixels
TOP_QUEUES_CDF = 5
TOP_QUEUES_SHARES = 8
PLOT_FILES = ("jct_cdf.png", "queue_delay_by_size.png", "utilization.png", "queue_shares.png", "locality.png")
SLOWDOWN_FILE = "slowdown_cdf.png"   # only under the `placement` run-time model (under `ideal` every job runs at 1)


def write_plots(out: Path, results: list[JobResult], timeline: Timeline, capacity_gpus: int,
                placement: bool = False) -> list[Path]:
    """Write PLOT_FILES into `out`, and SLOWDOWN_FILE when the run used the `placement` run-time model."""
    out.mkdir(parents=True, exist_ok=True)
    end = _end_time(results, timeline)
    names = [*PLOT_FILES, *([SLOWDOWN_FILE] if placement else [])]
    figures = [_figure() for _ in names]
    _jct_cdf(figures[0], results)
    _delay_by_size(figures[1], results)
    _utilization(figures[2], timeline, capacity_gpus, end)
    _queue_shares(figures[3], timeline, end)
    _locality(figures[4], results)
    if placement:
        _slowdown_cdf(figures[5], results)
    written = []
    for name, fig in zip(names, figures, strict=True):
        path = out / name
        fig.savefig(path, dpi=100)
        written.append(path)
    log.info("wrote %d plots to %s", len(written), out)
    return written


def _figure() -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(9, 5.5), layout="constrained")


def _end_time(results: Sequence[JobResult], timeline: Timeline) -> float:
    finishes = [r.finish_s for r in results if r.finish_s is not None]
    return max([*finishes, *timeline.times[-1:], 0.0])


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="gray")


# ----------------------------------------------------------------------------------------------------- JCT


def _jct_cdf(fig: Figure, results: Sequence[JobResult]) -> None:
    import numpy as np

    ax = fig.subplots()
    ax.set_title("Job completion time (CDF over finished jobs)")
    ax.set_xlabel("JCT (s, log scale)")
    ax.set_ylabel("fraction of jobs")
    done = [r for r in results if r.jct_s is not None]
    if not done:
        _no_data(ax, "finished jobs")
        return

    def cdf(values: list[float], label: str, color: str | None = None, linewidth: float = 1.0) -> None:
        # JCTs are > 0 for real jobs; the floor keeps a degenerate 0 on a log axis.
        x = np.sort(np.maximum(np.asarray(values, dtype=float), 1e-3))
        y = np.arange(1, len(x) + 1) / len(x)
        n = len(x)
        if n > MAX_POINTS:  # evenly spaced ranks: the curve is unchanged at screen resolution
            keep = np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(int))
            x, y = x[keep], y[keep]
        ax.step(x, y, where="post", label=f"{label} (n={n})", color=color, linewidth=linewidth)

    cdf([r.jct_s for r in done if r.jct_s is not None], "all jobs", color="black", linewidth=2)
    per_queue: dict[str, list[float]] = {}
    for r in done:
        if r.jct_s is not None:
            per_queue.setdefault(queue_key(r.queue), []).append(r.jct_s)
    biggest = sorted(per_queue, key=lambda q: (-len(per_queue[q]), q))[:TOP_QUEUES_CDF]
    if len(per_queue) > 1:
        for q in biggest:
            cdf(per_queue[q], f"queue {q}")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")


# ----------------------------------------------------------------------------------------- delay by size


def _delay_by_size(fig: Figure, results: Sequence[JobResult]) -> None:
    ax = fig.subplots()
    ax.set_title("Average queueing delay by job size (finished jobs)")
    ax.set_xlabel("GPUs per job")
    waits: dict[str, list[float]] = {c: [] for c in SIZE_CLASSES}
    for r in results:
        if r.finish_s is not None:
            waits[size_class(r.gpus)].append(r.queue_s)
    means = [math.fsum(v) / len(v) if v else 0.0 for v in waits.values()]
    unit, scale = _time_unit(max(means, default=0.0))
    ax.set_ylabel(f"average queueing delay ({unit})")
    bars = ax.bar(list(SIZE_CLASSES), [m / scale for m in means], color="tab:blue")
    for bar, values in zip(bars, waits.values(), strict=True):
        ax.annotate(f"n={len(values)}" if values else "no jobs", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize="small", xytext=(0, 2), textcoords="offset points")
    ax.grid(True, axis="y", alpha=0.3)


def _locality(fig: Figure, results: Sequence[JobResult]) -> None:
    """Share of finished multi-GPU jobs on the fewest servers, and their average queueing delay, by size."""
    left, right = fig.subplots(1, 2)
    left.set_title("Placed on the fewest servers")
    left.set_xlabel("GPUs per job")
    left.set_ylabel("share of finished jobs")
    right.set_title("Average queueing delay")
    right.set_xlabel("GPUs per job")
    groups: dict[str, list[JobResult]] = {c: [] for c in LOCALITY_CLASSES}
    for r in results:
        if r.finish_s is not None and r.servers > 0 and r.gpus > 1:
            groups[locality_class(r.gpus)].append(r)
    shares = [sum(1 for r in v if r.servers <= r.fewest_servers) / len(v) if v else 0.0 for v in groups.values()]
    bars = left.bar(list(LOCALITY_CLASSES), shares, color="tab:green")
    for bar, v in zip(bars, groups.values(), strict=True):
        left.annotate(f"n={len(v)}" if v else "no jobs", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize="small", xytext=(0, 2), textcoords="offset points")
    left.set_ylim(0, 1.1)
    means = [math.fsum(r.queue_s for r in v) / len(v) if v else 0.0 for v in groups.values()]
    unit, scale = _time_unit(max(means, default=0.0))
    right.set_ylabel(f"average queueing delay ({unit})")
    right.bar(list(LOCALITY_CLASSES), [m / scale for m in means], color="tab:blue")
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)


def _slowdown_cdf(fig: Figure, results: Sequence[JobResult]) -> None:
    """Per-job placement slowdown (run time-weighted mean of 1 / rate), CDF by size class."""
    import numpy as np

    ax = fig.subplots()
    ax.set_title("Placement slowdown per job (CDF; 1 = full speed)")
    ax.set_xlabel("slowdown (mean of 1 / rate over the job's run time)")
    ax.set_ylabel("fraction of jobs")
    groups: dict[str, list[float]] = {}
    for r in results:
        if r.run_s > 0 and r.gpus > 1:
            groups.setdefault(locality_class(r.gpus), []).append(r.slowdown)
    if not groups:
        _no_data(ax, "multi-GPU jobs that ran")
        return
    for c in LOCALITY_CLASSES:
        if c in groups:
            x = np.sort(np.asarray(groups[c], dtype=float))
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(x, y, where="post", label=f"{c} GPUs (n={len(x)})")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")


def _time_unit(seconds: float) -> tuple[str, float]:
    if seconds >= 2 * 3600:
        return "h", 3600.0
    if seconds >= 120:
        return "min", 60.0
    return "s", 1.0


# ------------------------------------------------------------------------------------------- timelines


def _resample(times: Sequence[float], series: Sequence[Sequence[float]], end: float,
              max_points: int = MAX_POINTS) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step-function series on at most `max_points` steps: (x, ys) to draw with steps-post.

    Short timelines come back exact; long ones as the time-weighted mean over equal bins, which keeps the area
    (GPU-time) of every series, so the picture and summary.json's utilization agree.
    """
    import numpy as np

    t = np.asarray(times, dtype=float)
    end = max(end, float(t[-1]))
    if len(t) <= max_points:
        x = np.append(t, end)
        return x, [np.append(np.asarray(v, dtype=float), float(v[-1])) for v in series]
    edges = np.linspace(t[0], end, max_points + 1)
    k = np.searchsorted(t, edges, side="right") - 1
    ys = []
    for v in series:
        values = np.asarray(v, dtype=float)
        cumulative = np.concatenate(([0.0], np.cumsum(values[:-1] * np.diff(t))))
        area = cumulative[k] + values[k] * (edges - t[k])  # GPU-seconds from t[0] up to each edge
        mean = np.diff(area) / np.diff(edges)
        ys.append(np.append(mean, mean[-1]))
    return edges, ys


def _utilization(fig: Figure, timeline: Timeline, capacity_gpus: int, end: float) -> None:
    ax = fig.subplots()
    ax.set_title(f"GPU allocation over time ({capacity_gpus} GPUs)")
    ax.set_xlabel("time since the first submission (h)")
    ax.set_ylabel("allocated GPUs (% of capacity)")
    if not timeline.times or capacity_gpus <= 0:
        _no_data(ax, "allocations")
        return
    x, (allocated,) = _resample(timeline.times, [timeline.allocated], end)
    percent = 100.0 * allocated / capacity_gpus
    ax.plot(x / 3600.0, percent, drawstyle="steps-post", linewidth=0.8, color="tab:blue", label="allocated")
    span = float(x[-1] - x[0])
    if span > 0:
        mean = 100.0 * timeline.integral(float(x[0]), float(x[-1])) / (capacity_gpus * span)
        ax.axhline(mean, color="tab:red", linestyle="--", linewidth=1, label=f"mean {mean:.1f}%")
    ax.set_ylim(0, 105)
    ax.set_xlim(float(x[0]) / 3600.0, float(x[-1]) / 3600.0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")


def _queue_shares(fig: Figure, timeline: Timeline, end: float) -> None:
    import numpy as np

    ax = fig.subplots()
    ax.set_title("Share of allocated GPUs by queue")
    ax.set_xlabel("time since the first submission (h)")
    ax.set_ylabel("share of allocated GPUs (%)")
    if not timeline.times or not timeline.per_queue:
        _no_data(ax, "allocations")
        return
    names = sorted(timeline.per_queue)
    x, ys = _resample(timeline.times, [timeline.per_queue[q] for q in names], end)
    # Resampling keeps each queue's area, so the ranking by GPU-time can use the resampled series.
    widths = np.diff(x)
    area = {q: float(np.sum(y[:-1] * widths)) for q, y in zip(names, ys, strict=True)}
    by_name = dict(zip(names, ys, strict=True))
    ranked = sorted(names, key=lambda q: (-area[q], q))
    shown, rest = ranked[:TOP_QUEUES_SHARES], ranked[TOP_QUEUES_SHARES:]
    labels = [queue_key(q) for q in shown]
    ys = [by_name[q] for q in shown]
    if rest:
        ys.append(np.sum([by_name[q] for q in rest], axis=0))
        labels.append(f"other ({len(rest)} queues)")
    total = np.sum(ys, axis=0)
    safe = np.where(total > 0, total, 1.0)  # nothing allocated: every share is 0, not NaN
    shares = [100.0 * y / safe for y in ys]
    ax.stackplot(x / 3600.0, *shares, labels=labels, step="post")
    ax.set_ylim(0, 100)
    ax.set_xlim(float(x[0]) / 3600.0, float(x[-1]) / 3600.0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="queue")
