"""Phase discovery (rightsize/phases.py) on synthetic series with known phases."""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter

import pytest

from gpurm.rightsize.phases import Resolution, discover
from gpurm.rightsize.series import Sample

# (name, cpu mean, cpu sd, mem mean, mem sd, gpu)
LOAD = ("load", 0.2, 0.05, 600.0, 15.0, 5.0)
TRAIN = ("train", 4.0, 0.2, 2000.0, 20.0, 90.0)
EVAL = ("eval", 1.0, 0.1, 2600.0, 20.0, 40.0)
CKPT = ("ckpt", 0.4, 0.05, 2000.0, 10.0, 0.0)


def series(plan: list[tuple[tuple[str, float, float, float, float, float], int]],
           seed: int = 1) -> tuple[list[Sample], list[str]]:
    rnd = random.Random(seed)
    out: list[Sample] = []
    truth: list[str] = []
    for (name, cm, cs, mm, ms, g), count in plan:
        for _ in range(count):
            out.append(Sample(t=15.0 * len(out), cpu=max(0.0, rnd.gauss(cm, cs)), mem_mib=max(0.0, rnd.gauss(mm, ms)),
                              gpu=g))
            truth.append(name)
    return out, truth


def agreement(labels: tuple[int, ...], truth: list[str]) -> float:
    """Share of samples whose phase is their true phase's majority label (a mapping true -> found)."""
    best = {name: Counter(lab for lab, t in zip(labels, truth, strict=True) if t == name).most_common(1)[0][0]
            for name in set(truth)}
    assert len(set(best.values())) == len(best), f"two true phases share one label: {best}"
    return sum(1 for lab, t in zip(labels, truth, strict=True) if best[t] == lab) / len(truth)


def test_known_phases_are_recovered_with_recurring_types() -> None:
    plan = [(LOAD, 20), (TRAIN, 60), (EVAL, 12), (CKPT, 6), (TRAIN, 60), (EVAL, 12), (CKPT, 6)]
    samples, truth = series(plan)
    model = discover(samples)
    assert len(model.phases) == 4
    assert agreement(model.labels, truth) >= 0.97
    assert [s.phase for s in model.segments] == [1, 2, 3, 4, 2, 3, 4]
    train = model.phase(2)
    assert train.runs == 2 and train.samples == pytest.approx(120, abs=3)
    assert train.cpu_mean == pytest.approx(4.0, abs=0.1)
    assert train.cpu_provision == pytest.approx(train.cpu_mean + 2 * train.cpu_std)
    assert train.mem_provision == pytest.approx(2000 + 2 * 20, abs=15)
    assert model.segments[0].t_start == 0.0 and model.segments[1].t_start == 15.0 * 20
    # The request: the largest per-phase provision, the phase with the most.
    rec = model.recommend()
    assert rec.mem_mib == pytest.approx(max(p.mem_provision for p in model.phases))
    assert rec.mem_mib == pytest.approx(2600 + 40, abs=20)          # evaluation's mean + 2 sigma
    assert rec.cpu == pytest.approx(4.0 + 0.4, abs=0.15)
    assert model.recommend(min_cpu=8, min_mem_mib=4096) == type(rec)(cpu=8, mem_mib=4096)


def test_a_constant_series_is_one_phase() -> None:
    samples = [Sample(t=15.0 * i, cpu=2.0, mem_mib=1000.0, gpu=80.0) for i in range(50)]
    model = discover(samples)
    assert len(model.phases) == 1 and len(model.segments) == 1
    assert model.phases[0].cpu_std == 0 and model.recommend().mem_mib == 1000.0


@pytest.mark.parametrize("seed", range(8))
def test_noise_makes_no_spurious_phases(seed: int) -> None:
    rnd = random.Random(seed)
    # Heavy noise on one level, plus a few lone spikes: still one phase.
    samples = [Sample(t=15.0 * i, cpu=max(0.0, rnd.gauss(2.0, 0.4)), mem_mib=rnd.gauss(3000, 150),
                      gpu=min(100.0, max(0.0, rnd.gauss(70, 8)))) for i in range(400)]
    for i in (50, 200, 333):
        samples[i] = Sample(t=samples[i].t, cpu=7.5, mem_mib=5000.0, gpu=100.0)
    model = discover(samples)
    assert len(model.phases) == 1, [(p.cpu_mean, p.mem_mean, p.samples) for p in model.phases]
    cpu = [s.cpu for s in samples]
    assert model.phases[0].cpu_provision == pytest.approx(statistics.fmean(cpu) + 2 * statistics.pstdev(cpu))


@pytest.mark.parametrize("seed", range(24))
def test_noise_of_any_shape_and_any_length_is_one_phase(seed: int) -> None:
    rnd = random.Random(seed)
    kind = seed % 3

    def noise(sd: float) -> float:
        if kind == 0:
            return rnd.gauss(0, sd)
        if kind == 1:
            return rnd.uniform(-1.7 * sd, 1.7 * sd)
        return rnd.expovariate(1 / sd) * rnd.choice((1, -1))    # Laplace: heavy tails

    n = (10, 20, 50, 100, 500, 2000)[seed % 6]
    samples = [Sample(15.0 * i, max(0.0, 2 + noise(0.5)), 3000 + noise(200), 70 + noise(10)) for i in range(n)]
    assert len(discover(samples).phases) == 1


def test_a_short_blip_inside_a_phase_is_absorbed() -> None:
    samples, _ = series([(TRAIN, 40), (LOAD, 1), (TRAIN, 40)])
    model = discover(samples)
    assert len(model.segments) == 1 and model.phases[0].samples == 81


def test_differences_below_the_resolution_are_one_phase() -> None:
    samples, _ = series([(("a", 1.0, 0.0, 1000.0, 0.0, 50.0), 30), (("b", 1.1, 0.0, 1030.0, 0.0, 55.0), 30)])
    assert len(discover(samples).phases) == 1
    assert len(discover(samples, resolution=Resolution(cpu=0.05, mem_mib=10, gpu=2)).phases) == 2


def test_no_gpu_readings_still_finds_the_cpu_and_memory_phases() -> None:
    samples, truth = series([(LOAD, 10), (TRAIN, 20), (LOAD, 10)])
    samples = [Sample(s.t, s.cpu, s.mem_mib, None) for s in samples]
    model = discover(samples)
    assert len(model.phases) == 2 and agreement(model.labels, truth) == 1.0
    assert model.phases[0].gpu_mean is None
    assert model.summary().startswith("2 phases (0.3 cores/6")
    assert model.summary().endswith("; request 4.4 cores, 2.0 GiB")


def test_a_first_sample_without_a_gpu_reading_does_not_hide_the_phases() -> None:
    """The agent samples a container before the GPU telemetry has seen it: its first sample has no GPU reading.
    Read as 0 (against 90 % after), that sample stood alone as the farthest point, every split had a cluster of
    one, and the whole run was one phase (a CI run of the right-sizing e2e test)."""
    samples, truth = series([(TRAIN, 30), (EVAL, 15), (LOAD, 15), (TRAIN, 30)])
    samples[0] = Sample(samples[0].t, samples[0].cpu, samples[0].mem_mib, None)
    model = discover(samples)
    assert len(model.phases) == 3 and agreement(model.labels, truth) >= 0.95


@pytest.mark.parametrize("where", [0, -1])
def test_one_stray_sample_at_either_end_is_smoothed_away(where: int) -> None:
    samples, truth = series([(LOAD, 15), (TRAIN, 30), (LOAD, 15)])
    s = samples[where]
    samples[where] = Sample(s.t, 40.0, s.mem_mib * 5, 0.0)      # a CPU meter's glitch, a bogus RSS, no GPU use
    model = discover(samples)
    assert len(model.phases) == 2 and agreement(model.labels, truth) >= 0.95


def test_edges_and_bad_arguments() -> None:
    assert discover([]).phases == ()
    assert len(discover([Sample(0, 1, 1, None)]).phases) == 1
    with pytest.raises(ValueError):
        discover([], max_phases=0)
    two, _ = series([(LOAD, 3), (TRAIN, 3)])
    assert len(discover(two).phases) == 2


def test_the_agents_longest_series_is_fast_enough() -> None:
    plan = [(LOAD, 200), (TRAIN, 800), (EVAL, 300), (CKPT, 100), (TRAIN, 800), (EVAL, 300), (CKPT, 100)]
    samples, _ = series(plan, seed=3)
    assert len(samples) <= 2880 * 1.0 + 20
    start = time.process_time()
    model = discover(samples)
    assert time.process_time() - start < 5.0     # generous: the agent runs it at most once a minute
    assert len(model.phases) == 4
