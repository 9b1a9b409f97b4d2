"""rm/state/heartbeats.py: the heartbeat interval the RM names grows with the fleet so that the fleet beats at most
heartbeat.max_rate times a second; the lease and the LOST expiry follow it, and a shorter interval never shortens
the expiry before the agents can have heard of it. Pure: the fleet's size and the clock are passed in."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.gpus import GpuRecord
from gpurm.common.lease import fence_timing
from gpurm.rm.config import load_rm_config
from gpurm.rm.state import resync
from gpurm.rm.state.core import NodeRegistration, RMCore, RMSettings
from gpurm.rm.state.heartbeats import SHRINK_AFTER_S, BeatPacing, paced_interval, terms_at


def settings(**kw: float) -> RMSettings:
    base = {"heartbeat_interval_s": 1.0, "missed_beats": 10, "heartbeat_max_rate": 2000.0,
            "heartbeat_max_interval_s": 30.0}
    return RMSettings(**{**base, **kw})   # type: ignore[arg-type]


# ---------------------------------------------------------------- the rule


def test_a_small_fleet_beats_at_the_configured_interval_and_a_big_one_at_the_rate() -> None:
    assert paced_interval(1.0, 10, 2000, 30) == 1.0
    assert paced_interval(1.0, 2000, 2000, 30) == 1.0            # exactly max_rate x interval servers
    assert paced_interval(1.0, 20_000, 2000, 30) == 10.0          # 20,000 servers beat 2,000 times a second
    assert paced_interval(1.0, 20_001, 2000, 30) == 10.5          # in steps: not a new interval per registration
    assert paced_interval(3.0, 20_000, 2000, 30) == 10.0
    for nodes in range(0, 100_000, 997):
        interval = paced_interval(1.0, nodes, 2000, 30)
        assert nodes / interval <= 2000 or interval == 30.0, nodes


def test_the_interval_is_capped_never_below_the_base_and_fixed_without_a_rate() -> None:
    assert paced_interval(1.0, 1_000_000, 2000, 30) == 30.0
    assert paced_interval(1.0, 20_000, 0, 30) == 1.0               # max_rate 0: a fixed interval
    assert paced_interval(5.0, 100_000, 2000, 2.0) == 5.0          # a cap under the base does not shorten it
    assert paced_interval(1e15, 10_000, 2000, 30) == 1e15          # the simulator's "never"


def test_the_lease_and_expiry_scale_with_the_interval_and_pass_the_fence_check_at_every_interval() -> None:
    s = settings()
    t = terms_at(s, 10.0)
    assert (t.interval_s, t.expiry_s, t.lease_s, t.grace_s) == (10.0, 100.0, 65.0, 2.0)   # 6.5 s lease at 1 s
    assert (t.interval_ms, t.lease_ms, t.grace_ms) == (10_000, 65_000, 2000)
    # Any timing rm.yaml accepts at its base interval stays safe as the interval grows (the proof is in the
    # module's docstring): the agent's fence has stopped everything before the RM may call the node LOST.
    for interval, beats, lease, grace in ((1.0, 10, 0.0, 2.0), (1.0, 10, 5.0, 0.5), (0.3, 12, 0.0, 1.0),
                                          (3.0, 5, 0.0, 2.0), (2.0, 30, 40.0, 10.0)):
        base = fence_timing(interval, beats, lease, grace)
        assert base.problems() == [], (interval, beats, lease, grace)
        cfg = RMSettings(heartbeat_interval_s=interval, missed_beats=beats, agent_lease_s=base.lease_s,
                         fence_grace_s=grace)
        for k in (1.0, 1.5, 2.0, 3.3, 10.0, 100.0):
            scaled = terms_at(cfg, interval * k)
            check = fence_timing(scaled.interval_s, beats, scaled.lease_s, scaled.grace_s)
            assert check.problems() == [], (interval, beats, lease, grace, k)
            assert scaled.expiry_s >= scaled.lease_s + scaled.grace_s + scaled.interval_s + 0.5


# ---------------------------------------------------------------- following the fleet


def test_the_interval_grows_at_once_with_the_fleet() -> None:
    pacing = BeatPacing(settings())
    assert pacing.terms.interval_s == 1.0 and pacing.expiry_s(0.0) == 10.0
    assert not pacing.update(1500, now=0.0)
    assert pacing.update(20_000, now=1.0)
    assert pacing.terms.interval_s == 10.0 and pacing.expiry_s(1.0) == 100.0
    assert not pacing.update(20_000, now=2.0)


def test_it_shrinks_only_for_a_fleet_much_smaller_for_a_while_and_the_longer_expiry_holds_one_expiry() -> None:
    pacing = BeatPacing(settings())
    pacing.update(20_000, now=0.0)                               # 10 s, expiry 100 s
    assert not pacing.update(17_000, now=10.0)                   # 8.5 s wanted: inside the band, kept
    assert pacing.terms.interval_s == 10.0 and not pacing.shrinking
    assert not pacing.update(10_000, now=20.0)                   # 5 s wanted: a rack rebooting? wait
    assert pacing.shrinking
    assert not pacing.update(20_000, now=30.0)                   # it came back: nothing changed
    assert not pacing.shrinking
    assert not pacing.update(10_000, now=40.0)
    assert not pacing.update(10_000, now=40.0 + SHRINK_AFTER_S - 1)
    shrunk_at = 40.0 + SHRINK_AFTER_S
    assert pacing.update(10_000, now=shrunk_at)
    assert pacing.terms.interval_s == 5.0 and pacing.terms.expiry_s == 50.0
    # Agents still hold leases under the 10 s terms until they hear of the new ones: 100 s holds for 100 s.
    assert pacing.expiry_s(shrunk_at) == 100.0
    assert pacing.expiry_s(shrunk_at + 99.9) == 100.0
    assert pacing.expiry_s(shrunk_at + 100.0) == 50.0


def test_a_second_shrink_while_the_first_is_held_keeps_the_longest_expiry() -> None:
    pacing = BeatPacing(settings())
    pacing.update(60_000, now=0.0)                               # 30 s, expiry 300 s
    pacing.update(20_000, now=0.0)
    pacing.update(20_000, now=SHRINK_AFTER_S)                    # 10 s; 300 s held until 360
    assert pacing.terms.interval_s == 10.0
    pacing.update(4_000, now=SHRINK_AFTER_S + 1)
    pacing.update(4_000, now=2 * SHRINK_AFTER_S + 1)             # 2 s
    assert pacing.terms.interval_s == 2.0
    assert pacing.expiry_s(2 * SHRINK_AFTER_S + 1) == 300.0
    assert pacing.expiry_s(SHRINK_AFTER_S + 299) == 300.0
    assert pacing.expiry_s(SHRINK_AFTER_S + 300) == 20.0          # both held expiries over


def test_after_a_restart_the_interval_the_previous_rm_named_holds_its_expiry() -> None:
    pacing = BeatPacing(settings())
    pacing.update(4_000, now=100.0)                              # 2 s for the restored fleet
    pacing.restore(10.0, now=100.0)                              # the previous RM named 10 s
    assert pacing.terms.interval_s == 2.0
    assert pacing.expiry_s(150.0) == 100.0 and pacing.expiry_s(200.0) == 20.0
    pacing.restore(1.0, now=300.0)                               # shorter than in force: nothing to hold
    assert pacing.expiry_s(300.0) == 20.0


# ---------------------------------------------------------------- the core


def reg(node_id: str, follows: bool = True) -> NodeRegistration:
    return NodeRegistration(node_id=node_id, host="127.0.0.1", port=9000, rack="r1", ib_domain="r1",
                            gpus=[GpuRecord(index=0)], follows_interval=follows)


def fleet(n: int, s: RMSettings, now: float = 0.0) -> RMCore:
    core = RMCore(s)
    for i in range(n):
        core.register_node(reg(f"n{i}"), f"s{i}", now)
    return core


def test_the_core_paces_for_its_fleet_and_holds_nodes_to_the_expiry_in_force() -> None:
    core = fleet(10, settings(heartbeat_max_rate=2.0))           # 10 servers at 2 beats a second: 5 s
    core.tick(0.5)
    assert core.beats.terms.interval_s == 5.0 and core.meta()["heartbeat_interval_s"] == "5"
    for i in range(1, 10):
        core.node_heartbeat(f"n{i}", f"s{i}", [], 40.0)
    core.tick(45.0)                                              # n0 silent 45 s: under 10 x 5 s
    assert core.cluster.nodes["n0"].state.name == "RUNNING"
    core.tick(50.5)
    assert core.cluster.nodes["n0"].state.name == "LOST"
    assert "missed 10 heartbeats" in core.cluster.nodes["n0"].health_report


def test_an_agent_that_does_not_follow_keeps_the_expiry_its_registration_named() -> None:
    core = fleet(10, settings(heartbeat_max_rate=2.0))
    core.tick(0.5)                                               # 10 servers at 2 beats a second: 5 s
    core.register_node(reg("old", follows=False), "s-old", 1.0)  # named 5 s: it beats every 5 s for good
    assert core.cluster.nodes["old"].pinned_expiry_s == 50.0
    for i in range(5, 10):                                       # the fleet shrinks to 6: 3 s wanted
        core.mark_node_lost(f"n{i}", "test", 2.0)

    def beat(t: float) -> None:
        for i in range(5):
            core.node_heartbeat(f"n{i}", f"s{i}", [], t)

    beat(3.0)
    core.tick(3.0)
    beat(2.0 + SHRINK_AFTER_S)
    core.node_heartbeat("old", "s-old", [], 2.0 + SHRINK_AFTER_S)
    core.tick(3.0 + SHRINK_AFTER_S)                              # 3 s now; the 50 s expiry held for 50 s
    assert core.beats.terms.interval_s == 3.0
    t = 3.0 + SHRINK_AFTER_S + 55.0                              # past the held expiry: 30 s in force
    beat(t - 1)
    core.node_heartbeat("old", "s-old", [], t - 40)              # 40 s silent: over 30 s, under its own 50 s
    core.tick(t)
    assert core.beats.expiry_s(t) == 30.0
    assert core.cluster.nodes["old"].state.name == "RUNNING"
    assert all(core.cluster.nodes[f"n{i}"].state.name == "RUNNING" for i in range(5))
    beat(t + 10)
    core.tick(t + 10.5)
    assert core.cluster.nodes["old"].state.name == "LOST"


def test_a_restored_core_holds_the_stored_interval_and_its_grace_covers_the_paced_expiry() -> None:
    s = settings(heartbeat_max_rate=2.0)
    before = fleet(10, s)
    before.tick(0.5)
    nodes = list(before.cluster.nodes.values())
    after = RMCore(s)
    after.restore([], [], nodes, {**before.meta(), "heartbeat_interval_s": "12"}, now=100.0)
    assert after.beats.terms.interval_s == 5.0                   # paced for the 10 servers restored
    assert after.beats.expiry_s(100.0) == 120.0                  # ... the 12 s the previous RM named still holds
    assert after.resync_until == 100.0 + resync.grace_s(s, 10, 120.0)
    assert resync.grace_s(s, 10, 120.0) == 2 * 120 + resync.spread_s(10)


def test_a_stored_interval_that_is_not_a_number_is_ignored() -> None:
    after = RMCore(settings())
    after.restore([], [], [], {"heartbeat_interval_s": "soon"}, now=0.0)
    assert after.beats.expiry_s(0.0) == 10.0


# ---------------------------------------------------------------- rm.yaml


def rm_yaml(tmp_path: Path, heartbeat: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(f"heartbeat:\n{heartbeat}")
    return path


def test_rm_yaml_names_the_rate_and_the_longest_interval(tmp_path: Path) -> None:
    s = load_rm_config(Path(__file__).resolve().parents[2] / "configs" / "rm.yaml").settings
    assert (s.heartbeat_max_rate, s.heartbeat_max_interval_s) == (2000.0, 30.0)
    s = load_rm_config(rm_yaml(tmp_path, "  interval: 2s\n  max_rate: 500\n  max_interval: 1m\n")).settings
    assert (s.heartbeat_interval_s, s.heartbeat_max_rate, s.heartbeat_max_interval_s) == (2.0, 500.0, 60.0)
    assert load_rm_config(rm_yaml(tmp_path, "  max_rate: 0\n  max_interval: 10ms\n")).settings.heartbeat_max_rate == 0


@pytest.mark.parametrize(("text", "field", "why"), [
    ("  max_rate: -1\n", "heartbeat.max_rate", ""),
    ("  max_rate: lots\n", "heartbeat.max_rate", "must be a number"),
    ("  interval: 5s\n  missed_beats: 10\n  max_interval: 2s\n", "heartbeat.max_interval",
     "at least heartbeat.interval"),
    ("  max_interval: 2h\n", "heartbeat.max_interval", ""),
])
def test_rm_yaml_refuses_a_bad_rate_or_longest_interval_naming_the_field(tmp_path: Path, text: str, field: str,
                                                                         why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, text))
    assert any(field in p and why in p for p in err.value.problems), err.value.problems
