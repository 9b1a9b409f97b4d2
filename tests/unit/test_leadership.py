"""rm/server/leadership.py's term timing (pure: the clock is passed in) and rm.yaml `ha:`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.server.leadership import Term


def test_a_standby_neither_renews_nor_steps_down() -> None:
    term = Term(ttl_s=6.0)
    assert not term.leading and not term.renew_due(100.0) and not term.must_step_down(100.0)


def test_a_leader_renews_every_third_of_its_lease() -> None:
    term = Term(ttl_s=6.0)
    term.took(7, sent_at=10.0)
    assert term.leading and term.epoch == 7
    assert not term.renew_due(11.9)
    assert term.renew_due(12.0)
    term.renewed(sent_at=12.0)
    assert not term.renew_due(13.9) and term.renew_due(14.0)


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_can_end() -> None:
    term = Term(ttl_s=5.0)
    term.took(1, sent_at=0.0)
    # Renewals fail from here on: the lease (counted from when the take was sent) ends at 5 s at the earliest.
    assert not term.must_step_down(3.9)
    assert term.must_step_down(4.0)
    term.lost()
    assert not term.leading and not term.must_step_down(4.0)


def test_a_renewal_is_never_waited_on_past_the_step_down_moment() -> None:
    # A renewal hung on a cut-off database (packets dropped, no error) is given up at the step-down moment, so
    # the leader steps down on time instead of a third of a lease later (tests/integration/test_ha_store_cut.py).
    term = Term(ttl_s=3.0)
    term.took(1, sent_at=10.0)
    assert abs(term.step_down_in(11.9) - 0.5) < 1e-9 and term.step_down_in(12.4) == 0.0
    term.renewed(12.0)
    assert abs(term.step_down_in(12.0) - 2.4) < 1e-9


def rm_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(text)
    return path


def test_ha_is_off_by_default_and_read_when_given(tmp_path: Path) -> None:
    assert not load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).ha.enabled
    ha = load_rm_config(rm_yaml(tmp_path, "ha: {enabled: true, lease: 3s}\n"
                                          "store: {url: 'postgresql://gpurm@db:5432/gpurm'}\n")).ha
    assert ha.enabled and ha.lease_s == 3.0


@pytest.mark.parametrize(("text", "field"), [("ha: {lease: 100ms}\n", "ha.lease"), ("ha: {enabled: 1}\n", "ha.enabled"),
                                             ("ha: {leader: me}\n", "ha.leader"),
                                             ("ha: {enabled: true}\n", "needs a PostgreSQL store")])
def test_a_bad_ha_section_is_refused_naming_its_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_rm_config(rm_yaml(tmp_path, text))
    assert field in "; ".join(err.value.problems)
