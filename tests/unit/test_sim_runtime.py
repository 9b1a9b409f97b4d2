"""The `placement` run-time model (sim/runtime.py): the pure rate and checkpoint arithmetic, then the engine on
tiny hand-made traces whose finish times are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpurm.common.jobspec import Locality
from gpurm.queues.tree import Policy
from gpurm.sim import metrics, runtime
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions, SimResult
from gpurm.sim.metrics import JobResult
from gpurm.sim.run import trace_tree
from gpurm.sim.runtime import RuntimeConfig, checkpointed, load_config, rate, sensitivity_of
from gpurm.sim.trace import Trace, TraceJob

PHILLY = 28.56 / 43.66       # a sensitive 16-GPU job on 8 servers vs 2 (Philly ATC'19)
CFG = RuntimeConfig()
HEAVY = RuntimeConfig(contention_per_job=1.0)     # one neighbour halves the rate: round numbers for the tests
LONG = Locality(timeout_s=1e7)

# ----------------------------------------------------------------------------------------- the pure model


def test_the_philly_calibration_point_holds_exactly() -> None:
    # 16 GPUs on 8-GPU servers: fewest 2. On 8 servers (one rack, no neighbours) it runs at 28.56/43.66.
    assert rate(CFG, 1.0, 8, 2, 1, 1, 0) == pytest.approx(PHILLY, rel=1e-12)
    assert rate(CFG, 1.0, 2, 2, 1, 1, 0) == 1.0


def test_spreading_costs_more_the_further_it_goes() -> None:
    rates = [rate(CFG, 1.0, s, 2, 1, 1, 0) for s in (2, 3, 4, 8, 16)]
    assert rates == sorted(rates, reverse=True) and rates[0] == 1.0 and rates[-1] < PHILLY


def test_insensitive_jobs_are_unaffected_by_spread_racks_and_neighbours() -> None:
    assert rate(CFG, 0.0, 16, 2, 4, 1, 5) == 1.0


def test_a_mildly_sensitive_job_is_slowed_less() -> None:
    assert PHILLY < rate(CFG, 0.2, 8, 2, 1, 1, 0) < 1.0


def test_extra_racks_cost_the_rack_factor_each() -> None:
    assert rate(CFG, 1.0, 2, 2, 3, 1, 0) == pytest.approx(0.9 ** 2)


def test_contention_divides_by_one_plus_the_neighbours() -> None:
    # Packed, but two other multi-server jobs share its busiest server: 1 / (1 + 1.0 x 2).
    assert rate(HEAVY, 1.0, 2, 2, 1, 1, 2) == pytest.approx(1 / 3)
    assert rate(HEAVY, 0.5, 2, 2, 1, 1, 1) == pytest.approx(1 / 1.5)
    # The default: a server's 7 other multi-server jobs slow a sensitive job 2.75-fold ("several-fold").
    assert 1 / rate(CFG, 1.0, 2, 2, 1, 1, 7) == pytest.approx(2.75)


def test_a_one_server_job_never_slows() -> None:
    assert rate(CFG, 1.0, 1, 1, 1, 1, 3) == 1.0


def test_checkpoint_arithmetic() -> None:
    assert checkpointed(4150, 1000) == 4000
    assert checkpointed(999, 1000) == 0
    assert checkpointed(2000, 1000) == 2000
    assert checkpointed(-60, 1000) == 0          # preempted while still restarting: nothing new saved


def test_sensitivity_from_the_job_then_the_model_name_then_the_mix() -> None:
    assert sensitivity_of("j", "vgg19", 0.3, CFG) == 0.3
    assert sensitivity_of("j", "VGG16", None, CFG) == 1.0
    assert sensitivity_of("j", "resnet50", None, CFG) == 0.2
    assert runtime.model_sensitivity("unknownnet") is None
    draws = [sensitivity_of(f"t{i}", "", None, CFG, seed=3) for i in range(2000)]
    assert set(draws) == {CFG.sensitive_value, CFG.insensitive_value}
    assert 0.45 < draws.count(1.0) / len(draws) < 0.55
    assert draws == [sensitivity_of(f"t{i}", "", None, CFG, seed=3) for i in range(2000)]   # deterministic
    none = RuntimeConfig(sensitive_share=0.0)
    assert all(sensitivity_of(f"t{i}", "", None, none) == 0.0 for i in range(100))


def test_config_from_yaml_and_bad_values_name_the_field(tmp_path: Path) -> None:
    good = tmp_path / "r.yaml"
    good.write_text("checkpoint_interval_s: 600\nrestart_cost_s: 30\n")
    cfg = load_config(good)
    assert cfg.checkpoint_interval_s == 600 and cfg.restart_cost_s == 30
    assert cfg.spread_exponent == pytest.approx(math.log(PHILLY) / math.log(0.25))
    for text, field in (("rack_factor: 0\n", "rack_factor"), ("restart_cost: 3\n", "restart_cost"),
                        ("checkpoint_interval_s: -1\n", "checkpoint_interval_s"),
                        ("sensitive_share: x\n", "sensitive_share")):
        good.write_text(text)
        with pytest.raises(ValueError, match=field):
            load_config(good)


# ----------------------------------------------------------------------------------------- the engine


def trace_of(*jobs: tuple[str, float, int, float, float]) -> Trace:
    return Trace([TraceJob(job_id, at, gpus, duration, "q", line=i + 1, sensitivity=s)
                  for i, (job_id, at, gpus, duration, s) in enumerate(jobs)], None, "test")


def simulate(trace: Trace, cluster: str, config: RuntimeConfig | None = CFG, **options: object) -> SimResult:
    return Engine(trace, parse_cluster(cluster), trace_tree(trace.queues()),
                  SimOptions(runtime=config, **options)).run()  # type: ignore[arg-type]


def by_id(result: SimResult) -> dict[str, JobResult]:
    return {r.job_id: r for r in result.results}


def run_time(r: JobResult) -> float:
    assert r.finish_s is not None and r.start_s is not None
    return r.finish_s - r.start_s


def spread_trace(sensitivity: float) -> Trace:
    # One rack of eight 8-GPU servers; eight 6-GPU blockers take one server each (a second could not fit beside
    # one), leaving 2 GPUs free on every server: G (16 GPUs) can only run spread over all 8.
    blockers = [(f"W{i}", 0.0, 6, 1e6, 1.0) for i in range(8)]
    return trace_of(*blockers, ("G", 1.0, 16, 1000.0, sensitivity))


def test_a_sensitive_16_gpu_job_spread_over_8_servers_runs_slower_by_the_philly_factor() -> None:
    jobs = by_id(simulate(spread_trace(1.0), "1x8x8", policy=Policy.FIFO))
    assert jobs["G"].servers == 8 and jobs["G"].fewest_servers == 2
    assert run_time(jobs["G"]) == pytest.approx(1000 / PHILLY)
    assert jobs["G"].slowdown == pytest.approx(1 / PHILLY)
    packed = by_id(simulate(trace_of(("G", 0.0, 16, 1000.0, 1.0)), "1x8x8", policy=Policy.FIFO))
    assert packed["G"].servers == 2 and run_time(packed["G"]) == pytest.approx(1000)


def test_an_insensitive_job_spread_runs_at_full_speed() -> None:
    jobs = by_id(simulate(spread_trace(0.0), "1x8x8", policy=Policy.FIFO))
    assert jobs["G"].servers == 8 and run_time(jobs["G"]) == pytest.approx(1000)


def test_the_ideal_model_ignores_the_spread() -> None:
    jobs = by_id(simulate(spread_trace(1.0), "1x8x8", config=None, policy=Policy.FIFO))
    assert jobs["G"].servers == 8 and run_time(jobs["G"]) == 1000 and jobs["G"].slowdown == 1.0


def test_jobs_sharing_a_server_slow_each_other_until_one_ends() -> None:
    # Three 8-GPU servers. A and B (12 GPUs each, both packed on their fewest 2 servers) share the middle one:
    # each runs at 1 / (1 + 1) with contention 1.0. B's 500 s of work end at 1000; A has done 500 of its 1000 by
    # then and runs the rest alone at full speed: it ends at 1500.
    result = simulate(trace_of(("A", 0.0, 12, 1000.0, 1.0), ("B", 0.0, 12, 500.0, 1.0)), "1x3x8", config=HEAVY,
                      policy=Policy.FIFO, locality=LONG)
    jobs = by_id(result)
    assert jobs["A"].servers == 2 == jobs["B"].servers
    assert jobs["B"].finish_s == pytest.approx(1000)
    assert jobs["A"].finish_s == pytest.approx(1500)
    assert jobs["A"].slowdown == pytest.approx((1000 * 2 + 500) / 1500)
    summary = metrics.summarize(result.results, result.timeline, 24, 0.0, 0.0)
    assert summary["mean_slowdown"] == pytest.approx((2500 + 2000) / (1500 + 1000))


def test_a_preempted_job_redoes_the_work_since_its_checkpoint_and_pays_the_restart() -> None:
    # test_sim_engine's LAS case with a price: A (10,000 s) is preempted at 4,150 for B (4,150..4,250). With a
    # checkpoint every 1,000 s it kept 4,000 s; it restarts at 4,250, spends 60 s restarting, and needs 6,000 s
    # more: it ends at 10,310 instead of 10,100. Lost: 150 s since the checkpoint + 60 s restart, on 1 GPU.
    cfg = RuntimeConfig(checkpoint_interval_s=1000, restart_cost_s=60)
    result = simulate(trace_of(("A", 0.0, 1, 10_000.0, 1.0), ("B", 4000.0, 1, 100.0, 1.0)), "1x1x1", config=cfg,
                      policy=Policy.LAS, locality=LONG)
    jobs = by_id(result)
    assert jobs["B"].start_s == 4150 and jobs["A"].preemptions == 1
    assert jobs["A"].finish_s == pytest.approx(10_310)
    assert jobs["A"].lost_preemption_gpu_s == pytest.approx(210)
    assert jobs["B"].lost_preemption_gpu_s == 0
    summary = metrics.summarize(result.results, result.timeline, 1, 0.0, 0.0)
    assert summary["gpu_hours_lost_preemption"] == pytest.approx(210 / 3600)
    assert summary["avg_jct_excess_s"] == pytest.approx((310 + 150) / 2)


def test_without_a_price_the_preempted_job_keeps_all_its_work() -> None:
    result = simulate(trace_of(("A", 0.0, 1, 10_000.0, 1.0), ("B", 4000.0, 1, 100.0, 1.0)), "1x1x1", config=None,
                      policy=Policy.LAS, locality=LONG)
    assert by_id(result)["A"].finish_s == pytest.approx(10_100)
    assert by_id(result)["A"].lost_preemption_gpu_s == 0


def test_a_failed_attempt_loses_work_since_its_checkpoint_too() -> None:
    # Failures at a rate that makes some likely in a 10-hour job; its lost time is charged to failures.
    cfg = RuntimeConfig(checkpoint_interval_s=600, restart_cost_s=30)
    jobs = by_id(simulate(trace_of(("A", 0.0, 1, 36_000.0, 0.0)), "1x8x1", config=cfg, policy=Policy.FIFO,
                          failures_per_1000_gpu_h=100.0, seed=1))
    a = jobs["A"]
    assert a.retries >= 1 and a.finish_s is not None
    assert a.lost_failure_gpu_s > 0 and a.lost_preemption_gpu_s == 0
    # Every second it held a GPU either made kept progress or was lost (it ran alone, never waiting).
    assert a.gpu_seconds_served == pytest.approx(36_000 + a.lost_failure_gpu_s)


# ----------------------------------------------------------------------------------------- metrics


def result(job_id: str, gpus: int, servers: int, fewest: int, queue_s: float, run_s: float = 0.0,
           slowdown: float = 1.0) -> JobResult:
    return JobResult(job_id, "q", gpus, 0.0, queue_s, queue_s + 100, 100.0, 1, 0, 0, servers, fewest, 100.0 * gpus,
                     "SUCCEEDED", run_s=run_s, slowdown=slowdown)


def test_locality_and_queueing_by_size_class() -> None:
    results = [result("a", 2, 1, 1, 10), result("b", 4, 2, 1, 30), result("c", 16, 2, 2, 50),
               result("d", 32, 5, 4, 70), result("e", 1, 1, 1, 0)]
    s = metrics.summarize(results, metrics.Timeline(), 64, 0.0, 0.0)
    assert s["locality_by_size"] == {"2-4": 0.5, "5-8": None, "9-16": 1.0, "17+": 0.0}
    assert s["queue_by_class"] == {"1": 0.0, "2-4": 20.0, "5-8": None, "9-16": 50.0, "17+": 70.0}
    assert s["avg_jct_excess_s"] == pytest.approx((10 + 30 + 50 + 70 + 0) / 5)


def test_mean_slowdown_is_weighted_by_run_time() -> None:
    results = [result("a", 2, 1, 1, 0, run_s=100, slowdown=1.0), result("b", 16, 8, 2, 0, run_s=300, slowdown=2.0)]
    s = metrics.summarize(results, metrics.Timeline(), 64, 0.0, 0.0)
    assert s["mean_slowdown"] == pytest.approx((100 + 600) / 400)
    assert s["mean_slowdown_multi_server"] == pytest.approx(2.0)


def test_jobs_csv_written_before_the_runtime_columns_still_reads(tmp_path: Path) -> None:
    metrics.write_jobs_csv(tmp_path, [result("a", 2, 1, 1, 0, run_s=5, slowdown=1.5)])
    assert metrics.read_jobs_csv(tmp_path / metrics.JOBS_FILE)[0].slowdown == 1.5
    lines = (tmp_path / metrics.JOBS_FILE).read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, c in enumerate(header) if c not in ("sensitivity", "run_s", "slowdown",
                                                         "lost_preemption_gpu_s", "lost_failure_gpu_s")]
    old = "\n".join(",".join(line.split(",")[i] for i in keep) for line in lines) + "\n"
    (tmp_path / "old.csv").write_text(old)
    assert metrics.read_jobs_csv(tmp_path / "old.csv")[0].slowdown == 1.0
