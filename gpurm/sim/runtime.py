"""The simulator's run-time model (`gpurm sim --runtime-model placement|ideal`): how fast a job progresses where it
was placed, and what a preemption costs. Pure: no clock, every function takes what it needs.

`ideal` (the old behaviour): a job runs at full speed wherever it lands, and a preempted job keeps all its work
(instant checkpoints). `placement`: a job's rate depends on its placement and neighbours, and a preempted attempt
loses the work since its last checkpoint plus a restart cost. Every constant is in `RuntimeConfig`, with its
source; docs/sim.md ("Run-time model") says the same for people.

The rate of a job of G GPUs on S servers in K racks, with sensitivity s in [0, 1] (0: does not care where it runs,
1: as sensitive as VGG), when F = the fewest servers G GPUs can use in this cluster and FR = the fewest racks:

    spread     = (F / S) ** (spread_exponent * s)                      (1 when packed on F servers)
    racks      = rack_factor ** (s * (K - FR))                         (1 when in the fewest racks)
    contention = 1 / (1 + contention_per_job * s * N)                  (N: other multi-server jobs on its busiest
                                                                        server; 0 for a one-server job)
    rate       = spread * racks * contention

A job on one server talks over no network link, so it is never slowed (rate 1).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

import yaml

from gpurm.common.jobspec import LocalityMode

# Philly, ATC'19 (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads"),
# section 4.2 / Table 4 and its talk: a 16-GPU job reached 43.66% mean GPU utilisation on 2 servers and 28.56% on 8.
PHILLY_16GPU_2_SERVERS = 43.66
PHILLY_16GPU_8_SERVERS = 28.56


class RuntimeModel(Enum):
    IDEAL = "ideal"
    PLACEMENT = "placement"


def _calibrated_exponent() -> float:
    # A sensitive 16-GPU job spread from 2 to 8 servers (F/S = 1/4) runs at 28.56/43.66 of its packed speed:
    # (1/4) ** e = 28.56 / 43.66, so e = ln(28.56/43.66) / ln(1/4) = 0.3063.
    return math.log(PHILLY_16GPU_8_SERVERS / PHILLY_16GPU_2_SERVERS) / math.log(2 / 8)


@dataclass(frozen=True)
class RuntimeConfig:
    """Every constant of the `placement` model (loadable from YAML with `--runtime-config`; keys = field names)."""

    # Slowdown from spreading over more servers than needed (see the module docstring). Source: Philly ATC'19,
    # 16-GPU jobs at 43.66% utilisation on 2 servers and 28.56% on 8 (calibrated so that point holds exactly).
    spread_exponent: float = _calibrated_exponent()
    # Rate factor per rack beyond the fewest, for a fully sensitive job. Assumption (no published figure): crossing
    # the top-of-rack switch costs a further 10%; Philly's 8-server 16-GPU jobs are mostly within a rack.
    rack_factor: float = 0.9
    # Network contention: each other multi-server job sharing a server of this one adds this much to its run time
    # (for a fully sensitive job). Source: Philly ATC'19 reports jobs sharing servers' network links slowing each
    # other several-fold. 0.25: a server whose 8 GPUs all serve different multi-server jobs (7 neighbours) slows
    # a sensitive job 2.75-fold, one neighbour by a fifth. (1.0, one neighbour halving the rate, made the mean
    # slowdown of the Philly window 6-8x: more than the paper's utilisation figures allow.)
    contention_per_job: float = 0.25
    # Sensitivity of a job the trace gives no model name for: a deterministic mix, seeded by the job id. Source:
    # Tiresias (NSDI'19) finds consolidation matters for models with skewed tensor sizes (VGG, AlexNet) and hardly
    # for others; the share of sensitive jobs in Philly is not published, so half is an assumption.
    sensitive_share: float = 0.5
    sensitive_value: float = 1.0        # a sensitive job's s (VGG-like)
    insensitive_value: float = 0.0      # the others' s (ResNet-like jobs barely notice: Tiresias)
    # Preemption's price. A job checkpoints every checkpoint_interval_s of its attempt's productive time (30 min:
    # a common default for DL training jobs, e.g. Gandiva/Tiresias assume minutes to tens of minutes); a preempted
    # attempt loses the work since its last checkpoint, and an attempt after an interruption first spends
    # restart_cost_s (re-scheduling, container start, reloading the checkpoint: Tiresias measured tens of seconds)
    # producing nothing.
    checkpoint_interval_s: float = 1800.0
    restart_cost_s: float = 60.0
    # Elastic jobs (`--elastic-share`): throughput on n GPUs is n x elastic_efficiency ** log2(n / min), i.e. each
    # doubling of GPUs beyond the job's minimum multiplies its speed by 2 x elastic_efficiency. Assumption, in the
    # range published for data-parallel training: Optimus (EuroSys'18) and Pollux (OSDI'21) fit sub-linear curves
    # with 80-95% efficiency per doubling at these scales. A resize (a learner joining or leaving) restarts the
    # workers from a checkpoint taken at the resize (torchrun's elastic rendezvous): resize_cost_s produce nothing.
    elastic_efficiency: float = 0.9
    resize_cost_s: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"{f.name}: expected a finite number, got {value!r}")
        if self.spread_exponent < 0:
            raise ValueError(f"spread_exponent: must be at least 0, got {self.spread_exponent:g}")
        if not 0 < self.rack_factor <= 1:
            raise ValueError(f"rack_factor: must be in (0, 1], got {self.rack_factor:g}")
        if self.contention_per_job < 0:
            raise ValueError(f"contention_per_job: must be at least 0, got {self.contention_per_job:g}")
        if not 0 <= self.sensitive_share <= 1:
            raise ValueError(f"sensitive_share: must be in [0, 1], got {self.sensitive_share:g}")
        for name in ("sensitive_value", "insensitive_value"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name):g}")
        if self.checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint_interval_s: must be positive, got {self.checkpoint_interval_s:g}")
        if self.restart_cost_s < 0:
            raise ValueError(f"restart_cost_s: must be at least 0, got {self.restart_cost_s:g}")
        if not 0 < self.elastic_efficiency <= 1:
            raise ValueError(f"elastic_efficiency: must be in (0, 1], got {self.elastic_efficiency:g}")
        if self.resize_cost_s < 0:
            raise ValueError(f"resize_cost_s: must be at least 0, got {self.resize_cost_s:g}")


def load_config(path: Path) -> RuntimeConfig:
    """A RuntimeConfig from a YAML mapping of field names to numbers; missing fields keep their defaults.
    Raises ValueError naming the file and the field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    known = {f.name for f in fields(RuntimeConfig)}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ValueError(f"{path}: {unknown[0]}: unknown setting (known: {', '.join(sorted(known))})")
    try:
        return RuntimeConfig(**data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# Sensitivity by model name (Tiresias' trace names models). Source: Tiresias (NSDI'19) section 2.3 and Fig. 5:
# VGG and AlexNet (large, skewed tensors) slow down much when spread; ResNet, Inception and GoogLeNet hardly.
# Matched as a prefix of the lower-cased name, longest prefix first.
MODEL_SENSITIVITY: dict[str, float] = {
    "vgg": 1.0,
    "alexnet": 1.0,
    "lstm": 0.5,          # assumption: dense recurrent models sit between (large embedding / softmax tensors)
    "transformer": 0.5,
    "bert": 0.5,
    "resnet": 0.2,
    "inception": 0.2,
    "googlenet": 0.1,
}


def model_sensitivity(name: str) -> float | None:
    """The sensitivity of a known model name (None when the name is not in MODEL_SENSITIVITY)."""
    lowered = name.strip().lower()
    for prefix in sorted(MODEL_SENSITIVITY, key=len, reverse=True):
        if lowered.startswith(prefix):
            return MODEL_SENSITIVITY[prefix]
    return None


def sensitivity_of(job_id: str, name: str, given: float | None, config: RuntimeConfig, seed: int = 0,
                   mode: LocalityMode | None = None) -> float:
    """A job's sensitivity: the trace job's own value when it has one; else from its locality mode when the trace
    gives one (`strict`: the user says it crawls when spread, `sensitive_value`; `any`: it barely notices,
    `insensitive_value`; `prefer` says nothing either way); else its model name's; else a deterministic draw (by
    seed and job id) from the configured mix. The mode comes before the model name: it is the user's own word
    about this job, the name only a guess from others like it."""
    if given is not None:
        return given
    if mode is LocalityMode.STRICT:
        return config.sensitive_value
    if mode is LocalityMode.ANY:
        return config.insensitive_value
    known = model_sensitivity(name) if name else None
    if known is not None:
        return known
    draw = zlib.crc32(f"{seed}:{job_id}".encode()) / 2**32
    return config.sensitive_value if draw < config.sensitive_share else config.insensitive_value


def rate(config: RuntimeConfig, sensitivity: float, servers: int, fewest_servers: int, racks: int,
         fewest_racks: int, neighbours: int) -> float:
    """Progress per second (1 = full speed) of a job on `servers` servers in `racks` racks, when it could use
    `fewest_servers` / `fewest_racks`, sharing its busiest server with `neighbours` other multi-server jobs."""
    if servers <= 1:
        return 1.0
    s = sensitivity
    spread = (fewest_servers / servers) ** (config.spread_exponent * s) if servers > fewest_servers else 1.0
    rack = config.rack_factor ** (s * (racks - fewest_racks)) if racks > fewest_racks else 1.0
    contention = 1.0 / (1.0 + config.contention_per_job * s * neighbours)
    return spread * rack * contention


def elastic_speedup(config: RuntimeConfig, gpus: int, base: int) -> float:
    """How much faster an elastic job runs on `gpus` GPUs than on its minimum `base` (its trace duration's size):
    gpus / base x elastic_efficiency ** log2(gpus / base)."""
    if gpus <= base or base <= 0:
        return 1.0 if gpus >= base or base <= 0 else gpus / base
    ratio = gpus / base
    return float(ratio * config.elastic_efficiency ** math.log2(ratio))


def checkpointed(productive_s: float, interval_s: float) -> float:
    """The productive time (seconds of an attempt after its restart) saved at its last checkpoint."""
    if productive_s <= 0:
        return 0.0
    return math.floor(productive_s / interval_s) * interval_s


__all__ = ["MODEL_SENSITIVITY", "RuntimeConfig", "RuntimeModel", "checkpointed", "elastic_speedup", "load_config",
           "model_sensitivity", "rate", "sensitivity_of"]
