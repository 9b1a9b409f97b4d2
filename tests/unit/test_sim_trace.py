"""Trace loaders: values, order, re-basing, windows, the joblog rules, and one test per kind of bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpurm.sim.trace import TraceError, load_trace, split_window, tile
from tests.conftest import philly_data

DATA = Path(__file__).resolve().parents[1] / "data" / "sim"
T0 = datetime(2017, 10, 2, tzinfo=UTC).timestamp()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rejects(path: Path, fmt: str, line: int | None, field: str, *, window: tuple[str, str] | None = None,
            reason: str = "") -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path, fmt, window)
    where = f"{path}:{line}" if line is not None else str(path)
    message = str(info.value)
    assert message.startswith(f"{where}: {field}: "), message
    assert reason in message
    return info.value


# ----------------------------------------------------------------------------------------------- philly-csv


def test_philly_csv_values_sorted_and_rebased() -> None:
    trace = load_trace(DATA / "philly_small.csv", "philly-csv")
    assert [(j.job_id, j.submit_s, j.gpus, j.duration_s, j.queue, j.line) for j in trace.jobs] == [
        ("t3", 0.0, 8, 3600.0, "q2", 3),
        ("t2", 600.0, 1, 600.0, "q1", 2),  # same time as t5: the earlier line first
        ("t5", 600.0, 4, 100.5, "q2", 5),
        ("t4", 129600.0, 2, 1.0, "q1", 4),  # duration 0 runs as 1 s ...
        ("t6", 172800.0, 16, 7200.0, "research.nlp", 6),
    ]
    assert trace.fixed == [(4, "duration: 0 s, run as 1 s")]  # ... and says so
    assert trace.skipped == []
    assert trace.start_epoch == T0
    assert trace.gpu_seconds() == 8 * 3600 + 600 + 4 * 100.5 + 2 * 1.0 + 16 * 7200
    assert trace.span_s == 172800.0
    assert trace.queues() == ["q1", "q2", "research.nlp"]


def test_tile_repeats_the_trace_back_to_back_with_new_ids() -> None:
    trace = load_trace(DATA / "philly_small.csv", "philly-csv")
    tiled = tile(trace, 3)
    n = len(trace.jobs)
    assert len(tiled.jobs) == 3 * n
    period = 172800.0 + 43200.0         # the span, then its mean gap between the 5 submissions (172800 / 4)
    for k in range(3):
        copy = tiled.jobs[k * n:(k + 1) * n]
        assert [j.submit_s for j in copy] == [j.submit_s + k * period for j in trace.jobs]
        assert [(j.gpus, j.duration_s, j.queue) for j in copy] == [(j.gpus, j.duration_s, j.queue) for j in trace.jobs]
        assert [j.job_id for j in copy] == [j.job_id + (f"~{k}" if k else "") for j in trace.jobs]
    assert len({j.job_id for j in tiled.jobs}) == 3 * n
    assert [j.submit_s for j in tiled.jobs] == sorted(j.submit_s for j in tiled.jobs)
    assert tiled.queues() == trace.queues()
    assert tiled.gpu_seconds() == 3 * trace.gpu_seconds()
    # The same offered work per second of submissions: the load factor on a cluster is the original's.
    assert tiled.gpu_seconds() / (tiled.span_s + period - trace.span_s) == trace.gpu_seconds() / period
    assert tile(trace, 1) is trace
    with pytest.raises(ValueError, match="copies"):
        tile(trace, 0)


def test_philly_csv_window_by_dates() -> None:
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("2017-10-02 00:05", "2017-10-03"))
    assert [(j.job_id, j.submit_s) for j in trace.jobs] == [("t2", 0.0), ("t5", 0.0)]
    assert trace.start_epoch == T0 + 600
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("2017-10-03T12:00:00", "2017-10-04"))
    assert [j.job_id for j in trace.jobs] == ["t4"]  # START is inside, END is outside
    assert trace.fixed == [(4, "duration: 0 s, run as 1 s")]
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("2017-10-02", "2017-10-03 11:59"))
    assert trace.fixed == []  # notes about jobs outside the window are left out


def test_philly_csv_window_by_offsets() -> None:
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("36h", ""))
    assert [(j.job_id, j.submit_s) for j in trace.jobs] == [("t4", 0.0), ("t6", 43200.0)]
    assert trace.start_epoch == T0 + 36 * 3600
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("0", "1d"))
    assert [j.job_id for j in trace.jobs] == ["t3", "t2", "t5"]
    trace = load_trace(DATA / "philly_small.csv", "philly-csv", ("601", "172800"))
    assert [j.job_id for j in trace.jobs] == ["t4"]


def test_real_philly_table_loads() -> None:
    trace = load_trace(philly_data("jobs-2017-10-02_to_10-15.csv"), "philly-csv")
    assert len(trace.jobs) == 24137
    assert trace.jobs[0].submit_s == 0.0
    assert max(j.gpus for j in trace.jobs) == 32
    assert len(trace.queues()) == 11
    assert trace.fixed == [] and trace.skipped == []  # no zero-duration rows in this window
    assert trace.gpu_seconds() / 3600 == pytest.approx(172_605.6, abs=0.1)
    assert trace.start_epoch == datetime(2017, 10, 2, 0, 1, 55, tzinfo=UTC).timestamp()
    day = load_trace(philly_data("jobs-2017-10-02_to_10-15.csv"), "philly-csv", ("2017-10-05", "2017-10-06"))
    assert len(day.jobs) == 3205
    assert day.jobs[0].submit_s == 0.0 and day.jobs[-1].submit_s < 86400


# ------------------------------------------------------------------------------------------------- tiresias


def test_tiresias_values() -> None:
    trace = load_trace(DATA / "tiresias_small.csv", "tiresias")
    assert [(j.job_id, j.submit_s, j.gpus, j.duration_s, j.queue, j.name) for j in trace.jobs] == [
        ("1", 0.0, 8, 147.0, "default", "vgg11"),
        ("0", 20.0, 1, 164.0, "default", "vgg19"),
        ("2", 43.0, 2, 127.0, "default", "inception4"),
    ]
    assert trace.start_epoch is None


def test_tiresias_queue_and_user_columns() -> None:
    trace = load_trace(DATA / "tiresias_queues.csv", "tiresias")
    assert [(j.job_id, j.queue, j.user) for j in trace.jobs] == [("a", "research.nlp", "alice"), ("b", "prod", "bob")]


def test_tiresias_window_offsets_only() -> None:
    trace = load_trace(DATA / "tiresias_small.csv", "tiresias", ("15", "1m"))
    assert [(j.job_id, j.submit_s) for j in trace.jobs] == [("0", 0.0), ("2", 23.0)]
    err = rejects(DATA / "tiresias_small.csv", "tiresias", None, "--window", window=("2017-10-02", ""))
    assert "no dates" in str(err)


# ---------------------------------------------------------------------------------------------------- jsonl


def test_jsonl_values_defaults_and_comments() -> None:
    trace = load_trace(DATA / "jobs_small.jsonl", "jsonl")
    assert [(j.job_id, j.submit_s, j.gpus, j.duration_s, j.queue, j.user, j.name, j.line) for j in trace.jobs] == [
        ("t4", 0.0, 1, 7200.0, "default", "", "", 4),
        ("j1", 50.0, 4, 3600.0, "research.nlp", "alice", "bert", 2),
        ("7", 50.0, 2, 60.5, "prod", "", "", 5),
    ]
    assert trace.start_epoch is None


# -------------------------------------------------------------------------------------------- philly-joblog


def test_philly_joblog_duration_and_gpu_rules() -> None:
    trace = load_trace(DATA / "joblog_small.json", "philly-joblog")
    jobs = {j.job_id: j for j in trace.jobs}
    assert [j.job_id for j in trace.jobs] == ["first", "still_running", "backwards_attempt",
                                              "application_1506638472019_14199"]
    assert trace.start_epoch == T0
    # Two attempts of 8 GPUs: 74 s + 2 d 05:39:42 of run time.
    big = jobs["application_1506638472019_14199"]
    assert (big.gpus, big.duration_s, big.queue, big.user, big.line) == (8, 74 + 193182, "ee9e8c", "ce2f4c", 1)
    assert big.submit_s == datetime(2017, 10, 7, 1, 11, 39, tzinfo=UTC).timestamp() - T0
    # The last attempt (still running, no end) sets the GPUs (8, not the first attempt's 2 + 2) but adds no time.
    assert (jobs["still_running"].gpus, jobs["still_running"].duration_s) == (8, 600.0)
    # An attempt that ends before it starts is ignored, and noted.
    assert jobs["backwards_attempt"].duration_s == 1800.0
    assert trace.fixed == [(6, "attempts[0]: end_time before start_time, attempt ignored")]
    assert trace.skipped == [
        (2, "no attempts (never ran)"),
        (4, "no submitted_time"),
        (5, "no attempt with both start_time and end_time"),
    ]


def test_philly_joblog_window_filters_skipped_too() -> None:
    trace = load_trace(DATA / "joblog_small.json", "philly-joblog", ("2017-10-02 02:00", "2017-10-03"))
    assert [(j.job_id, j.submit_s) for j in trace.jobs] == [("backwards_attempt", 0.0)]
    assert trace.start_epoch == T0 + 6 * 3600
    # the job without a submission time cannot be placed outside the window, so it is always listed
    assert trace.skipped == [(2, "no attempts (never ran)"), (4, "no submitted_time"),
                             (5, "no attempt with both start_time and end_time")]
    trace = load_trace(DATA / "joblog_small.json", "philly-joblog", ("2017-10-02 05:00", "2017-10-03"))
    assert trace.skipped == [(4, "no submitted_time")]


# --------------------------------------------------------------------------------------------- bad input


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
GOOD_ROW = "2017-10-02 00:00:00,60,1,60,q1\n"


def test_rejects_non_numeric_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + GOOD_ROW + "2017-10-02 00:01:00,60,two,120,q1\n")
    rejects(path, "philly-csv", 3, "num_gpus", reason="whole number")


def test_rejects_fractional_gpus_above_one(tmp_path: Path) -> None:
    # A fraction below one is a share of one GPU (tests/unit/test_shared_gpus.py); above one, whole GPUs only.
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpus": 2.5, "duration": 60}\n')
    rejects(path, "jsonl", 1, "gpus", reason="ask for whole GPUs")


def test_rejects_gpus_below_one(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + GOOD_ROW + "2017-10-02 00:01:00,60,0,0,q1\n")
    rejects(path, "philly-csv", 3, "num_gpus", reason="at least 1")


def test_rejects_negative_duration(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + "2017-10-02 00:01:00,-5,1,-5,q1\n")
    rejects(path, "philly-csv", 2, "duration", reason="negative")


def test_rejects_non_numeric_duration(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,duration\n1,1,0,long\n")
    rejects(path, "tiresias", 2, "duration", reason="number")


def test_rejects_bad_timestamp(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + GOOD_ROW + "10/02/2017 00:01,60,1,60,q1\n")
    rejects(path, "philly-csv", 3, "timestamp", reason="2017-10-02 00:01:55")


def test_rejects_impossible_date(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + "2017-02-30 00:00:00,60,1,60,q1\n")
    rejects(path, "philly-csv", 2, "timestamp")


def test_rejects_gpu_time_mismatch(tmp_path: Path) -> None:
    ok = "2017-10-02 00:01:00,100,4,403,q1\n"  # within 1 %
    path = write(tmp_path, "t.csv", PHILLY_HEADER + ok + "2017-10-02 00:02:00,100,4,100,q1\n")
    rejects(path, "philly-csv", 3, "gpu_time", reason="duration x num_gpus")


def test_rejects_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "timestamp,duration,num_gpus,cluster\n2017-10-02 00:00:00,60,1,q1\n")
    rejects(path, "philly-csv", 1, "header", reason="missing column(s) gpu_time")


def test_rejects_wrong_header_for_format(tmp_path: Path) -> None:
    err = rejects(DATA / "tiresias_small.csv", "philly-csv", 1, "header")
    assert "is --format right?" in str(err)


def test_rejects_short_row(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + GOOD_ROW + "2017-10-02 00:00:00,60,1\n")
    rejects(path, "philly-csv", 3, "row", reason="expected 5 fields")


def test_rejects_empty_file(tmp_path: Path) -> None:
    rejects(write(tmp_path, "t.csv", ""), "philly-csv", 1, "header", reason="empty")


def test_rejects_file_without_jobs(tmp_path: Path) -> None:
    rejects(write(tmp_path, "t.jsonl", "# nothing yet\n\n"), "jsonl", None, "jobs")


def test_rejects_unknown_format(tmp_path: Path) -> None:
    rejects(DATA / "philly_small.csv", "philly", None, "--format", reason="philly-csv")


def test_rejects_missing_file(tmp_path: Path) -> None:
    rejects(tmp_path / "nope.csv", "philly-csv", None, "file")


def test_rejects_bad_queue_name(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + "2017-10-02 00:00:00,60,1,60,research/nlp\n")
    rejects(path, "philly-csv", 2, "cluster", reason="dot-separated")
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpus": 1, "duration": 60, "queue": "research..nlp"}\n')
    rejects(path, "jsonl", 1, "queue")


def test_rejects_duplicate_id(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,duration\n1,1,0,60\n2,1,5,60\n1,2,9,60\n")
    rejects(path, "tiresias", 4, "job_id", reason="first on line 2")


def test_reports_only_the_first_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", PHILLY_HEADER + GOOD_ROW + "2017-10-02 00:01:00,60,0,0,q1\n"
                 + "garbage,x,y,z,q1\n")
    err = rejects(path, "philly-csv", 3, "num_gpus")
    assert ":4:" not in str(err)
    assert (err.line, err.field) == (3, "num_gpus")


def test_jsonl_rejects_invalid_json(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpus": 1, "duration": 60}\n{"submit": 1,\n')
    rejects(path, "jsonl", 2, "json", reason="not valid JSON")


def test_jsonl_rejects_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpu": 1, "duration": 60}\n')
    rejects(path, "jsonl", 1, "gpu", reason="unknown field")


def test_jsonl_rejects_missing_key(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpus": 1}\n')
    rejects(path, "jsonl", 1, "duration", reason="required")


def test_jsonl_rejects_non_object(tmp_path: Path) -> None:
    rejects(write(tmp_path, "t.jsonl", "[1, 2]\n"), "jsonl", 1, "json", reason="object")


def test_jsonl_rejects_bad_duration_string(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"submit": 0, "gpus": 1, "duration": "soon"}\n')
    rejects(path, "jsonl", 1, "duration")


def test_joblog_rejects_non_array(tmp_path: Path) -> None:
    rejects(write(tmp_path, "log.json", '{"jobs": []}'), "philly-joblog", 1, "json", reason="array")


def test_joblog_rejects_bad_time(tmp_path: Path) -> None:
    path = write(tmp_path, "log.json", '[{"vc": "a", "jobid": "j", "submitted_time": "2017-10-02 00:00:00",'
                 ' "attempts": [{"start_time": "yesterday", "end_time": null, "detail": []}]}]')
    rejects(path, "philly-joblog", 1, "attempts[0].start_time")


def test_joblog_rejects_missing_vc(tmp_path: Path) -> None:
    path = write(tmp_path, "log.json", '[{"jobid": "j", "submitted_time": "2017-10-02 00:00:00", "attempts": []}]')
    rejects(path, "philly-joblog", 1, "vc", reason="required")


def test_joblog_rejects_bad_gpu_list(tmp_path: Path) -> None:
    path = write(tmp_path, "log.json", '[{"vc": "a", "jobid": "j", "submitted_time": "2017-10-02 00:00:00",'
                 ' "attempts": [{"start_time": null, "end_time": null, "detail": [{"ip": "m1", "gpus": 4}]}]}]')
    rejects(path, "philly-joblog", 1, "attempts[0].detail[0].gpus")


def test_joblog_rejects_invalid_json(tmp_path: Path) -> None:
    rejects(write(tmp_path, "log.json", '[\n{"vc": "a",\n'), "philly-joblog", 3, "json")


@pytest.mark.parametrize("window", [("tomorrow", ""), ("2d", "1d"), ("1d", "1d"), ("2017-11-01", "2017-11-02")])
def test_rejects_bad_window(window: tuple[str, str]) -> None:
    rejects(DATA / "philly_small.csv", "philly-csv", None, "--window", window=window)


def test_split_window() -> None:
    assert split_window("2017-10-03,2017-10-05") == ("2017-10-03", "2017-10-05")
    assert split_window("2d,") == ("2d", "")
    for bad in ("2d", "1,2,3"):
        with pytest.raises(ValueError, match="--window"):
            split_window(bad)


def test_gzip_and_byte_order_mark(tmp_path: Path) -> None:
    import gzip

    text = (DATA / "philly_small.csv").read_bytes()
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(text))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + text)
    plain = load_trace(DATA / "philly_small.csv", "philly-csv").jobs
    assert load_trace(tmp_path / "t.csv.gz", "philly-csv").jobs == plain
    assert load_trace(tmp_path / "bom.csv", "philly-csv").jobs == plain
