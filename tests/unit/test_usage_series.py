"""Usage series: the line format (rightsize/series.py) and the agent's bounded file (nodeagent/series.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpurm.nodeagent.series import ContainerSeries
from gpurm.rightsize.series import Sample, SeriesError, format_series, parse_series


def test_lines_round_trip() -> None:
    samples = [Sample(0.0, 0.5, 100.0, None), Sample(15.0, 3.25, 2048.5, 87.5)]
    assert parse_series(format_series(samples)) == samples


@pytest.mark.parametrize(("text", "message"), [
    ('{"t":0,"cpu":1,"mem_mib":1,"gpu":null}\nnot json\n', "line 2: not JSON"),
    ('{"t":0,"cpu":-1,"mem_mib":1}\n', "line 1: 'cpu' must be a number >= 0"),
    ('{"t":0,"cpu":1}\n', "'mem_mib' must be a number"),
    ('{"t":0,"cpu":1,"mem_mib":"big"}\n', "'mem_mib' must be a number"),
    ('[1,2]\n', "expected an object"),
    ('{"t":5,"cpu":1,"mem_mib":1}\n{"t":4,"cpu":1,"mem_mib":1}\n', "goes back in time"),
    ('{"t":0,"cpu":1,"mem_mib":1,"pad":"' + "x" * 300 + '"}\n', "longer than 200"),
])
def test_bad_series_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(SeriesError, match=message):
        parse_series(text)


def test_series_file_keeps_the_newest_samples_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    s = ContainerSeries(path, max_samples=5)
    for i in range(23):
        s.add(100.0 + i, float(i), 10.0 * i, None)
        lines = path.read_text().splitlines()
        assert len(lines) <= 10                    # never more than twice the cap
    assert [x.cpu for x in s.samples] == [18.0, 19.0, 20.0, 21.0, 22.0]
    on_disk = parse_series(path.read_text())
    assert on_disk[-1] == s.samples[-1]
    assert on_disk[-1].t == 22.0                   # seconds since the first sample
    assert [x.cpu for x in on_disk] == [float(i) for i in range(23 - len(on_disk), 23)]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    path = tmp_path / "usage.jsonl"
    os.symlink(target, path)
    s = ContainerSeries(path, max_samples=3)
    s.add(0.0, 1.0, 1.0, None)
    s.add(1.0, 1.0, 1.0, None)
    assert target.read_text() == "precious\n"
    assert len(s.samples) == 2                     # kept in memory all the same


def test_in_memory_only_without_a_path() -> None:
    s = ContainerSeries(None, max_samples=2)
    for i in range(4):
        s.add(float(i), 1.0, 1.0, 50.0)
    assert [x.t for x in s.samples] == [2.0, 3.0]
    with pytest.raises(ValueError):
        ContainerSeries(None, max_samples=0)
