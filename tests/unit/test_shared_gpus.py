"""Shared GPUs: jobs below one GPU (`gpus: 0.5`, `gpu_share: N`): the spec, the cluster's share bookkeeping, the
RM's grants and fair-share accounting by fraction, the AM's plan, the agent's checks and environment. Injected
clock, no sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurm.am.master import Held, Launch, Master, Phase
from gpurm.am.placement import ServerView, View
from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import JobSpec, parse_gpus_text, parse_job_yaml, spec_from_proto, spec_to_proto
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.launch import mps_pipe_dir, share_env
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb
from gpurm.queues.tree import Policy
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.cluster import SHARED
from gpurm.rm.state.core import RMCore
from gpurm.sim.clusterspec import parse_cluster
from gpurm.sim.engine import Engine, SimOptions
from gpurm.sim.run import trace_tree
from gpurm.sim.trace import TraceError, load_trace
from tests.unit.test_rm_core import cluster, launched, restarted, running

# ---------------------------------------------------------------- spec


def test_a_fraction_of_a_gpu_from_yaml_the_flag_and_the_wire() -> None:
    half = parse_job_yaml("gpus: 0.5\ncommand: python notebook.py\n")
    assert (half.gpus, half.gpu_share_milli, half.shared, half.gpu_amount, half.gpus_text) == (1, 500, True, 0.5,
                                                                                              "0.5")
    quarter = parse_job_yaml("gpu_share: 4\ncommand: x\n")
    assert (quarter.gpus, quarter.gpu_share_milli, quarter.gpus_text) == (1, 250, "0.25")
    assert parse_job_yaml("gpus: 1\ngpu_share: 3\ncommand: x\n").gpu_share_milli == 333
    assert parse_gpus_text("0.25") == (1, 0, 250) and parse_gpus_text("4:16") == (4, 16, 0)
    back = spec_from_proto(spec_to_proto(half))
    assert (back.gpus, back.gpu_share_milli) == (1, 500)
    whole = parse_job_yaml("gpus: 2\ncommand: x\n")
    assert not whole.shared and whole.gpu_amount == 2.0 and spec_to_proto(whole).gpu_share_milli == 0


@pytest.mark.parametrize(("text", "needle"), [
    ("gpus: 1.5\ncommand: x\n", "gpus: a fraction of a GPU must be between 0 and 1"),
    ("gpus: 0.0001\ncommand: x\n", "gpus: a fraction of a GPU has at most three decimals"),
    ("gpus: 0.0\ncommand: x\n", "gpus: a fraction of a GPU must be between 0 and 1"),
    ("gpu_share: 1\ncommand: x\n", "gpu_share: must be at least 2"),
    ("gpu_share: 500\ncommand: x\n", "gpu_share: at most 100 jobs share one GPU"),
    ("gpus: 2\ngpu_share: 2\ncommand: x\n", "gpu_share: goes with one GPU only"),
    ("gpus: 0.5\nplacement: spread\ncommand: x\n", "placement: spread needs whole GPUs"),
])
def test_bad_shares_name_the_field(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job_yaml(text)
    assert needle in str(info.value)


def test_a_share_on_the_wire_with_several_gpus_is_refused() -> None:
    msg = spec_to_proto(JobSpec(gpus=4, command=["x"]))
    msg.gpu_share_milli = 500
    with pytest.raises(ConfigError) as info:
        spec_from_proto(msg)
    assert "a job below one GPU (gpus: 0.5) is one container on one shared GPU" in str(info.value)


# ---------------------------------------------------------------- RM


def shared_job(core: RMCore, milli: int, now: float = 1.0, user: str = "alice") -> str:
    """Submit a job of `milli` thousandths of a GPU and bring its AM up (registered); its id."""
    job = core.submit(JobSpec(gpus=1, command=["x"], gpu_share_milli=milli), user, now)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], now)
    core.register_am(job.job_id, launch.am_attempt, now)
    return job.job_id


def test_shares_fill_one_gpu_before_another_is_taken_and_count_by_fraction() -> None:
    core = cluster(1, gpus=2)
    grants = []
    for i in range(4):
        job = shared_job(core, 500, now=1.0 + i)
        (g,) = core.allocate(job, 1, 0, [Ask(gpus=1)], [], [], 1.5 + i).grants
        grants.append(g)
    assert [(g.gpu_indices, g.share_milli) for g in grants] == [([0], 500), ([0], 500), ([1], 500), ([1], 500)]
    node = core.cluster.nodes["n1"]
    assert node.allocated == {0: SHARED, 1: SHARED} and node.free == 0
    assert core.queues.used["root.default"] == 2.0 and core.queues.demand["root.default"] == 2.0
    assert [core.containers[g.container_id].share_milli for g in grants] == [500] * 4


def test_a_whole_gpu_job_never_lands_on_a_shared_gpu() -> None:
    core = cluster(1, gpus=2)
    small = shared_job(core, 250)
    (g,) = core.allocate(small, 1, 0, [Ask(gpus=1)], [], [], 1.5).grants
    whole = core.submit(JobSpec(gpus=2, command=["x"]), "bob", 2.0)
    (launch,) = launched(core)
    core.node_heartbeat("n1", "s1", [running(launch.container_id)], 2.0)
    core.register_am(whole.job_id, 1, 2.0)
    assert core.allocate(whole.job_id, 1, 0, [Ask(gpus=2, node_id="n1")], [], [], 2.5).grants == []
    # The GPU's last share ends: it is a whole GPU again and the 2-GPU job gets both.
    core.allocate(small, 1, 1, [], [g.container_id], [], 3.0)
    assert core.cluster.nodes["n1"].shared == {}
    (big,) = core.allocate(whole.job_id, 1, 1, [Ask(gpus=2, node_id="n1")], [], [], 3.5).grants
    assert sorted(big.gpu_indices) == [0, 1] and big.share_milli == 0
    assert core.queues.used["root.default"] == 2.0


def test_the_rm_sizes_a_shared_jobs_asks_by_its_spec_not_by_what_its_am_sends() -> None:
    core = cluster(1, gpus=2)
    job = shared_job(core, 100)
    # An AM that asks for more (whole GPUs, several containers, another share) gets one share of its spec's size.
    r = core.allocate(job, 1, 0, [Ask(gpus=2, count=3), Ask(gpus=1, share_milli=10)], [], [], 1.5)
    assert [(g.gpu_indices, g.share_milli) for g in r.grants] == [([0], 100)]
    assert core.queues.used["root.default"] == pytest.approx(0.1)
    # A whole-GPU job's ask that names a share is a whole-GPU ask.
    whole = core.submit(JobSpec(gpus=1, command=["x"]), "bob", 2.0)
    (launch,) = launched(core)
    core.node_heartbeat("n1", "s1", [running(launch.container_id)], 2.0)
    core.register_am(whole.job_id, 1, 2.0)
    (g,) = core.allocate(whole.job_id, 1, 0, [Ask(gpus=1, share_milli=10)], [], [], 2.5).grants
    assert (g.gpu_indices, g.share_milli) == ([1], 0)


def test_fractions_leave_no_residue_when_their_jobs_end() -> None:
    core = cluster(1, gpus=1)
    jobs, grants = [], []
    for i, milli in enumerate((100, 200, 300)):
        job = shared_job(core, milli, now=1.0 + i)
        (g,) = core.allocate(job, 1, 0, [Ask(gpus=1)], [], [], 1.5 + i).grants
        jobs.append(job)
        grants.append(g)
    assert core.queues.used["root.default"] == pytest.approx(0.6)
    for job, g in zip(jobs, grants, strict=True):
        core.allocate(job, 1, 1, [], [g.container_id], [], 9.0)
        core.kill(job, "alice", "done", 9.0)
    assert core.queues.used["root.default"] == 0 and core.queues.demand["root.default"] == 0


def test_shares_survive_an_rm_restart() -> None:
    core = cluster(1, gpus=1)
    for i in range(2):
        job = shared_job(core, 500, now=1.0 + i)
        (g,) = core.allocate(job, 1, 0, [Ask(gpus=1)], [], [], 1.5 + i).grants
        core.node_heartbeat("n1", "s1", [running(g.container_id, pid=200 + i)], 2.0 + i)
    again = restarted(core, 10.0)
    node = again.cluster.nodes["n1"]
    assert node.allocated == {0: SHARED} and sorted(node.shared[0].values()) == [500, 500]
    assert again.queues.used["root.default"] == 1.0
    assert again.cluster.place_share(100) is None          # full: no room anywhere


def test_place_share_prefers_the_fullest_shared_gpu_that_fits() -> None:
    core = cluster(2, gpus=2)
    c = core.cluster
    c.allocate_share("n1", 0, 700, "a")
    c.allocate_share("n2", 1, 400, "b")
    where = c.place_share(300)
    assert where is not None and (where[0].node_id, where[1]) == ("n1", 0)   # 300 left there: best fit
    where = c.place_share(400)
    assert where is not None and (where[0].node_id, where[1]) == ("n2", 1)
    c.allocate_share("n1", 0, 300, "c")
    with pytest.raises(ValueError, match="has 0 thousandths free"):
        c.allocate_share("n1", 0, 1, "d")
    with pytest.raises(ValueError, match="held whole"):
        c.allocate("n2", [0], "e") or c.allocate_share("n2", 0, 100, "f")


# ---------------------------------------------------------------- AM


def test_a_shared_jobs_am_asks_for_no_server_and_launches_on_any_grant() -> None:
    m = Master(JobSpec(gpus=1, command=["x"], gpu_share_milli=500), 0.0)
    m.on_view(View([ServerView("n1", "r1", 8, ())]), 0.0)    # no whole GPU free: a share may still have room
    assert m.phase is Phase.ACQUIRING and m.asks() == [("", 1, ())]
    assert not m.plan_looks_taken
    m.on_grant(Held("c1", "n1", "r1", "h1", 1, (3,)), 1.0)
    m.step(1.0)
    (launch,) = [a for a in m.take_actions() if isinstance(a, Launch)]
    assert [h.gpu_indices for h, _, _ in launch.learners] == [(3,)]


# ---------------------------------------------------------------- agent


def record(cid: str, gpus: list[int], milli: int = 0) -> ContainerRecord:
    return ContainerRecord(container_id=cid, job_id="j", kind=pb.CONTAINER_LEARNER, state=pb.CONTAINER_RUNNING,
                           gpu_indices=gpus, share_milli=milli)


def test_the_agent_lets_shares_join_a_gpu_only_while_they_fit(tmp_path: Path) -> None:
    sup = ContainerSupervisor("n1", tmp_path)
    sup._records = {"a": record("a", [0], 600), "b": record("b", [1])}
    assert sup._busy_for([0], 400) is None
    assert sup._busy_for([0], 500) == (0, "a")          # 600 + 500 > one GPU
    assert sup._busy_for([0], 0) == (0, "a")            # a whole-GPU container never joins shares
    assert sup._busy_for([1], 100) == (1, "b")          # a share never joins a whole-GPU container
    assert sup._busy_for([2], 0) is None


def test_a_shared_containers_environment_names_its_share_and_mps_limits(tmp_path: Path) -> None:
    assert share_env(250, 20480, "") == {"GPURM_GPU_SHARE": "0.25", "GPURM_GPU_MEMORY_MIB": "20480"}
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) == ""      # no MPS control pipe there
    (tmp_path / "control").touch()
    assert mps_pipe_dir({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) == str(tmp_path)
    env = share_env(250, 20480, str(tmp_path))
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)


# ---------------------------------------------------------------- simulator


def test_the_simulator_runs_shares_side_by_side_and_keeps_whole_jobs_off_them(tmp_path: Path) -> None:
    jobs = [{"id": f"s{i}", "submit": 0, "gpus": 0.5, "duration": 100} for i in range(4)]
    jobs.append({"id": "W", "submit": 1, "gpus": 2, "duration": 100})
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    trace = load_trace(path, "jsonl")
    assert [j.gpu_share_milli for j in trace.jobs][:4] == [500] * 4 and trace.gpu_seconds() == 400.0
    result = Engine(trace, parse_cluster("1x1x2"), trace_tree(trace.queues()), SimOptions(policy=Policy.FIFO)).run()
    by_id = {r.job_id: r for r in result.results}
    assert [by_id[f"s{i}"].start_s for i in range(4)] == [0.0] * 4    # four halves on two GPUs at once
    assert by_id["W"].start_s is not None and by_id["W"].start_s >= 100.0   # waits for whole GPUs


def test_a_bad_fraction_in_a_trace_names_the_line_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"submit": 0, "gpus": 1, "duration": 60}\n{"submit": 0, "gpus": 1.5, "duration": 60}\n')
    with pytest.raises(TraceError) as err:
        load_trace(path, "jsonl")
    assert (err.value.line, err.value.field) == (2, "gpus") and "between 0 and 1" in err.value.reason
