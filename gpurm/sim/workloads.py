"""Synthetic workloads for comparing gpurm's policies with published results.

`tiresias_style`: a workload shaped like the one Tiresias (Gu et al., NSDI'19) evaluated on its testbed of 15
servers x 4 GPUs (480 jobs). Its own 480-job trace is not public, so this builds one from published parts, every
choice fixed here and documented in docs/sim.md (none was tuned on the result):

- Arrivals: a Poisson process with a mean interval of 30 s, the mean interval of the sample trace that ships
  with Tiresias' simulator (`60_job.csv`: 60 jobs in 1,812 s).
- Sizes: that sample's mix, half 1-GPU jobs and a sixth each of 2, 4 and 8 GPUs.
- Durations: drawn from a source trace (the shared Philly jobs), each clipped to the source's 99th percentile so
  that one multi-week job cannot dominate a four-hour workload, then all scaled by one factor so that the offered
  load (GPU-seconds asked / GPU-seconds the cluster has over the arrival span) is `load` (default 1.0: a fully
  loaded cluster, where the scheduling policy decides the queueing), with a floor of `min_duration_s` (a
  learner's start-up).
- Models: drawn uniformly from the ten CNNs of the Tiresias sample (they set the run-time model's sensitivity).

Pure and seeded: the same parameters and source give the same jobs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpurm.sim.trace import DEFAULT_QUEUE, Trace, TraceJob

TIRESIAS_MODELS = ("alexnet", "googlenet", "inception3", "inception4", "resnet50", "resnet101", "resnet152",
                   "vgg11", "vgg16", "vgg19")
TIRESIAS_SIZES = ((1, 3), (2, 1), (4, 1), (8, 1))     # (GPUs, weight): the sample's 30 / 10 / 10 / 10 jobs


@dataclass(frozen=True)
class TiresiasStyle:
    jobs: int = 480
    servers: int = 15
    gpus_per_server: int = 4
    mean_interval_s: float = 30.0
    load: float = 1.0
    clip_quantile: float = 0.99
    min_duration_s: float = 60.0
    seed: int = 0

    @property
    def cluster(self) -> str:
        """The `--cluster` spec: one rack (the testbed's servers share a switch)."""
        return f"1x{self.servers}x{self.gpus_per_server}"

    def check(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs: must be at least 1, got {self.jobs}")
        if self.servers < 1 or self.gpus_per_server < 1:
            raise ValueError("servers and gpus_per_server: must be at least 1")
        if max(g for g, _ in TIRESIAS_SIZES) > self.servers * self.gpus_per_server:
            raise ValueError(f"servers x gpus_per_server: {self.cluster} has fewer GPUs than the largest job (8)")
        if not (self.mean_interval_s > 0 and self.load > 0 and self.min_duration_s > 0):
            raise ValueError("mean_interval_s, load and min_duration_s: must be positive")
        if not 0 < self.clip_quantile <= 1:
            raise ValueError(f"clip_quantile: must be in (0, 1], got {self.clip_quantile}")


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def tiresias_style(params: TiresiasStyle, source: Trace) -> Trace:
    """The workload described in the module docstring, with durations drawn from `source`'s jobs."""
    params.check()
    if not source.jobs:
        raise ValueError(f"{source.source}: the source trace has no jobs to draw durations from")
    rng = random.Random(params.seed)
    cap = quantile([j.duration_s for j in source.jobs], params.clip_quantile)
    sizes = [g for g, _ in TIRESIAS_SIZES]
    weights = [w for _, w in TIRESIAS_SIZES]
    at = 0.0
    drawn: list[tuple[float, int, float, str]] = []
    for i in range(params.jobs):
        if i:
            at += rng.expovariate(1.0 / params.mean_interval_s)
        gpus = rng.choices(sizes, weights)[0]
        raw = min(cap, rng.choice(source.jobs).duration_s)
        drawn.append((at, gpus, raw, rng.choice(TIRESIAS_MODELS)))
    span = max(at, params.mean_interval_s)
    capacity = span * params.servers * params.gpus_per_server
    scale = params.load * capacity / math.fsum(g * d for _, g, d, _ in drawn)
    jobs = [TraceJob(job_id=f"j{i:03d}", submit_s=round(at, 3), gpus=gpus,
                     duration_s=max(params.min_duration_s, round(raw * scale)), queue=DEFAULT_QUEUE,
                     name=model, line=i + 1)
            for i, (at, gpus, raw, model) in enumerate(drawn)]
    return Trace(jobs=jobs, start_epoch=None, source=f"tiresias-style(seed={params.seed}, load={params.load:g})",
                 fmt="tiresias")


def to_tiresias_csv(trace: Trace) -> str:
    """The trace in the Tiresias simulator's CSV (what `gpurm sim --format tiresias` reads)."""
    rows = ["job_id,num_gpu,submit_time,iterations,model_name,duration,interval"]
    jobs = trace.jobs
    for i, j in enumerate(jobs):
        interval = (jobs[i + 1].submit_s - j.submit_s) if i + 1 < len(jobs) else 0.0
        rows.append(f"{j.job_id},{j.gpus},{_num(j.submit_s)},0,{j.name},{_num(j.duration_s)},{_num(interval)}")
    return "\n".join(rows) + "\n"


def _num(x: float) -> str:
    """Seconds to the millisecond, without trailing zeros (`:g` would round 12345.678 to 12345.7)."""
    return f"{x:.3f}".rstrip("0").rstrip(".")
