"""rm.yaml `scheduler:`: reservations (no size starves) and the history the estimates and gittins learn from.
Files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.rm.config import load_rm_config
from gpurm.rm.sched.history import DEFAULT_CONDITIONING, Finished
from gpurm.rm.state.messages import RESERVATIONS, RESERVE_AFTER_S, RESERVE_BEHIND


def rm_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rm.yaml"
    path.write_text(text)
    return path


def test_the_defaults(tmp_path: Path) -> None:
    s = load_rm_config(rm_yaml(tmp_path, "listen: 127.0.0.1:7070\n")).settings
    assert (s.reservations, s.reserve_after_s, s.reserve_behind) == (RESERVATIONS, RESERVE_AFTER_S, RESERVE_BEHIND)
    assert (s.history_conditioning, s.history_prior) == (DEFAULT_CONDITIONING, ())


def test_the_scheduler_section_is_read_and_the_prior_is_found_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "prior.csv").write_text("queue,user,name,gpus,duration_s\nnlp,ann,bert,2,300\n")
    s = load_rm_config(rm_yaml(tmp_path, "scheduler: {reservations: 3, reserve_after: 10m, reserve_behind: 1.5, "
                                         "history: {group_by: queue, prior: prior.csv}}\n")).settings
    assert (s.reservations, s.reserve_after_s, s.reserve_behind, s.history_conditioning) == (3, 600.0, 1.5, "queue")
    assert s.history_prior == (Finished("root.nlp", "ann", "bert", 2.0, 600.0),)


@pytest.mark.parametrize(("text", "problem"), [
    ("scheduler: {reservations: -1}", "scheduler.reservations"),
    ("scheduler: {reservations: 1000}", "scheduler.reservations"),
    ("scheduler: {reserve_after: soon}", "scheduler.reserve_after"),
    ("scheduler: {reserve_behind: -1}", "scheduler.reserve_behind"),
    ("scheduler: {reserve_behind: 1000}", "scheduler.reserve_behind"),
    ("scheduler: {history: {group_by: team}}", "must be one of none, gpus, queue, full"),
    ("scheduler: {history: {prior: missing.csv}}", "cannot read it"),
    ("scheduler: {history: {prior: 3}}", "scheduler.history.prior"),
    ("scheduler: {history: {size: 3}}", "size"),
])
def test_bad_values_are_refused_with_the_field_named(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_rm_config(rm_yaml(tmp_path, text + "\n"))
    assert problem in "; ".join(exc.value.problems)
