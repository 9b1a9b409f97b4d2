"""The fence's timing (gpurm/common/lease.py) and rm.yaml's check of it: a server cut off from the RM must have
stopped its learners before the RM may call it LOST. Pure: no clock, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.common.lease import Lease, agent_wait_s, beats_for_lease, fence_timing, takeover_lease_s
from gpurm.rm.config import load_rm_config
from gpurm.rm.server.leadership import takeover_within_s


def rm_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(text)
    return path


def test_the_default_lease_is_the_longest_the_expiry_allows() -> None:
    t = fence_timing(1.0, 10)
    assert (t.expiry_s, t.grace_s, t.margin_s, t.lease_s) == (10.0, 2.0, 1.5, 6.5)
    assert t.fenced_by_s == t.expiry_s and t.problems() == []


def test_a_lease_too_long_for_the_expiry_is_refused_with_the_missed_beats_needed() -> None:
    (problem,) = fence_timing(1.0, 10, lease_s=8.0).problems()
    assert problem[0] == "missed_beats"
    assert "8s" in problem[1] and "= 11.5s" in problem[1] and "missed_beats to 12 or more" in problem[1]


def test_a_lease_under_two_beats_is_refused() -> None:
    (problem,) = fence_timing(1.0, 5).problems()          # 5 - 2 - 1.5 = 1.5s: one late beat would fence
    assert problem[0] == "lease" and "two heartbeat intervals" in problem[1]


def test_rm_yaml_states_and_checks_the_fence(tmp_path: Path) -> None:
    s = load_rm_config(Path(__file__).resolve().parents[2] / "configs" / "rm.yaml").settings
    assert (s.heartbeat_interval_s, s.missed_beats, s.agent_lease_s, s.fence_grace_s) == (1.0, 10, 6.5, 2.0)
    derived = load_rm_config(rm_yaml(tmp_path, "heartbeat: {interval: 500ms, missed_beats: 20}\n")).settings
    assert derived.agent_lease_s == 7.0                          # 10 - 2 - (0.5 + 0.5)
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, "heartbeat: {interval: 1s, missed_beats: 10, lease: 9s}\n"))
    assert "heartbeat.missed_beats" in str(err.value) and "LOST" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, "heartbeat: {interval: 1s, missed_beats: 3}\n"))
    assert "heartbeat.lease" in str(err.value)


def test_a_lease_runs_from_the_send_time_of_what_the_rm_answered() -> None:
    lease = Lease()
    assert not lease.expired(1e9) and lease.left(0.0) is None    # never held: nothing to fence
    lease.set_terms(6.0, 2.0)
    lease.renew(10.0)
    assert lease.left(12.0) == 4.0 and not lease.expired(15.9) and lease.expired(16.0)
    lease.renew(9.0)                          # a late answer to an older beat never shortens it
    assert lease.expires_at == 16.0
    lease.renew(20.0)
    assert not lease.expired(25.0)


def test_an_rm_that_gives_no_lease_never_fences() -> None:
    lease = Lease()
    lease.set_terms(0.0, 0.0)
    lease.renew(1.0)
    assert lease.left(100.0) is None and not lease.expired(100.0)


def test_an_agent_waits_on_a_silent_rm_at_most_a_quarter_of_its_lease() -> None:
    assert agent_wait_s(0.0, 1.0, 8.0) == 8.0            # no lease (an older RM): the default
    assert agent_wait_s(12.0, 1.0, 8.0) == 3.0           # a quarter lease
    assert agent_wait_s(100.0, 1.0, 8.0) == 8.0          # never more than the default
    assert agent_wait_s(6.5, 1.0, 8.0) == 2.0            # never under two intervals ...
    assert agent_wait_s(0.8, 0.3, 5.9) == 1.0            # ... nor a second


def test_with_ha_the_lease_outlasts_a_takeover_and_missed_beats_defaults_to_allow_it(tmp_path: Path) -> None:
    ha = "ha: {enabled: true, lease: 3s}\nstore: {url: 'postgresql://gpurm@db:5432/gpurm'}\n"
    need = takeover_lease_s(takeover_within_s(3.0), 1.0)
    assert need == 2 * (3.0 + 1.0 + 2 * 1.0)
    s = load_rm_config(rm_yaml(tmp_path, ha)).settings
    assert s.agent_lease_s >= need and s.missed_beats == beats_for_lease(need, 1.0, 2.0) == 16
    assert fence_timing(1.0, s.missed_beats).problems() == []
    # Without ha the default stays 10.
    assert load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).settings.missed_beats == 10


@pytest.mark.parametrize(("extra", "field"), [("heartbeat: {missed_beats: 10}\n", "heartbeat.missed_beats"),
                                              ("heartbeat: {missed_beats: 30, lease: 8s}\n", "heartbeat.lease")])
def test_with_ha_a_lease_shorter_than_a_takeover_is_refused(tmp_path: Path, extra: str, field: str) -> None:
    ha = "ha: {enabled: true, lease: 3s}\nstore: {url: 'postgresql://gpurm@db:5432/gpurm'}\n"
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, ha + extra))
    text = "; ".join(err.value.problems)
    assert field in text and "outlast an RM takeover" in text and "missed_beats to 16 or more" in text
