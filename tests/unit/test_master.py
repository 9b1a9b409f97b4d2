"""The AM state machine on a fake clock: acquisition, timeout/back-off/relax, launch, retries, adoption."""

from __future__ import annotations

import random

from gpurm.am.master import AttemptRecord, Ended, Held, Launch, Master, Phase, Stop
from gpurm.am.placement import ServerView
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel
from gpurm.common.model import FailureKind, JobState, Learner


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def spec(gpus: int, retries: int = 3, start: LocalityLevel = LocalityLevel.PACKED) -> JobSpec:
    return JobSpec(gpus=gpus, command=["train"], max_retries=retries,
                   locality=Locality(timeout_s=60, backoff_base_s=10, backoff_max_s=600, start_level=start))


class Rig:
    """A master plus a tiny fake RM that grants exactly what is asked."""

    def __init__(self, job: JobSpec, servers: list[ServerView], seed: int = 1) -> None:
        self.now = 0.0
        self.m = Master(job, self.now, rng=random.Random(seed))
        self.m.on_view(servers, self.now)
        self.seq = 0

    def grant_all(self) -> list[Held]:
        out = []
        for node, _gpus, idx in self.m.asks():
            self.seq += 1
            h = Held(f"c{self.seq}", node, "r", f"h-{node}", 1, idx)
            out.append(h)
            self.m.on_grant(h, self.now)
        return out

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.m.step(self.now)

    def launch(self) -> Launch:
        actions = self.m.take_actions()
        (launch,) = [a for a in actions if isinstance(a, Launch)]
        return launch

    def start_all(self, launch: Launch) -> None:
        for h, _, _ in launch.learners:
            self.m.on_started(h.container_id, True, 100, "", False, self.now)


def test_happy_path_packs_two_servers_and_sets_torchrun_env() -> None:
    rig = Rig(spec(16), [srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8)])
    assert sorted(rig.m.asks()) == [("a", 8, tuple(range(8))), ("b", 8, tuple(range(8)))]
    rig.grant_all()
    launch = rig.launch()
    envs = {h.node_id: env for h, _, env in launch.learners}
    assert {e["NODE_RANK"] for e in envs.values()} == {"0", "1"}
    assert all(e["NNODES"] == "2" and e["WORLD_SIZE"] == "16" and e["NPROC_PER_NODE"] == "8"
               for e in envs.values())
    assert envs["a"]["MASTER_ADDR"] == "h-a" and envs["b"]["MASTER_ADDR"] == "h-a"
    rig.start_all(launch)
    assert rig.m.phase is Phase.RUNNING and rig.m.attempt.state is JobState.RUNNING
    for h, _, _ in launch.learners:
        rig.m.on_ended(Ended(h.container_id, 0), rig.now)
    assert rig.m.final is not None and rig.m.final.state is JobState.SUCCEEDED
    learners = rig.m.attempt.learners
    assert [(ln.rank, ln.state, ln.exit_code) for ln in learners] == [(0, "EXITED", 0), (1, "EXITED", 0)]


def test_timeout_releases_backs_off_relaxes_and_then_succeeds() -> None:
    # Fragmented: 16 GPUs cannot be packed on 2 servers; the rack level takes 3 servers.
    rig = Rig(spec(16), [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r1", 6)])
    assert rig.m.asks() == [] and rig.m.phase is Phase.PLANNING
    rig.m.take_reports(rig.now)
    assert "packed on 2 servers" in rig.m.attempt.waiting_reason
    rig.advance(59.0)
    assert rig.m.level is LocalityLevel.PACKED
    rig.advance(1.0)
    assert rig.m.phase is Phase.BACKOFF
    wait = rig.m.backoff_until - rig.now
    assert 0 <= wait <= 10
    rig.advance(wait + 0.01)
    assert rig.m.level is LocalityLevel.RACK and rig.m.phase is Phase.ACQUIRING
    assert sorted(n for n, _, _ in rig.m.asks()) == ["a", "b", "c"]
    rig.grant_all()
    rig.start_all(rig.launch())
    assert rig.m.phase is Phase.RUNNING and rig.m.attempt.level == "rack"


def test_partial_gang_is_released_at_the_timeout() -> None:
    rig = Rig(spec(16), [srv("a", "r1", 8), srv("b", "r1", 8)])
    first = rig.m.asks()[0]
    rig.m.on_grant(Held("c1", first[0], "r1", "h", 1, first[2]), rig.now)
    assert rig.m.held_gpus == 8
    rig.advance(60)
    assert rig.m.phase is Phase.BACKOFF and rig.m.held_gpus == 0
    assert rig.m.take_releases() == ["c1"]


def test_at_any_it_keeps_cycling_with_bounded_growing_backoff() -> None:
    rig = Rig(spec(16, start=LocalityLevel.ANY), [srv("a", "r1", 4)], seed=7)
    caps = []
    for k in range(8):
        rig.advance(60)
        assert rig.m.phase is Phase.BACKOFF and rig.m.level is LocalityLevel.ANY
        wait = rig.m.backoff_until - rig.now
        cap = min(10 * 2 ** k, 600)
        assert 0 <= wait <= cap
        caps.append(cap)
        rig.advance(wait + 0.001)
        assert rig.m.phase is Phase.PLANNING
    assert caps[-1] == 600            # capped


def test_told_gpus_wait_for_it_a_backing_off_am_plans_at_once_at_the_next_level() -> None:
    rig = Rig(spec(4, start=LocalityLevel.RACK), [srv("a", "r1", 2), srv("b", "r2", 2)], seed=3)
    rig.advance(60)                                      # no rack holds 4 free GPUs: back off
    assert rig.m.phase is Phase.BACKOFF and rig.m.backoff_until > rig.now
    rig.m.on_view([srv("a", "r1", 4), srv("b", "r2", 2)], rig.now)
    assert rig.m.phase is Phase.BACKOFF and rig.m.asks() == []        # the view alone does not end a back-off
    rig.m.on_room(rig.now)
    assert rig.m.level is LocalityLevel.ANY and rig.m.phase is Phase.ACQUIRING
    assert rig.m.asks() == [("a", 4, (4, 5, 6, 7))]
    rig.m.on_room(rig.now)                               # not backing off: nothing changes
    assert rig.m.phase is Phase.ACQUIRING


def test_stale_grant_is_given_back() -> None:
    rig = Rig(spec(8, start=LocalityLevel.NODE), [srv("a", "r1", 8), srv("b", "r1", 8)])
    (node, _, _), = rig.m.asks()
    other = "b" if node == "a" else "a"
    rig.m.on_grant(Held("cx", other, "r1", "h", 1, tuple(range(8))), rig.now)
    assert rig.m.take_releases() == ["cx"]


def run_attempt_that_fails(rig: Rig, code: int, after: float) -> None:
    rig.grant_all()
    launch = rig.launch()
    rig.start_all(launch)
    rig.advance(after)
    first, *rest = [h for h, _, _ in launch.learners]
    rig.m.on_ended(Ended(first.container_id, code), rig.now)
    stops = [a for a in rig.m.take_actions() if isinstance(a, Stop)]
    assert {s.held.container_id for s in stops} == {h.container_id for h in rest}
    for h in rest:
        rig.m.on_ended(Ended(h.container_id, 0, signal=15, stopped=True), rig.now)


def test_failures_retry_to_the_cap_then_fail_with_every_cause() -> None:
    rig = Rig(spec(16, retries=2), [srv("a", "r1", 8), srv("b", "r1", 8)])
    for n in range(1, 4):
        assert rig.m.attempt.number == n
        run_attempt_that_fails(rig, code=3 if n != 2 else 4, after=120)   # slow, varying: not a user error
    final = rig.m.final
    assert final is not None and final.state is JobState.FAILED and final.exit_code == 3
    assert "attempt 1:" in final.diagnostics and "attempt 3:" in final.diagnostics
    assert [a.counts_as_failure for a in rig.m.attempts] == [True, True, True]


def test_same_exit_code_twice_within_a_minute_is_a_user_error() -> None:
    rig = Rig(spec(8, retries=5), [srv("a", "r1", 8)])
    run_attempt_that_fails(rig, code=3, after=5)
    assert rig.m.final is None and rig.m.attempt.number == 2
    run_attempt_that_fails(rig, code=3, after=5)
    assert rig.m.final is not None and "user error" in rig.m.final.diagnostics
    assert len(rig.m.attempts) == 2


def test_preemption_is_not_a_failure() -> None:
    rig = Rig(spec(8, retries=0), [srv("a", "r1", 8)])
    rig.grant_all()
    launch = rig.launch()
    rig.start_all(launch)
    ids = [h.container_id for h, _, _ in launch.learners]
    rig.m.on_preempted(ids, 15.0, rig.now, "preempted for queue nlp: las level 0 outranks level 2")
    assert any(isinstance(a, Stop) for a in rig.m.take_actions())
    for cid in ids:
        rig.m.on_ended(Ended(cid, 0, signal=15, stopped=True), rig.now)
    assert rig.m.final is None and rig.m.attempt.number == 2
    first = rig.m.attempts[0]
    assert first.failure is FailureKind.PREEMPTED and not first.counts_as_failure
    assert first.cause == "preempted for queue nlp: las level 0 outranks level 2"     # the RM's reason, as given


def test_lost_node_is_avoided_by_the_next_attempt() -> None:
    rig = Rig(spec(8), [srv("a", "r1", 8), srv("b", "r1", 8)])
    rig.grant_all()
    launch = rig.launch()
    rig.start_all(launch)
    (h, _, _), = launch.learners
    rig.m.on_ended(Ended(h.container_id, lost=True, infra=True, diagnostics="node lost"), rig.now)
    assert rig.m.attempt.number == 2 and h.node_id in rig.m.avoid
    assert [n for n, _, _ in rig.m.asks()] == ["b" if h.node_id == "a" else "a"]
    assert rig.m.attempts[0].failure is FailureKind.INFRA


def test_restarted_am_adopts_running_learners() -> None:
    job = spec(16)
    m = Master(job, 100.0)
    learners = [Learner(0, "a", list(range(8)), "c1", host="h-a", state="RUNNING", pid=11),
                Learner(1, "b", list(range(8)), "c2", host="h-b", state="RUNNING", pid=12)]
    attempt = AttemptRecord(1, JobState.RUNNING, start_time=1.0, learners=learners, launched_at=2.0)
    held = [Held("c1", "a", "r1", "h-a", 1, tuple(range(8))), Held("c2", "b", "r1", "h-b", 1, tuple(range(8)))]
    m.adopt([attempt], held, [], 100.0)
    assert m.phase is Phase.RUNNING and set(m.runs) == {"c1", "c2"} and m.take_actions() == []
    m.on_ended(Ended("c1", 0), 101.0)
    m.on_ended(Ended("c2", 0), 101.0)
    assert m.final is not None and m.final.state is JobState.SUCCEEDED


def test_a_stop_wait_that_runs_out_moves_on_at_exactly_its_deadline() -> None:
    rig = Rig(spec(8, retries=3), [srv("a", "r1", 8)])
    rig.grant_all()
    launch = rig.launch()
    rig.start_all(launch)
    rig.m.on_preempted([h.container_id for h, _, _ in launch.learners], 10.0, rig.now)
    assert rig.m.phase is Phase.STOPPING
    deadline = rig.m.next_deadline()
    assert deadline is not None
    rig.now = deadline
    rig.m.step(rig.now)                      # the learner never confirmed its end: give up waiting now
    assert rig.m.phase is not Phase.STOPPING and rig.m.attempt.number == 2
    assert (rig.m.next_deadline() or float("inf")) > rig.now
