"""Elastic jobs: the spec, the RM's growth and take-back (rm/sched/elastic.py), the AM's growth plan (am/elastic.py) and
its state machine's handling of grown learners. Injected clock, no sockets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpurm.am.elastic import growth_parts
from gpurm.am.master import Ended, Held, Launch, Master, Phase, Stop
from gpurm.am.placement import ServerView, View
from gpurm.common.fields import ConfigError
from gpurm.common.jobspec import JobSpec, LocalityLevel, parse_gpus, parse_job_yaml, spec_from_proto, spec_to_proto
from gpurm.common.model import JobState, Learner
from gpurm.rm.config import load_rm_config
from gpurm.rm.sched.elastic import IDLE_HOLD_S
from gpurm.rm.sched.scheduler import Ask
from gpurm.rm.state.core import AttemptUpdate, ContainerReport, ErrorCode, LaunchAM, RequestError, RMCore
from tests.unit.test_fair_scheduling import Rig
from tests.unit.test_rm_core import cluster, launched, restarted, running

# ---------------------------------------------------------------- spec


def test_elastic_spec_from_yaml_flags_and_the_wire() -> None:
    spec = parse_job_yaml("gpus: {min: 4, max: 16}\ncommand: python train.py\n")
    assert (spec.gpus, spec.max_gpus, spec.elastic, spec.gpus_text) == (4, 16, True, "4:16")
    assert parse_gpus("4:16") == (4, 16) and parse_gpus("8") == (8, 0)
    back = spec_from_proto(spec_to_proto(spec))
    assert (back.gpus, back.max_gpus) == (4, 16)
    rigid = parse_job_yaml("gpus: 4\ncommand: x\n")
    assert not rigid.elastic and spec_to_proto(rigid).max_gpus == 0


@pytest.mark.parametrize(("text", "needle"), [
    ("gpus: {min: 8, max: 4}\ncommand: x\n", "gpus.max: must be between gpus.min (8)"),
    ("gpus: {min: 4}\ncommand: x\n", "gpus.max: is required"),
    ("gpus: {min: 4, max: 8, most: 9}\ncommand: x\n", "gpus.most: unknown field"),
    ("gpus: 'four:8'\ncommand: x\n", "gpus: must be an integer like 4, min:max like 4:16"),
])
def test_bad_elastic_specs_name_the_field(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job_yaml(text)
    assert needle in str(info.value)


# ---------------------------------------------------------------- RM


def at_once(core: RMCore) -> RMCore:
    """No idle hold: growth goes ahead the moment nobody wants the GPUs (for the tests of what growth does;
    test_growth_waits_until_no_queue_has_wanted_gpus_for_the_idle_hold is about when)."""
    core.elastic.idle_hold_s = 0.0
    return core


def running_job(core: RMCore, spec: JobSpec, node: str = "n1", now: float = 1.0) -> tuple[str, str]:
    """Submit `spec`, bring up its AM, grant its gang on `node` and report it running: (job id, container)."""
    job = core.submit(spec, "alice", now)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], now)
    core.register_am(job.job_id, launch.am_attempt, now)
    (g,) = core.allocate(job.job_id, 1, 0, [Ask(gpus=spec.gpus, node_id=node)], [], [], now).grants
    report = AttemptUpdate(1, JobState.RUNNING, learners=[Learner(0, node, g.gpu_indices, g.container_id)],
                           level="node")
    core.allocate(job.job_id, 1, 1, [], [], [report], now + 0.1)
    return job.job_id, g.container_id


def test_an_elastic_job_grows_on_idle_gpus_as_preemptible_elastic_containers() -> None:
    core = at_once(cluster(2, gpus=4))
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"], max_gpus=8))
    r = core.allocate(job, 1, 2, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 2.0)
    (g,) = r.grants
    c = core.containers[g.container_id]
    assert (g.node_id, len(g.gpu_indices), g.preemptible, c.elastic) == ("n2", 4, True, True)
    assert core.elastic.reclaimable("n2") == [0, 1, 2, 3]
    assert core.queues.used["root.default"] == 8           # growth counts in the queue's usage


def test_a_rigid_jobs_elastic_asks_are_ignored() -> None:
    core = cluster(2, gpus=4)
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"]))
    r = core.allocate(job, 1, 2, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 2.0)
    assert r.grants == [] and core.cluster.free("n2") == 4


def test_growth_waits_while_a_gang_waits_and_is_taken_back_for_it() -> None:
    core = at_once(cluster(2, gpus=4))
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"], max_gpus=8))
    (grown,) = core.allocate(job, 1, 2, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 2.0).grants
    core.node_heartbeat("n2", "s2", [running(grown.container_id)], 2.1)
    # A rigid job's AM plans onto the elastic GPUs of n2 (the view shows them reclaimable) and asks for them.
    other = core.submit(JobSpec(gpus=4, command=["y"]), "bob", 3.0)
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], 3.0)
    core.register_am(other.job_id, launch.am_attempt, 3.0)
    r = core.allocate(other.job_id, 1, 0, [Ask(gpus=4, node_id="n2")], [], [], 3.1)
    assert r.grants == []
    c = core.containers[grown.container_id]
    assert c.stop_requested and "taken back for " + other.job_id in c.stop_reason
    notice = core.allocate(job, 1, 3, [], [], [], 3.2)        # the elastic job's AM hears it
    assert notice.preempt_ids == [grown.container_id] and "elastic" in notice.preempt_reason
    assert core.elastic.reclaimable("n2") == []                # being taken back: not offered twice
    # Once it is gone, the waiting gang gets the GPUs; the elastic job's new growth ask is not granted.
    core.node_heartbeat("n2", "s2", [ContainerReport(grown.container_id, "EXITED", signal=15, stopped=True)], 4.0)
    assert core.jobs[job].state is JobState.RUNNING               # the gang runs on: the job only shrank
    core.allocate(job, 1, 4, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 4.1)
    r = core.allocate(other.job_id, 1, 1, [Ask(gpus=4, node_id="n2")], [], [], 4.2)
    assert [g.node_id for g in r.grants] == ["n2"]


def test_no_growth_while_a_queued_job_without_asks_wants_gpus() -> None:
    core = at_once(cluster(3, gpus=4))
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"], max_gpus=8))
    # A job queued behind it has no AM yet (so no ask): growth would take the GPUs it is about to ask for.
    other = core.submit(JobSpec(gpus=4, command=["y"]), "bob", 2.0)
    assert core.unmet_demand() == 4 and core.growth_budget() == 0
    assert core.allocate(job, 1, 2, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 2.1).grants == []
    # Its AM comes up and runs its gang: nobody wants more than they hold, and growth goes ahead.
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], 3.0)
    core.register_am(other.job_id, launch.am_attempt, 3.0)
    assert [g.node_id for g in core.allocate(other.job_id, 1, 0, [Ask(gpus=4, node_id="n2")], [], [], 3.1).grants] \
        == ["n2"]
    assert core.unmet_demand() == 0 and core.growth_budget() == 4
    (grown,) = core.allocate(job, 1, 3, [Ask(gpus=4, node_id="n3", elastic=True)], [], [], 3.2).grants
    assert grown.node_id == "n3" and core.unmet_demand() == 0    # its own growth is not demand


def test_growth_waits_until_no_queue_has_wanted_gpus_for_the_idle_hold() -> None:
    core = cluster(3, gpus=4)
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"], max_gpus=8))
    grow = [Ask(gpus=4, node_id="n2", elastic=True)]
    assert core.allocate(job, 1, 2, grow, [], [], 2.0).grants == []          # idle from now on
    assert core.next_check(2.0) == 2.0 + IDLE_HOLD_S                           # when to look again
    assert core.allocate(job, 1, 3, grow, [], [], 100.0).grants == []
    # A job arrives (no AM, no ask yet): the GPUs are wanted, and the hold starts again once they are not.
    other = core.submit(JobSpec(gpus=4, command=["y"]), "bob", 150.0)
    assert core.allocate(job, 1, 4, grow, [], [], 2.0 + IDLE_HOLD_S).grants == []
    assert core.elastic.next_growth(2.0 + IDLE_HOLD_S) is None
    (launch,) = launched(core)
    core.node_heartbeat(launch.node_id, "s" + launch.node_id[1:], [running(launch.container_id)], 400.0)
    core.register_am(other.job_id, launch.am_attempt, 400.0)
    assert core.allocate(other.job_id, 1, 0, [Ask(gpus=4, node_id="n3")], [], [], 400.0).grants != []
    assert core.allocate(job, 1, 5, grow, [], [], 400.0 + IDLE_HOLD_S - 1).grants == []
    (g,) = core.allocate(job, 1, 6, grow, [], [], 400.0 + IDLE_HOLD_S).grants
    assert g.node_id == "n2" and core.containers[g.container_id].elastic


def test_rm_yaml_sets_the_idle_hold(tmp_path: Path) -> None:
    (tmp_path / "rm.yaml").write_text("elastic: {idle_hold: 90s}\n")
    settings = load_rm_config(tmp_path / "rm.yaml").settings
    assert settings.elastic_idle_hold_s == 90.0 and RMCore(settings).elastic.idle_hold_s == 90.0
    shipped = load_rm_config(Path(__file__).resolve().parents[2] / "configs" / "rm.yaml").settings
    assert shipped.elastic_idle_hold_s == IDLE_HOLD_S == RMCore().elastic.idle_hold_s


def test_a_queue_held_back_by_its_own_max_gpus_does_not_stop_growth() -> None:
    rig = Rig("queues:\n  a: {max_gpus: 4}\n  b: {}\n", nodes=2, gpus=4)
    at_once(rig.core)
    ja, jb = rig.job("a", 4), rig.job("a", 4)
    rig.ask(ja, [Ask(gpus=4, node_id="n0")])
    assert rig.ask(jb, [Ask(gpus=4)]) == []               # a is at its cap: jb waits for a's own GPUs
    je = rig.core.submit(JobSpec(gpus=2, command=["x"], queue="b", max_gpus=4), "u", 0.0).job_id
    (launch,) = [e for e in rig.core.take_outbox() if isinstance(e, LaunchAM)]
    rig.core.register_am(je, launch.am_attempt, 0.0)
    (cid,) = rig.ask(je, [Ask(gpus=2, node_id="n1")])
    gang = [Learner(0, "n1", rig.core.containers[cid].gpu_indices, cid)]
    rig.core.allocate(je, 1, rig.resp[je], [], [], [AttemptUpdate(1, JobState.RUNNING, learners=gang, level="node")],
                      0.0)
    rig.resp[je] += 1
    assert rig.core.unmet_demand() == 0                     # jb waits on a's cap, not on GPUs
    assert rig.ask(je, [Ask(gpus=2, node_id="n1", elastic=True)]) != []


def test_scale_sets_the_target_within_min_and_max_and_checks_who_asks() -> None:
    core = cluster(2, gpus=4)
    job, _ = running_job(core, JobSpec(gpus=2, command=["x"], max_gpus=8))
    assert core.scale(job, 6, "alice", 2.0).target_gpus == 6
    assert core.allocate(job, 1, 2, [], [], [], 2.1).target_gpus == 6
    for gpus, code in ((1, ErrorCode.INVALID_ARGUMENT), (9, ErrorCode.INVALID_ARGUMENT)):
        with pytest.raises(RequestError) as info:
            core.scale(job, gpus, "alice", 2.0)
        assert info.value.code is code and "between the job's min 2 and max 8" in info.value.message
    with pytest.raises(RequestError) as info:
        core.scale(job, 4, "mallory", 2.0)
    assert info.value.code is ErrorCode.PERMISSION_DENIED
    rigid, _ = running_job(core, JobSpec(gpus=1, command=["x"]), node="n2")
    with pytest.raises(RequestError) as info:
        core.scale(rigid, 1, "alice", 2.0)
    assert "not elastic" in info.value.message
    assert core.jobs[job].target_gpus == 6                      # the refusals changed nothing


def test_elastic_containers_and_targets_survive_an_rm_restart() -> None:
    core = at_once(cluster(2, gpus=4))
    job, _ = running_job(core, JobSpec(gpus=4, command=["x"], max_gpus=8))
    (grown,) = core.allocate(job, 1, 2, [Ask(gpus=4, node_id="n2", elastic=True)], [], [], 2.0).grants
    core.node_heartbeat("n2", "s2", [running(grown.container_id)], 2.1)
    core.scale(job, 8, "alice", 2.2)
    again = restarted(core, now=10.0)
    assert again.containers[grown.container_id].elastic and again.elastic.reclaimable("n2") == [0, 1, 2, 3]
    assert again.jobs[job].target_gpus == 8 and again.jobs[job].spec.max_gpus == 8


# ---------------------------------------------------------------- AM


def sv(node: str, rack: str, free: int, total: int = 4, reclaimable: tuple[int, ...] = ()) -> ServerView:
    return ServerView(node, rack, total, tuple(range(free)), reclaimable=reclaimable)


def test_growth_stays_packed_own_servers_then_the_rack_then_anywhere_only_at_any() -> None:
    view = View([sv("a1", "A", 2), sv("a2", "A", 4), sv("b1", "B", 4), sv("a3", "A", 4, reclaimable=(0, 1, 2, 3))])
    assert growth_parts(view, 4, ["a1"], "a1", LocalityLevel.PACKED, set()) == [
        ("a1", 2, (0, 1)), ("a2", 2, (0, 1))]                    # a3's GPUs are another job's growth
    assert growth_parts(view, 12, ["a1"], "a1", LocalityLevel.PACKED, set()) == [
        ("a1", 2, (0, 1)), ("a2", 4, (0, 1, 2, 3))]              # never outside the rack below `any`
    assert [p[0] for p in growth_parts(view, 12, ["a1"], "a1", LocalityLevel.ANY, set())] == ["a1", "a2", "b1"]
    assert growth_parts(view, 4, ["a1"], "a1", LocalityLevel.NODE, set()) == [
        ("a1", 2, (0, 1)), ("a2", 2, (0, 1))]                    # a one-server gang still grows in its rack
    assert growth_parts(view, 0, ["a1"], "a1", LocalityLevel.ANY, set()) == []


def running_master(max_gpus: int = 8) -> tuple[Master, float]:
    spec = JobSpec(gpus=4, command=["x"], max_gpus=max_gpus)
    m = Master(spec, 0.0, random.Random(1))
    m.on_view(View([sv("a1", "A", 4), sv("a2", "A", 4)]), 0.0)
    (node, _gpus, idx), = m.asks()
    m.on_grant(Held("c1", node, "A", "h1", 1, idx), 0.1)
    (launch,) = [a for a in m.take_actions() if isinstance(a, Launch)]
    assert launch.learners[0][2]["GPURM_MAX_GPUS"] == str(max_gpus)
    m.on_started("c1", True, 11, "", False, 0.2)
    assert m.phase is Phase.RUNNING
    return m, 0.3


def test_the_am_grows_launches_grown_learners_and_keeps_running_when_they_are_taken_back() -> None:
    m, now = running_master()
    m.on_view(View([sv("a1", "A", 0), sv("a2", "A", 4)]), now)
    assert m.growth_asks(now) == [("a2", 4, (0, 1, 2, 3))]
    m.on_grant(Held("c2", "a2", "A", "h2", 1, (0, 1, 2, 3)), now)
    (launch,) = m.take_actions()
    assert isinstance(launch, Launch)
    (_, rank, env), = launch.learners
    assert rank == 1 and env["MASTER_ADDR"] == "h1" and env["WORLD_SIZE"] == "8" and env["GPURM_MIN_NODES"] == "1"
    m.on_started("c2", True, 12, "", False, now)
    assert m.growth_asks(now) == []                              # at its max
    m.on_preempted(["c2"], 15.0, now, "elastic GPUs taken back for job-9")
    assert m.phase is Phase.RUNNING and m.final is None
    assert [type(a) for a in m.take_actions()] == [Stop] and m.take_releases() == ["c2"]
    m.on_ended(Ended("c2", signal=15, stopped=True), now + 1)
    assert m.phase is Phase.RUNNING
    m.on_ended(Ended("c1"), now + 2)                              # the gang finishes: the job succeeds
    assert m.final is not None and m.final.state is JobState.SUCCEEDED


def test_a_failed_grown_learner_pauses_growth_and_a_lower_target_stops_the_newest() -> None:
    m, now = running_master(max_gpus=12)
    m.on_view(View([sv("a1", "A", 0), sv("a2", "A", 4), sv("a3", "A", 4)]), now)
    m.on_grant(Held("c2", "a2", "A", "h2", 1, (0, 1, 2, 3)), now)
    m.on_grant(Held("c3", "a3", "A", "h3", 1, (0, 1, 2, 3)), now)
    m.take_actions()
    m.on_ended(Ended("c3", exit_code=1), now + 1)
    assert m.phase is Phase.RUNNING and m.growth_asks(now + 2) == []    # paused after a failure
    m.set_target(4, now + 3)                                     # gpurm scale JOB 4: back to the gang
    (stop,) = m.take_actions()
    assert isinstance(stop, Stop) and stop.held.container_id == "c2" and m.take_releases() == ["c2"]
    m.set_target(2, now + 4)                                     # never below the minimum
    assert m.target == 4 and m.take_actions() == []
