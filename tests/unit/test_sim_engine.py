"""The simulator on tiny traces whose job completion times are worked out by hand, plus determinism.

Timing rules used below (see sim/engine.py): an AM starts the instant its job arrives and plans at once; a grant
made in the same instant starts the learners at once; a job runs its trace duration; a preempted job keeps its
progress (it checkpoints). `LONG` locality timeouts keep a waiting AM at its first level, so it is woken exactly
when the GPUs it needs come free instead of at a random back-off.
"""

from __future__ import annotations

from typing import cast

import pytest

from gpurm.common.jobspec import Locality
from gpurm.queues.tree import Policy, PreemptionSettings, QueueDef, QueueTree
from gpurm.sim import metrics
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions, SimResult
from gpurm.sim.metrics import JobResult
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import Trace, TraceJob, load_trace
from tests.conftest import philly_data

LONG = Locality(timeout_s=1e7)


def trace_of(*jobs: tuple[str, float, int, float, str]) -> Trace:
    return Trace([TraceJob(job_id, at, gpus, duration, queue, line=i + 1)
                  for i, (job_id, at, gpus, duration, queue) in enumerate(jobs)], None, "test")


def simulate(trace: Trace, cluster: str, tree: QueueTree | None = None, **options: object) -> SimResult:
    tree = tree or trace_tree(trace.queues())
    return Engine(trace, parse_cluster(cluster), tree, SimOptions(**options)).run()  # type: ignore[arg-type]


def by_id(result: SimResult) -> dict[str, JobResult]:
    return {r.job_id: r for r in result.results}


def jct(r: JobResult) -> float:
    assert r.finish_s is not None, f"{r.job_id} did not finish"
    return r.finish_s - r.submit_s


def test_fifo_serves_in_submission_order() -> None:
    # One 4-GPU server. A holds it until 100; B (2 GPUs) and C (4 GPUs) wait. At 100 FIFO serves B first; C cannot
    # fit beside it and starts when B ends at 150.
    trace = trace_of(("A", 0, 4, 100, "q"), ("B", 10, 2, 50, "q"), ("C", 20, 4, 30, "q"))
    jobs = by_id(simulate(trace, "1x1x4", policy=Policy.FIFO, locality=LONG))
    assert [jobs[j].start_s for j in "ABC"] == [0, 100, 150]
    assert [jct(jobs[j]) for j in "ABC"] == [100, 140, 160]
    assert [jobs[j].queue_s for j in "ABC"] == [0, 90, 130]
    assert all(jobs[j].preemptions == 0 for j in "ABC")


def test_las_preempts_a_long_job_for_a_new_one() -> None:
    # One GPU. A (10,000 s) has attained 4,000 GPU-s when B arrives, so A is at LAS level 1 (past 3,600) and B, at
    # level 0, outranks it. The RM looks at in-queue ranks 150 s later (every half of the 300 s minimum run while
    # jobs wait) and preempts A (it has run more than those 300 s); A's AM stops its learner at once on the notice
    # (a simulated learner checkpoints instantly), so B runs 4150..4250. A resumes then with its 4,150 s of
    # progress kept: it needs 5,850 s more and ends at 10,100.
    trace = trace_of(("A", 0, 1, 10_000, "q"), ("B", 4000, 1, 100, "q"))
    jobs = by_id(simulate(trace, "1x1x1", policy=Policy.LAS, locality=LONG))
    assert jobs["B"].start_s == 4150
    assert jct(jobs["B"]) == 250
    assert jobs["A"].preemptions == 1 and jobs["B"].preemptions == 0
    assert jobs["A"].finish_s == pytest.approx(10_100)
    assert jobs["A"].retries == 0                  # a preemption is not a failure
    assert jobs["A"].gpu_seconds_served == pytest.approx(10_000)


def test_fifo_does_not_preempt_inside_a_queue() -> None:
    trace = trace_of(("A", 0, 1, 10_000, "q"), ("B", 4000, 1, 100, "q"))
    jobs = by_id(simulate(trace, "1x1x1", policy=Policy.FIFO, locality=LONG))
    assert jobs["A"].finish_s == 10_000 and jobs["A"].preemptions == 0
    assert jobs["B"].start_s == 10_000


def test_a_16_gpu_gang_waits_to_be_packed() -> None:
    # Two racks of two 8-GPU servers. W1 takes a server; W2 goes to the rack with more free servers, i.e. the
    # other rack. G (16 GPUs, packed = 2 servers in one rack) sees 16 free GPUs split over the racks and waits
    # rather than spread; when W2 ends at 100 its rack is free and G starts there.
    trace = trace_of(("W1", 0, 8, 1000, "q"), ("W2", 0, 8, 100, "q"), ("G", 1, 16, 50, "q"))
    result = simulate(trace, "2x2x8", policy=Policy.FIFO, locality=Locality(timeout_s=300))
    jobs = by_id(result)
    assert jobs["G"].start_s == 100
    assert jct(jobs["G"]) == 149
    assert jobs["G"].servers == 2 == jobs["G"].fewest_servers
    summary = metrics.summarize(result.results, result.timeline, 32, 0.0, 0.0)
    assert summary["locality"] == 1.0


def test_the_gang_relaxes_when_packing_takes_too_long() -> None:
    # The same, but W2 runs for 10,000 s: after its 60 s packed timeout and a back-off, G relaxes (rack is no
    # better) and finally takes any two servers, long before W2 ends.
    trace = trace_of(("W1", 0, 8, 100_000, "q"), ("W2", 0, 8, 10_000, "q"), ("G", 1, 16, 50, "q"))
    jobs = by_id(simulate(trace, "2x2x8", policy=Policy.FIFO))
    assert jobs["G"].start_s is not None and 61 <= jobs["G"].start_s < 1000
    assert jobs["G"].servers == 2


def two_queues(preemptible_a: bool = True) -> QueueTree:
    return QueueTree(QueueDef("root", "root", submit_acl=["*"], children=[
        QueueDef("a", "root.a", preemptible=preemptible_a), QueueDef("b", "root.b")]))


def test_an_oversubscribed_queue_gives_gpus_back() -> None:
    # 4 GPUs, queues a and b of weight 1. Queue a fills the idle cluster (A1, A2: 2 GPUs each). B1 arrives at
    # 100: b's fair share is now 2 and it holds 0 < 0.5 x 2, so after the 60 s fair-share timeout (160) a's newest
    # job A2 is preempted (its AM stops it at once on the notice, within the 15 s grace); B1 runs 160..210. A2
    # resumes at 210 with the 159 s it ran kept and ends 841 s later.
    trace = trace_of(("A1", 0, 2, 1000, "a"), ("A2", 1, 2, 1000, "a"), ("B1", 100, 2, 50, "b"))
    tree = two_queues()
    assert tree.by_path["root.a"].preemption == PreemptionSettings()     # the defaults the comment uses
    jobs = by_id(simulate(trace, "1x1x4", tree, policy=Policy.FIFO, locality=LONG))
    assert jobs["B1"].start_s == 160 and jct(jobs["B1"]) == 110
    assert jobs["A2"].preemptions == 1 and jobs["A1"].preemptions == 0
    assert jobs["A2"].finish_s == pytest.approx(210 + 841)
    assert jobs["A1"].finish_s == 1000


def test_a_non_preemptible_queue_keeps_its_gpus() -> None:
    trace = trace_of(("A1", 0, 2, 1000, "a"), ("A2", 1, 2, 1000, "a"), ("B1", 100, 2, 50, "b"))
    jobs = by_id(simulate(trace, "1x1x4", two_queues(preemptible_a=False), policy=Policy.FIFO, locality=LONG))
    assert jobs["A2"].preemptions == 0
    assert jobs["B1"].start_s == 1000


def small_philly(n: int) -> Trace:
    trace = load_trace(philly_data("jobs-2017-10-02_to_10-15.csv"), "philly-csv")
    return Trace(trace.jobs[:n], trace.start_epoch, trace.source, trace.fmt)


def stable(summary: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in summary.items() if k != "wall_s"}


@pytest.mark.parametrize("policy", [Policy.FIFO, Policy.LAS])
def test_same_inputs_and_seed_give_the_same_summary(policy: Policy) -> None:
    trace = small_philly(400)

    def once(seed: int) -> dict[str, object]:
        r = simulate(trace, "2x4x8", policy=policy, seed=seed, failures_per_1000_gpu_h=5.0)
        return stable(metrics.summarize(r.results, r.timeline, r.capacity, 0.0, r.wall_s))

    first = once(7)
    assert once(7) == first
    assert first["retries"] > 0                    # the failures were injected (and retried)
    assert once(8) != first                        # and the seed matters


def test_injected_failures_are_retried_and_count() -> None:
    trace = trace_of(*[(f"j{i}", i * 10.0, 8, 36_000.0, "q") for i in range(4)])
    result = simulate(trace, "1x4x8", policy=Policy.FIFO, failures_per_1000_gpu_h=50.0, seed=1)
    jobs = by_id(result)
    retried = [j for j in jobs.values() if j.retries]
    assert retried, "50 failures per 1000 GPU-hours over 32 GPU x 10 h must hit some job"
    for j in retried:
        assert j.attempts == j.retries + 1 + j.preemptions or j.state == "FAILED"


def test_jobs_the_queue_config_refuses_are_rejected_and_acls_are_not_checked() -> None:
    tree = QueueTree(QueueDef("root", "root", submit_acl=["alice"], children=[QueueDef("q", "root.q", max_gpus=2)]))
    trace = Trace([TraceJob("big", 0, 4, 10, "q", user="bob", line=1),
                   TraceJob("small", 0, 2, 10, "q", user="bob", line=2)], None, "test")
    result = simulate(trace, "1x1x8", tree, policy=Policy.FIFO)
    jobs = by_id(result)
    assert jobs["big"].state == "REJECTED" and jobs["big"].finish_s is None
    assert jobs["small"].state == "SUCCEEDED"             # bob is not in the ACL: the simulator ignores ACLs
    summary = metrics.summarize(result.results, result.timeline, 8, 0.0, 0.0)
    assert summary["states"]["REJECTED"] == 1 and summary["finished"] == 1


def test_fairness_counts_the_time_a_queue_waits_below_its_share() -> None:
    # One 4-GPU server, queues a and b of equal weight. A (queue a) takes all 4 GPUs until 100; B (queue b, 2 GPUs)
    # arrives at 10 and waits below its share of 2 until A ends (no preemption in this tree): 90 s. Queue a is
    # never below its share with demand.
    trace = trace_of(("A", 0, 4, 100, "a"), ("B", 10, 2, 50, "b"))
    res = simulate(trace, "1x1x4", policy=Policy.FIFO, locality=LONG)
    assert by_id(res)["B"].start_s == 100
    s = metrics.summarize(res.results, res.timeline, 4, 1.0, 0.0)
    per_queue = cast(dict[str, dict[str, object]], s["per_queue"])
    assert per_queue["b"]["below_share_s"] == 90.0
    assert per_queue["a"]["below_share_s"] == 0.0
    assert cast(dict[str, object], s["fairness"])["worst_queue"] == "b"
