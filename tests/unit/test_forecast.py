"""Start-time forecasts (rm/forecast/): the pure forecaster on snapshots worked out by hand, the snapshot taken
from a real RMCore (the one `take` the daemon and the simulator share), and what crosses the worker's process
boundary. No sockets, no sleeps: every clock is a number passed in."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from gpurm.common.gpus import GpuRecord
from gpurm.common.jobspec import JobSpec
from gpurm.queues.tree import Policy, QueueDef, QueueTree
from gpurm.rm.forecast.baseline import baseline_wait_s, mean_run_s
from gpurm.rm.forecast.records import Forecast, ForecastSettings
from gpurm.rm.forecast.replay import forecast
from gpurm.rm.forecast.snapshot import (
    HistoryCache,
    SnapJob,
    SnapNode,
    SnapSettings,
    Snapshot,
    export_history,
    take,
    tree_from_plain,
    tree_to_plain,
)
from gpurm.rm.forecast.worker import run_round
from gpurm.rm.sched.history import Finished, History
from gpurm.rm.state.core import RMCore
from gpurm.rm.state.messages import NodeRegistration, RMSettings

NOW = 1_000_000.0


def learned(durations: dict[int, float], n: int = 60) -> tuple[tuple[tuple[str, ...], tuple[float, ...],
                                                                  tuple[float, ...]], ...]:
    """A history where every job of G GPUs ran exactly durations[G] seconds (n of each)."""
    h = History()
    for gpus, d in durations.items():
        for i in range(n):
            h.finished(Finished("root.q", f"u{i % 3}", "train", float(gpus), d * gpus))
    return export_history(h)


def two_queues() -> QueueTree:
    root = QueueDef("root", "root", submit_acl=["*"], children=[QueueDef("q", "root.q"), QueueDef("r", "root.r")])
    return QueueTree(root)


def snapshot(jobs: list[SnapJob], nodes: int = 1, gpus: int = 4, history: dict[int, float] | None = None,
             policy: str | None = None) -> Snapshot:
    return Snapshot(NOW, tuple(SnapNode(f"n{i}", "r0", gpus) for i in range(nodes)), tuple(jobs),
                    tree_to_plain(two_queues()), SnapSettings(policy_override=policy),
                    learned(history or {4: 1000.0, 1: 1000.0}))


# Locality timeouts so long that an AM waits at its first level, woken exactly when GPUs free (a job's own settings
# travel in the snapshot; with the defaults an AM waiting over 60 s backs off, and may start a jittered while later).
LONG = (1e7, 10.0, 600.0, 1, "prefer")


def running(job_id: str, seq: int, gpus: int, ran_s: float, queue: str = "root.q") -> SnapJob:
    return SnapJob(job_id, queue, "u0", "train", gpus, 0, seq, NOW - ran_s, True, ran_s, ran_s * gpus, locality=LONG)


def queued(job_id: str, seq: int, gpus: int, queue: str = "root.q") -> SnapJob:
    return SnapJob(job_id, queue, "u0", "train", gpus, 0, seq, NOW, False, 0.0, 0.0, locality=LONG)


def test_a_queued_job_starts_when_the_running_one_is_expected_to_end() -> None:
    # One 4-GPU server; R has run 400 s of the 1,000 s its group always runs: 600 s are left, at every quantile.
    snap = snapshot([running("R", 1, 4, 400.0), queued("Q", 2, 4)])
    got, stats = forecast(snap, ForecastSettings(widen=0.0))
    f = got["Q"]
    assert (f.made_at, f.earliest, f.likely, f.latest) == (NOW, NOW + 600.0, NOW + 600.0, NOW + 600.0)
    assert stats.events > 0 and not stats.capped
    assert "R" not in got                  # running jobs get no forecast


def test_the_queue_order_is_kept_and_a_later_job_waits_for_the_earlier_ones() -> None:
    snap = snapshot([running("R", 1, 4, 400.0), queued("A", 2, 4), queued("B", 3, 4)])
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    assert got["A"].likely == NOW + 600.0
    assert got["B"].likely == NOW + 1600.0           # after A's whole 1,000 s


def test_running_jobs_stay_on_their_servers() -> None:
    # Two 2-GPU jobs, one on each server: no server has 4 free, so Q (4 GPUs, one server) waits for the first end.
    # (Placed anew they would share one server and leave the other free for Q at once.)
    r1 = dataclasses.replace(running("R1", 1, 2, 400.0), servers=("n1",))
    r2 = dataclasses.replace(running("R2", 2, 2, 0.0), servers=("n0",))
    snap = snapshot([r1, r2, queued("Q", 3, 4)], nodes=2)
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    assert got["Q"].likely == NOW + 600.0
    unpinned = snapshot([dataclasses.replace(r1, servers=()), dataclasses.replace(r2, servers=()),
                         queued("Q", 3, 4)], nodes=2)
    assert forecast(unpinned, ForecastSettings(widen=0.0))[0]["Q"].likely == NOW


def test_a_job_that_fits_now_starts_now() -> None:
    snap = snapshot([running("R", 1, 2, 100.0), queued("Q", 2, 2)])
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    assert got["Q"].earliest == got["Q"].likely == NOW


def test_the_range_comes_from_the_quantiles_and_the_widening() -> None:
    # Half the 4-GPU jobs ran 100 s, half 1,900 s: the mean of what is left of a fresh job is 1,000 s, its 10th
    # percentile 100 s, its 90th 1,900 s.
    h = History()
    for i in range(100):
        h.finished(Finished("root.q", "u0", "train", 4.0, (100.0 if i % 2 else 1900.0) * 4))
    snap = Snapshot(NOW, (SnapNode("n0", "r0", 4),), (running("R", 1, 4, 0.0), queued("Q", 2, 4)),
                    tree_to_plain(two_queues()), SnapSettings(), export_history(h))
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    f = got["Q"]
    assert (f.earliest, f.likely, f.latest) == (NOW + 100.0, NOW + 1000.0, NOW + 1900.0)
    wide, _ = forecast(snap, ForecastSettings(widen=1.5))
    assert wide["Q"].latest == NOW + 2500.0          # likely + 1.5 x the likely wait, beyond the 90th percentile
    assert wide["Q"].earliest == NOW + 100.0


def test_a_job_not_started_within_the_horizon_has_no_latest() -> None:
    snap = snapshot([running("R", 1, 4, 0.0), queued("Q", 2, 4)], history={4: 90_000.0, 1: 90_000.0})
    got, _ = forecast(snap, ForecastSettings(horizon_s=3600.0))
    assert (got["Q"].earliest, got["Q"].likely, got["Q"].latest) == (None, None, None)


def test_fair_share_preemption_is_part_of_the_forecast() -> None:
    # Queue q holds both servers; r, with nothing, is below its fair share: after the fair-share timeout (60 s)
    # the RM takes a server back from q for r's job (submitted last), before either running job ends. q's waiting
    # job then waits for R2's end and for the preempted job, which resumes first.
    snap = snapshot([running("R1", 1, 4, 0.0), running("R2", 2, 4, 400.0), queued("Q", 3, 4),
                     queued("X", 4, 4, queue="root.r")], nodes=2)
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    x, q = got["X"].likely, got["Q"].likely
    assert x is not None and q is not None
    assert NOW + 60.0 <= x < NOW + 61.0
    assert q >= NOW + 600.0


def test_targets_limit_the_forecast() -> None:
    snap = snapshot([running("R", 1, 4, 400.0), queued("A", 2, 4), queued("B", 3, 4)])
    got, _ = forecast(snap, ForecastSettings(), targets=["A"])
    assert list(got) == ["A"]
    assert forecast(snap, ForecastSettings(), targets=["R"])[0] == {}


def test_a_waiting_am_backs_off_as_it_would_for_real() -> None:
    # The default locality settings: after 60 s at its level the AM gives up its partial hold and backs off
    # (jittered): it starts a while after the GPUs free, never before.
    snap = snapshot([running("R", 1, 4, 400.0), SnapJob("Q", "root.q", "u0", "train", 4, 0, 2, NOW, False, 0.0,
                                                       0.0)])
    got, _ = forecast(snap, ForecastSettings(widen=0.0))
    assert got["Q"].likely is not None and NOW + 600.0 <= got["Q"].likely <= NOW + 600.0 + 600.0


def test_the_same_snapshot_gives_the_same_forecast() -> None:
    snap = snapshot([running("R", 1, 3, 50.0), queued("A", 2, 2), queued("B", 3, 4), queued("C", 4, 1)],
                    nodes=2, policy=Policy.LAS.value)
    assert forecast(snap, ForecastSettings())[0] == forecast(snap, ForecastSettings())[0]


def test_the_baseline_is_queue_position_times_the_mean_run_time() -> None:
    snap = snapshot([running("R", 1, 4, 400.0), queued("A", 2, 4), queued("B", 3, 1), queued("X", 4, 1, "root.r")])
    assert mean_run_s(snap) == 1000.0
    assert [baseline_wait_s(snap, j) for j in ("A", "B", "X")] == [0.0, 1000.0, 0.0]


def test_settings_refuse_bad_values_naming_them() -> None:
    with pytest.raises(ValueError, match="quantiles"):
        ForecastSettings(low_quantile=0.9, high_quantile=0.1)
    with pytest.raises(ValueError, match="horizon"):
        ForecastSettings(horizon_s=0)
    with pytest.raises(ValueError, match="widen"):
        ForecastSettings(widen=-1)


# ------------------------------------------------------------------ the snapshot of a real core

def core_with_jobs() -> RMCore:
    core = RMCore(RMSettings(), two_queues())
    for node in ("n0", "n1"):
        core.register_node(NodeRegistration(node, "h", 1, "r0", "r0", [GpuRecord(i) for i in range(4)]), node, 0.0)
    for i in range(3):
        core.submit(JobSpec(gpus=2, command=["x"], name=f"j{i}", queue="q"), "ann", 10.0 + i, check_acl=False)
    return core


def test_take_reads_the_core_and_the_tree_survives_the_round_trip() -> None:
    core = core_with_jobs()
    snap = take(core, 100.0)
    assert [(n.node_id, n.gpus) for n in snap.nodes] == [("n0", 4), ("n1", 4)]
    assert [(j.name, j.queue, j.gpus, j.running) for j in snap.jobs] == \
        [("j0", "root.q", 2, False), ("j1", "root.q", 2, False), ("j2", "root.q", 2, False)]
    assert snap.jobs[0].locality == (60.0, 10.0, 600.0, 1, "prefer")
    tree = tree_from_plain(snap.tree)
    assert [q.path for q in tree.leaves] == ["root.q", "root.r"]
    assert tree_to_plain(tree) == snap.tree


def test_the_history_is_copied_again_only_when_it_learned_more() -> None:
    core = core_with_jobs()
    cache = HistoryCache()
    first = take(core, 1.0, cache).history
    assert take(core, 2.0, cache).history is first
    core.history.finished(Finished("root.q", "ann", "j", 2.0, 100.0))
    assert take(core, 3.0, cache).history is not first


def test_what_crosses_to_the_worker_is_plain_and_pickles() -> None:
    snap = snapshot([running("R", 1, 4, 400.0), queued("Q", 2, 4)])
    again = pickle.loads(pickle.dumps(snap))
    assert again == snap
    rows, cpu_s, events = run_round(again, ForecastSettings(widen=0.0))
    assert rows == [("Q", NOW + 600.0, NOW + 600.0, NOW + 600.0)]
    assert cpu_s >= 0.0 and events > 0
    assert pickle.loads(pickle.dumps(rows)) == rows
    assert Forecast("Q", NOW, *rows[0][1:]).as_dict()["likely"] == NOW + 600.0
