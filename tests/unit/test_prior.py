"""The history's prior (rm/sched/prior.py): a CSV of finished jobs, read with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.rm.sched.history import Features, Finished, History
from gpurm.rm.sched.prior import PriorError, load_prior


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prior.csv"
    p.write_text(text)
    return p


def test_sizes_durations_and_a_sim_jobs_csv_are_read(tmp_path: Path) -> None:
    p = write(tmp_path, "queue,user,name,gpus,size_gpu_s,duration_s,run_s,state\n"
                        "research.nlp,ann,bert,2,400,,,SUCCEEDED\n"
                        "root.vision,bob,,4,,100,,KILLED\n"
                        "vision,,,1,,,50,FAILED\n"
                        "vision,,,1,,,50,UNFINISHED\n"
                        "vision,,,0,,,50,SUCCEEDED\n")
    assert load_prior(p) == (Finished("root.research.nlp", "ann", "bert", 2.0, 400.0),
                             Finished("root.vision", "bob", "", 4.0, 400.0),
                             Finished("root.vision", "", "", 1.0, 50.0))


def test_the_history_learns_the_prior() -> None:
    h = History()
    h.learn_all([Finished("root.q", "u", "n", 1.0, 100.0 * (k + 1)) for k in range(60)])
    # The mean of 100 s .. 6,000 s: learned from the prior, not the hour assumed without any history.
    assert h.remaining_s(Features("root.q", "u", "n", 1.0), 0.0) == pytest.approx(3050.0)


@pytest.mark.parametrize(("text", "says"), [
    ("queue,size\nq,1\n", "needs a header with `gpus`"),
    ("gpus,duration_s\n1,abc\n", "line 2: duration_s must be a number"),
    ("gpus,duration_s\nx,1\n", "gpus must be a number"),
    ("gpus,duration_s\n1,inf\n", "must be finite"),
])
def test_bad_files_name_the_line_and_the_field(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(PriorError, match=says):
        load_prior(write(tmp_path, text))


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PriorError, match="cannot read it"):
        load_prior(tmp_path / "nope.csv")
