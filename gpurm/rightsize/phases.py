"""Phase discovery in a container's usage series, and the request each phase needs (AI4DL-style right-sizing).

A deep-learning container goes through phases (loading data, training, evaluating, checkpointing) whose CPU and
memory demands differ; several recur (train, evaluate, train, evaluate ...). Reserving the global peak for the
whole run wastes what the quieter phases leave idle; reserving per phase at mean + 2 standard deviations of its
demand covers about 97.7% of its samples (when they are normal) at far less.

How phases are found (`discover`), chosen to be predictable and hard to fool by noise:

1. Features: (CPU cores, resident MiB, GPU util %) per sample; for clustering only, each is smoothed with a
   running median of 3 (one stray sample is not a phase) and divided by its scale: the spread of the series
   (95th minus 5th percentile) but never less than a resolution below which differences do not matter for a
   reservation (`Resolution`: 0.25 cores, 64 MiB, 10 %), so a flat series' noise is never blown up to unit size.
2. Phase *types*, not just segments: k-means (Lloyd, deterministic farthest-point start, at most 50 rounds) on
   the smoothed, scaled points for k = 1 .. `max_phases`. A k is a candidate only when every cluster has `min_run`
   samples and every pair of cluster centres differs by the resolution in some feature; among the candidates the
   one with the lowest BIC wins (a hard-assigned mixture of axis-aligned normals, mixing weights included, each
   sigma at least a quarter of the resolution), charged 3 log(n) per parameter (three times BIC's: neighbouring
   smoothed samples are correlated, so they are worth less than independent ones). Splitting one noisy level
   (its halves, or its extremes against the rest) never pays for itself, since what the halves gain in spread
   they lose in mixing weight, while two real levels gain far more than the charge (a sweep of 120 noisy flat
   series, normal, uniform and Laplace noise, 10 to 2000 samples: no spurious phase). k = 1 is always a candidate, so a
   constant or merely noisy series is one phase.
3. Segments: the per-sample labels as runs; a run shorter than `min_run` samples (a blip between two runs of one
   phase, or the edge of a transition) joins the neighbouring run whose centre is nearest, and equal neighbours
   merge. Phase types are numbered by first appearance (phase 1 is where the job starts). A steady ramp (memory
   filling while data loads) reads as a staircase of a few phases, each provisioned at its own level, which is
   what a per-phase reservation wants.
4. Per phase type, over its raw (unsmoothed) samples: mean and population standard deviation of CPU and memory;
   its provision is mean + 2 sigma. The recommended request is the largest provision over the phases (CPU and
   memory separately), never below the given minimum.

Pure: no clock, no I/O. A few thousand samples (the agent keeps at most 2880) take well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpurm.rightsize.series import Sample

SIGMAS = 2.0                   # provision = mean + SIGMAS * std
MAX_ROUNDS = 50
BIC_PENALTY = 3.0              # x BIC's log(n) per parameter: smoothed samples are correlated, so count less


@dataclass(frozen=True)
class Resolution:
    """Differences smaller than these never make two phases."""
    cpu: float = 0.25          # cores
    mem_mib: float = 64.0
    gpu: float = 10.0          # utilisation points


@dataclass(frozen=True)
class PhaseStats:
    phase: int                 # 1-based, by first appearance
    samples: int
    runs: int                  # how many segments of this type
    cpu_mean: float
    cpu_std: float
    mem_mean: float
    mem_std: float
    gpu_mean: float | None

    @property
    def cpu_provision(self) -> float:
        return self.cpu_mean + SIGMAS * self.cpu_std

    @property
    def mem_provision(self) -> float:
        return self.mem_mean + SIGMAS * self.mem_std


@dataclass(frozen=True)
class Segment:
    phase: int
    start: int                 # sample indices, end exclusive
    end: int
    t_start: float
    t_end: float               # time of the segment's last sample


@dataclass(frozen=True)
class Recommendation:
    cpu: float                 # cores
    mem_mib: float


@dataclass(frozen=True)
class PhaseModel:
    phases: tuple[PhaseStats, ...]
    segments: tuple[Segment, ...]
    labels: tuple[int, ...]    # the phase of each sample

    def recommend(self, min_cpu: float = 0.0, min_mem_mib: float = 0.0) -> Recommendation:
        cpu = max((p.cpu_provision for p in self.phases), default=0.0)
        mem = max((p.mem_provision for p in self.phases), default=0.0)
        return Recommendation(cpu=max(cpu, min_cpu), mem_mib=max(mem, min_mem_mib))

    def phase(self, number: int) -> PhaseStats:
        return self.phases[number - 1]

    def summary(self, min_cpu: float = 0.0, min_mem_mib: float = 0.0) -> str:
        """One line, at most about 200 characters: `3 phases (0.3 cores/150 MiB x3, 0.6/319 MiB x3, 0.7/481 MiB x2);
        request 0.7 cores, 481 MiB` (each phase's mean + 2 sigma, and how many times it ran)."""
        if not self.phases:
            return ""
        parts = [f"{p.cpu_provision:.1f}{' cores' if i == 0 else ''}/{mib(p.mem_provision)} x{p.runs}"
                 for i, p in enumerate(self.phases)]
        rec = self.recommend(min_cpu, min_mem_mib)
        n = len(self.phases)
        return (f"{n} phase{'s' if n != 1 else ''} ({', '.join(parts)}); request {rec.cpu:.1f} cores, "
                f"{mib(rec.mem_mib)}")


def mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


Vector = tuple[float, float, float]


def _median3(values: Sequence[float]) -> list[float]:
    """Running median of 3; each end takes the median of the three samples at that end, so a stray first or last
    sample is smoothed away like one inside (left as it was, it made a cluster of its own, too small to be a phase,
    and with it every split was refused)."""
    n = len(values)
    if n < 3:
        return list(values)
    out = [sorted(values[:3])[1]]
    out.extend(sorted(values[i - 1:i + 2])[1] for i in range(1, n - 1))
    out.append(sorted(values[-3:])[1])
    return out


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _features(samples: Sequence[Sample]) -> tuple[list[list[float]], list[float]]:
    """Raw feature columns (cpu, mem, gpu; a missing GPU reading takes the previous one; those before the first
    reading take the first, as the agent samples a container before the GPU telemetry has seen it; none at all: 0)."""
    gpu: list[float] = []
    last = next((s.gpu for s in samples if s.gpu is not None), 0.0)
    for s in samples:
        last = s.gpu if s.gpu is not None else last
        gpu.append(last)
    cols = [[s.cpu for s in samples], [s.mem_mib for s in samples], gpu]
    return cols, gpu


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def _dist2(a: Vector, b: Vector) -> float:
    return (a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2 + (a[2] - b[2]) ** 2


def _kmeans(points: Sequence[Vector], k: int) -> tuple[list[int], list[Vector]]:
    """Lloyd's algorithm from a deterministic farthest-point start (first centre: the point nearest the mean)."""
    n = len(points)
    mean: Vector = (sum(p[0] for p in points) / n, sum(p[1] for p in points) / n, sum(p[2] for p in points) / n)
    centres = [min(points, key=lambda p: _dist2(p, mean))]
    nearest = [_dist2(p, centres[0]) for p in points]
    while len(centres) < k:
        far = max(range(n), key=lambda i: nearest[i])
        centres.append(points[far])
        nearest = [min(d, _dist2(p, centres[-1])) for d, p in zip(nearest, points, strict=True)]
    labels = [0] * n
    for _ in range(MAX_ROUNDS):
        new = [min(range(k), key=lambda c: _dist2(p, centres[c])) for p in points]
        sums = [[0.0, 0.0, 0.0, 0] for _ in range(k)]
        for p, c in zip(points, new, strict=True):
            acc = sums[c]
            acc[0] += p[0]
            acc[1] += p[1]
            acc[2] += p[2]
            acc[3] += 1
        centres = [(a[0] / a[3], a[1] / a[3], a[2] / a[3]) if a[3] else centres[c] for c, a in enumerate(sums)]
        if new == labels:
            break
        labels = new
    return labels, centres


def _groups(labels: Sequence[int], k: int) -> list[list[int]]:
    groups: list[list[int]] = [[] for _ in range(k)]
    for i, c in enumerate(labels):
        groups[c].append(i)
    return groups


def _apart(cols: Sequence[Sequence[float]], groups: Sequence[Sequence[int]], floors: Sequence[float],
           min_size: int) -> bool:
    """Every cluster big enough, and every pair of centres apart by the resolution in some feature."""
    if any(len(g) < min_size for g in groups):
        return False
    means = [[sum(col[i] for i in g) / len(g) for col in cols] for g in groups]
    return all(any(abs(means[a][d] - means[b][d]) >= floors[d] for d in range(len(cols)))
               for a in range(len(groups)) for b in range(a + 1, len(groups)))


def _bic(cols: Sequence[Sequence[float]], groups: Sequence[Sequence[int]], floors: Sequence[float]) -> float:
    """BIC of a hard-assigned mixture of axis-aligned normals (lower is better); each sigma at least a quarter of
    the resolution, so an exactly flat feature neither wins nor loses anything."""
    n = sum(len(g) for g in groups)
    loglik = 0.0
    for g in groups:
        loglik += len(g) * math.log(len(g) / n)
        for col, floor in zip(cols, floors, strict=True):
            _, ml_sd = _mean_std([col[i] for i in g])
            sd = max(ml_sd, floor / 4)
            # the group's log N(x | mean, sd), summed: -n/2 log(2 pi sd^2) - n ml_sd^2 / (2 sd^2)
            loglik += -len(g) / 2 * math.log(2 * math.pi * sd * sd) - len(g) * ml_sd * ml_sd / (2 * sd * sd)
    params = len(groups) * 2 * len(cols) + len(groups) - 1
    return -2 * loglik + BIC_PENALTY * params * math.log(n)


def _runs(labels: Sequence[int]) -> list[list[int]]:
    """[label, start, end) runs."""
    out: list[list[int]] = []
    for i, c in enumerate(labels):
        if out and out[-1][0] == c:
            out[-1][2] = i + 1
        else:
            out.append([c, i, i + 1])
    return out


def _absorb_short_runs(labels: list[int], centres: Sequence[Vector], points: Sequence[Vector],
                       min_run: int) -> list[int]:
    while True:
        runs = _runs(labels)
        if len(runs) < 2:
            return labels
        short = [j for j, r in enumerate(runs) if r[2] - r[1] < min_run]
        if not short:
            return labels
        j = min(short, key=lambda j: (runs[j][2] - runs[j][1], j))
        _, start, end = runs[j]
        neighbours = [runs[x][0] for x in (j - 1, j + 1) if 0 <= x < len(runs)]
        mid = points[(start + end - 1) // 2]
        target = min(neighbours, key=lambda c: _dist2(mid, centres[c]))
        for i in range(start, end):
            labels[i] = target


def discover(samples: Sequence[Sample], *, max_phases: int = 4, min_run: int = 2,
             resolution: Resolution = Resolution()) -> PhaseModel:
    """The phases of a series (see the module docstring). An empty series has none."""
    if max_phases < 1 or min_run < 1:
        raise ValueError("max_phases and min_run must be at least 1")
    n = len(samples)
    if n == 0:
        return PhaseModel(phases=(), segments=(), labels=())
    raw, _ = _features(samples)
    smooth = [_median3(col) for col in raw]
    floors = (resolution.cpu, resolution.mem_mib, resolution.gpu)
    scales = []
    for col, floor in zip(smooth, floors, strict=True):
        ordered = sorted(col)
        scales.append(max(_percentile(ordered, 0.95) - _percentile(ordered, 0.05), floor))
    points: list[Vector] = [(smooth[0][i] / scales[0], smooth[1][i] / scales[1], smooth[2][i] / scales[2])
                            for i in range(n)]
    best_labels, best_centres = [0] * n, [points[0]]
    best_bic = _bic(smooth, [list(range(n))], floors)
    for k in range(2, min(max_phases, n // max(min_run, 1)) + 1):
        labels, centres = _kmeans(points, k)
        groups = _groups(labels, k)
        if not _apart(raw, groups, floors, min_run):
            continue
        bic = _bic(smooth, groups, floors)
        if bic < best_bic:
            best_labels, best_centres, best_bic = labels, centres, bic
    labels = _absorb_short_runs(list(best_labels), best_centres, points, min_run)
    # Number phase types by first appearance, dropping any that vanished.
    order: dict[int, int] = {}
    for c in labels:
        order.setdefault(c, len(order) + 1)
    final = tuple(order[c] for c in labels)
    runs = _runs(final)
    phases = []
    for number in range(1, len(order) + 1):
        idx = [i for i, c in enumerate(final) if c == number]
        cpu_m, cpu_s = _mean_std([samples[i].cpu for i in idx])
        mem_m, mem_s = _mean_std([samples[i].mem_mib for i in idx])
        gpus = [g for i in idx if (g := samples[i].gpu) is not None]
        phases.append(PhaseStats(phase=number, samples=len(idx), runs=sum(1 for r in runs if r[0] == number),
                                 cpu_mean=cpu_m, cpu_std=cpu_s, mem_mean=mem_m, mem_std=mem_s,
                                 gpu_mean=sum(gpus) / len(gpus) if gpus else None))
    segments = tuple(Segment(phase=c, start=s, end=e, t_start=samples[s].t, t_end=samples[e - 1].t)
                     for c, s, e in runs)
    return PhaseModel(phases=tuple(phases), segments=segments, labels=final)
