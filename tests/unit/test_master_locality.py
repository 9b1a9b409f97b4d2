"""The AM's locality setting on a fake clock: strict / prefer / any, levels the cluster's shape can never
satisfy, the start level, and user errors that fail the job without a retry."""

from __future__ import annotations

import random

from gpurm.am.master import Ended, Held, Launch, Master, Phase
from gpurm.am.placement import ServerView, View
from gpurm.common.jobspec import JobSpec, Locality, LocalityLevel, LocalityMode
from gpurm.common.model import FailureKind, JobState


def srv(node: str, rack: str, free: int, total: int = 8) -> ServerView:
    return ServerView(node, rack, total, tuple(range(total - free, total)))


def spec(gpus: int, mode: LocalityMode = LocalityMode.PREFER, start: LocalityLevel = LocalityLevel.PACKED,
         retries: int = 3) -> JobSpec:
    return JobSpec(gpus=gpus, command=["train"], max_retries=retries,
                   locality=Locality(timeout_s=60, backoff_base_s=10, backoff_max_s=600, start_level=start,
                                     mode=mode))


def master(job: JobSpec, servers: list[ServerView], seed: int = 1) -> Master:
    m = Master(job, 0.0, rng=random.Random(seed))
    m.on_view(servers, 0.0)
    return m


def racks(n_racks: int, per_rack: int, free: int = 0, gpus: int = 8) -> list[ServerView]:
    return [srv(f"r{r}s{s}", f"r{r}", free, gpus) for r in range(n_racks) for s in range(per_rack)]


# ---------------------------------------------------------------- the shape decides which levels exist

def test_the_shape_decides_which_levels_a_job_can_ever_be_at() -> None:
    view = View(racks(2, 4))                          # racks of 4 servers x 8 GPUs, all busy
    assert view.satisfiable(8, LocalityLevel.NODE) and not view.satisfiable(24, LocalityLevel.NODE)
    assert view.satisfiable(24, LocalityLevel.PACKED) and view.satisfiable(32, LocalityLevel.RACK)
    assert not view.satisfiable(48, LocalityLevel.PACKED) and not view.satisfiable(48, LocalityLevel.RACK)
    assert view.satisfiable(48, LocalityLevel.ANY) and not view.satisfiable(65, LocalityLevel.ANY)
    # Mixed sizes: the fewest servers for 32 GPUs are two 16-GPU ones, which no rack holds together.
    mixed = View([srv("big", "r1", 0, 16), srv("a", "r1", 0), srv("b", "r1", 0), srv("big2", "r2", 0, 16)])
    assert not mixed.satisfiable(32, LocalityLevel.PACKED) and mixed.satisfiable(32, LocalityLevel.RACK)


def test_a_24_gpu_job_on_8_gpu_servers_never_waits_at_node() -> None:
    m = master(spec(24, start=LocalityLevel.NODE), racks(2, 4))
    assert m.level is LocalityLevel.PACKED and m.attempt.level == "packed"
    assert m.level_since == 0.0 and m.phase is Phase.PLANNING


def test_the_status_says_which_levels_were_skipped_and_why() -> None:
    m = master(spec(16, start=LocalityLevel.NODE), racks(2, 4))
    m.take_reports(3.0)
    reason = m.attempt.waiting_reason
    assert "level packed" in reason and "skipped node (no server has 16 GPUs)" in reason
    m = master(spec(48), racks(2, 4))
    assert "skipped packed (no rack holds 48 GPUs on 6 servers), rack (no rack has 48 GPUs)" in m.waiting_reason(1)
    assert "skipped" not in master(spec(16), racks(2, 4)).waiting_reason(1.0)


def test_a_48_gpu_job_on_racks_of_32_gpus_goes_straight_to_any() -> None:
    m = master(spec(48), racks(2, 4, free=8))
    assert m.level is LocalityLevel.ANY and m.phase is Phase.ACQUIRING
    assert sum(g for _, g, _ in m.asks()) == 48 and len(m.asks()) == 6


def test_a_level_skipped_when_the_view_arrives_after_the_master_is_made() -> None:
    m = Master(spec(48), 0.0, rng=random.Random(1))      # the daemon's AM builds it before its first view
    assert m.level is LocalityLevel.PACKED
    m.on_view(racks(2, 4), 5.0)
    assert m.level is LocalityLevel.ANY and m.level_since == 5.0


def test_a_job_that_fits_keeps_its_levels_and_relaxes_after_the_timeout() -> None:
    m = master(spec(16), racks(2, 4))                  # nothing free: it waits at packed, then relaxes to rack
    assert m.level is LocalityLevel.PACKED
    m.step(60.0)
    assert m.phase is Phase.BACKOFF
    m.step(m.backoff_until)
    assert m.level is LocalityLevel.RACK


# ---------------------------------------------------------------- a job that fits on one server

def relax_once(m: Master, now: float) -> float:
    """Time the level out and end the back-off; returns the clock after."""
    m.step(now + 60.0)
    assert m.phase is Phase.BACKOFF
    m.step(m.backoff_until)
    return m.backoff_until


def test_a_job_that_fits_on_one_server_waits_for_one_and_is_never_split() -> None:
    # Two servers with 4 free each: an 8-GPU job could run split now, but it waits for one whole server.
    m = master(spec(8), [srv("a", "r1", 4), srv("b", "r1", 4)])
    now = 0.0
    while now < 6 * 3600.0:
        m.step(now + 60.0)
        assert m.phase is Phase.BACKOFF
        assert "then trying packed again (it fits on one server" in m.waiting_reason(now + 60.0)
        now = m.backoff_until
        m.step(now)
        assert m.level is LocalityLevel.PACKED and m.phase is Phase.PLANNING and m.asks() == []
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 4)], now + 1.0)
    assert m.asks() == [("a", 8, tuple(range(8)))]


def test_catch_up_skips_idle_cycles_of_a_one_server_job() -> None:
    m = master(spec(4), racks(2, 4))
    m.catch_up(100_000.0)
    assert m.level is LocalityLevel.PACKED and m.phase in (Phase.BACKOFF, Phase.PLANNING)


def test_jobs_the_one_server_rule_does_not_concern_relax_as_before() -> None:
    # A 1-GPU job loses nothing by relaxing (every level is one server); a 16-GPU job never fits on one server.
    for gpus in (1, 16):
        m = master(spec(gpus), racks(2, 4))
        relax_once(m, 0.0)
        assert m.level is LocalityLevel.RACK
    # `locality: any` says the job does not mind being split; a start level past packed is honoured too.
    fragmented = [srv("a", "r1", 4), srv("b", "r1", 4)]
    for job in (spec(8, mode=LocalityMode.ANY), spec(8, start=LocalityLevel.RACK)):
        m = master(job, fragmented)
        assert sorted(m.asks()) == [("a", 4, (4, 5, 6, 7)), ("b", 4, (4, 5, 6, 7))]


# ---------------------------------------------------------------- the start level

def test_start_level_node_is_honoured_when_one_server_can_hold_the_job() -> None:
    m = master(spec(8, start=LocalityLevel.NODE), [srv("a", "r1", 4), srv("b", "r1", 4)])
    assert m.level is LocalityLevel.NODE and m.asks() == []      # two half-free servers: not one server
    m.step(59.0)
    assert m.level is LocalityLevel.NODE
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 4)], 30.0)
    assert m.asks() == [("a", 8, tuple(range(8)))]


def test_start_level_rack_starts_at_rack() -> None:
    m = master(spec(16, start=LocalityLevel.RACK), [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r1", 6)])
    assert m.level is LocalityLevel.RACK and len(m.asks()) == 3


# ---------------------------------------------------------------- modes

def test_strict_never_relaxes_past_the_best_satisfiable_level() -> None:
    m = master(spec(16, mode=LocalityMode.STRICT), [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r2", 8)])
    now = 0.0
    for _ in range(6):
        now += 60.0
        m.step(now)
        assert m.phase is Phase.BACKOFF
        assert "then trying packed again (locality strict" in m.waiting_reason(now)
        now = m.backoff_until
        m.step(now)
        assert m.level is LocalityLevel.PACKED and m.phase is Phase.PLANNING
    assert "locality strict" in m.waiting_reason(now)
    m.on_view([srv("a", "r1", 8), srv("b", "r1", 8), srv("c", "r2", 8)], now)
    assert sorted(n for n, _, _ in m.asks()) == ["a", "b"] and m.plan is not None
    assert m.plan.level is LocalityLevel.PACKED


def test_strict_holds_at_the_first_satisfiable_level_after_a_skip() -> None:
    m = master(spec(48, mode=LocalityMode.STRICT, start=LocalityLevel.NODE), racks(2, 4))
    assert m.level is LocalityLevel.ANY                 # no rack holds 48 GPUs: `any` is the best there is
    m.step(60.0)
    m.step(m.backoff_until)
    assert m.level is LocalityLevel.ANY


def test_strict_catch_up_skips_idle_cycles_at_its_own_level() -> None:
    m = master(spec(16, mode=LocalityMode.STRICT), racks(2, 4))
    m.catch_up(100_000.0)
    assert m.level is LocalityLevel.PACKED and m.attempt.level == "packed"
    assert m.phase in (Phase.BACKOFF, Phase.PLANNING)


def test_any_starts_at_any_whatever_the_start_level() -> None:
    m = master(spec(16, mode=LocalityMode.ANY, start=LocalityLevel.NODE),
               [srv("a", "r1", 6), srv("b", "r1", 6), srv("c", "r2", 4)])
    assert m.level is LocalityLevel.ANY and m.phase is Phase.ACQUIRING
    assert sum(g for _, g, _ in m.asks()) == 16


def test_prefer_is_the_default_and_relaxes_one_level_at_a_time() -> None:
    assert Locality().mode is LocalityMode.PREFER
    m = master(spec(16, start=LocalityLevel.NODE), [srv("a", "r1", 6, 16), srv("b", "r1", 6, 16)])
    assert m.level is LocalityLevel.NODE
    m.step(60.0)
    m.step(m.backoff_until)
    assert m.level is LocalityLevel.PACKED


# ---------------------------------------------------------------- user errors

def launched(m: Master, now: float) -> Launch:
    for k, (node, _gpus, idx) in enumerate(m.asks()):
        m.on_grant(Held(f"c{k}", node, "r1", f"h-{node}", 1, idx), now)
    (launch,) = [a for a in m.take_actions() if isinstance(a, Launch)]
    return launch


def test_command_not_found_at_launch_fails_the_job_at_once() -> None:
    m = master(spec(8, retries=3), [srv("a", "r1", 8), srv("b", "r1", 8)])
    launch = launched(m, 0.0)
    (h, _, _), = launch.learners
    m.on_started(h.container_id, False, 0, "cannot start 'trian': command not found", False, 1.0,
                 user_error=True)
    m.step(1.0)
    assert m.final is not None and m.final.state is JobState.FAILED
    assert "command not found" in m.final.diagnostics and "not retried" in m.final.diagnostics
    assert len(m.attempts) == 1 and m.attempts[0].failure is FailureKind.USER
    assert not m.avoid                               # the node did nothing wrong


def test_a_shell_127_reported_as_a_user_error_fails_the_job_at_once() -> None:
    m = master(spec(8, retries=3), [srv("a", "r1", 8)])
    launch = launched(m, 0.0)
    (h, _, _), = launch.learners
    m.on_started(h.container_id, True, 10, "", False, 0.5)
    m.on_ended(Ended(h.container_id, 127, user_error=True,
                     diagnostics="exited with code 127: the shell could not find the command"), 1.0)
    assert m.final is not None and m.final.exit_code == 127 and len(m.attempts) == 1
    assert "could not find the command" in m.final.diagnostics


def test_a_start_failure_without_the_user_error_mark_is_still_retried() -> None:
    m = master(spec(8, retries=3), [srv("a", "r1", 8), srv("b", "r1", 8)])
    launch = launched(m, 0.0)
    (h, _, _), = launch.learners
    m.on_started(h.container_id, False, 0, "the container's launcher died", True, 1.0)
    m.step(1.0)
    assert m.final is None and m.attempt.number == 2 and h.node_id in m.avoid
