"""Summary metrics worked out by hand, the timeline step integral, jobs.csv round trip, and the plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import cast

import pytest

from gpurm.sim.metrics import (
    JobResult,
    Timeline,
    load_factor,
    locality_class,
    percentile,
    read_jobs_csv,
    size_class,
    summarize,
    write_jobs_csv,
    write_queue_timeline_csv,
    write_summary,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CAPACITY = 10


def job(job_id: str, queue: str, gpus: int, submit: float, start: float | None, finish: float | None, *,
        servers: int = 1, fewest: int = 1, preemptions: int = 0, retries: int = 0, state: str = "SUCCEEDED",
        ) -> JobResult:
    served = gpus * (finish - start) if start is not None and finish is not None else 0.0
    return JobResult(job_id, queue, gpus, submit, start, finish, 50.0, 1 + preemptions + retries, preemptions,
                     retries, servers if start is not None else 0, fewest, served, state)


def hand_built() -> tuple[list[JobResult], Timeline]:
    """Five jobs on 10 GPUs; the timeline is what they held (keys as the engine writes them: root.<queue>)."""
    results = [
        job("A", "a", 1, 0, 0, 100),
        job("B", "a", 4, 0, 100, 300, servers=2),  # could have used one server: not local
        job("C", "b", 4, 50, 50, 250, preemptions=1),
        job("D", "b", 8, 200, None, None, state="UNFINISHED"),
        job("E", "c", 2, 10, 20, 400, retries=2, state="FAILED"),
    ]
    timeline = Timeline()
    for t, held in [
        (0, {"root.a": 1}),
        (20, {"root.a": 1, "root.c": 2}),
        (50, {"root.a": 1, "root.b": 4, "root.c": 2}),
        (100, {"root.a": 4, "root.b": 4, "root.c": 2}),
        (250, {"root.a": 4, "root.c": 2}),
        (300, {"root.c": 2}),
        (400, {}),
    ]:
        timeline.record(t, held)
    return results, timeline


def test_summary_by_hand() -> None:
    results, timeline = hand_built()
    s = summarize(results, timeline, CAPACITY, load_factor=0.75, wall_s=1.5, extra={"policy": "fifo"})
    assert (s["jobs"], s["finished"], s["unfinished"], s["gpus"]) == (5, 4, 1, CAPACITY)
    assert s["states"] == {"SUCCEEDED": 3, "FAILED": 1, "KILLED": 0, "REJECTED": 0, "UNFINISHED": 1}
    assert s["makespan_s"] == 400
    # JCTs of finished jobs: A 100, C 200, B 300, E 390 (nearest rank: p50 = 2nd of 4, p99 = 4th of 4).
    assert (s["avg_jct_s"], s["p50_jct_s"], s["p99_jct_s"]) == (247.5, 200, 390)
    # Queueing: A 0, C 0, E 10, B 100.
    assert (s["avg_queue_s"], s["p50_queue_s"], s["p99_queue_s"]) == (27.5, 0, 100)
    # Allocated GPU-seconds: 1x20 + 3x30 + 7x50 + 10x150 + 6x50 + 2x100 = 2460 of 10 x 400.
    assert s["gpu_seconds_allocated"] == 2460
    assert s["gpu_utilization"] == pytest.approx(0.615)
    assert s["locality"] == pytest.approx(2 / 3)  # B, C, E are multi-GPU and finished; B is spread
    assert (s["preemptions"], s["retries"]) == (1, 2)
    assert s["queue_by_size"] == {"1": 0.0, "2-4": pytest.approx(110 / 3), "5-8": None, ">8": None}
    assert s["jobs_by_size"] == {"1": 1, "2-4": 3, "5-8": 0, ">8": 0}
    assert (s["load_factor"], s["wall_s"], s["policy"], s["percentiles"]) == (0.75, 1.5, "fifo", "nearest-rank")

    per_queue = s["per_queue"]
    assert isinstance(per_queue, dict)
    assert sorted(per_queue) == ["a", "b", "c"]  # the timeline's root.a and the results' a are one queue
    a, b, c = per_queue["a"], per_queue["b"], per_queue["c"]
    assert (a["jobs"], a["avg_jct_s"], a["p50_jct_s"], a["p99_jct_s"]) == (2, 200, 100, 300)
    assert (a["avg_queue_s"], a["p99_queue_s"]) == (50, 100)
    assert (b["jobs"], b["finished"], b["avg_jct_s"], b["preemptions"]) == (2, 1, 200, 1)
    assert (c["p99_jct_s"], c["avg_queue_s"], c["retries"]) == (390, 10, 2)
    # a: 1x100 + 4x200 = 900, b: 4x200 = 800, c: 2x380 = 760 GPU-seconds.
    shares = {q: per_queue[q]["gpu_time_share"] for q in per_queue}
    assert shares == pytest.approx({"a": 900 / 2460, "b": 800 / 2460, "c": 760 / 2460})
    assert math.fsum(shares.values()) == pytest.approx(1.0)


def test_summary_refuses_to_overwrite_a_metric() -> None:
    results, timeline = hand_built()
    with pytest.raises(ValueError, match="locality"):
        summarize(results, timeline, CAPACITY, 1.0, 0.0, extra={"locality": 1.0})


def test_summary_of_nothing_finished() -> None:
    s = summarize([job("D", "b", 8, 0, None, None, state="UNFINISHED")], Timeline(), CAPACITY, 1.0, 0.0)
    assert (s["makespan_s"], s["gpu_utilization"], s["avg_jct_s"], s["p99_queue_s"], s["locality"]) == (
        0, 0.0, None, None, None)
    assert s["unfinished"] == 1


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (0, 1, 50, 99, 99.5, 100)] == [1, 1, 50, 99, 100, 100]
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_size_classes() -> None:
    assert [size_class(g) for g in (1, 2, 4, 5, 8, 9, 32)] == ["1", "2-4", "2-4", "5-8", "5-8", ">8", ">8"]
    assert [locality_class(g) for g in (1, 2, 4, 5, 8, 9, 16, 17, 32)] == \
        ["1", "2-4", "2-4", "5-8", "5-8", "9-16", "9-16", "17+", "17+"]


def test_timeline_record_and_integral() -> None:
    tl = Timeline()
    tl.record(10, {"a": 2})
    tl.record(10, {"a": 3})  # a second change at the same instant replaces the first
    tl.record(20, {"a": 1, "b": 4})  # a new queue is back-filled with zeros
    assert tl.times == [10, 20]
    assert tl.allocated == [3, 5]
    assert tl.per_queue == {"a": [3, 1], "b": [0, 4]}
    assert tl.integral(0, 30) == 3 * 10 + 5 * 10  # nothing before the first sample; the last holds on
    assert tl.integral(15, 25) == 3 * 5 + 5 * 5
    assert tl.integral(30, 30) == 0
    assert tl.queue_integrals(0, 30) == {"a": 40, "b": 40}
    with pytest.raises(ValueError, match="backwards"):
        tl.record(19, {})


def test_load_factor() -> None:
    assert load_factor(1000.0, 10, 50.0) == 2.0
    assert load_factor(1000.0, 10, 0.0) == math.inf
    with pytest.raises(ValueError):
        load_factor(1.0, 0, 1.0)


def test_write_summary(tmp_path: Path) -> None:
    results, timeline = hand_built()
    summary = summarize(results, timeline, CAPACITY, math.inf, 0.25)
    write_summary(tmp_path / "out", summary)
    text = (tmp_path / "out" / "summary.json").read_text()
    loaded = json.loads(text)
    assert loaded["load_factor"] is None  # JSON has no Infinity
    assert loaded["p99_jct_s"] == 390
    assert list(loaded) == sorted(loaded)
    assert '\n  "avg_jct_s": 247.5,' in text


def test_jobs_csv_round_trip(tmp_path: Path) -> None:
    results, _ = hand_built()
    results[0].submit_s = 0.1 + 0.2  # a float that needs every digit to come back equal
    write_jobs_csv(tmp_path, results)
    assert read_jobs_csv(tmp_path / "jobs.csv") == results
    with (tmp_path / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    assert rows[3]["job_id"] == "D" and rows[3]["start_s"] == "" and rows[3]["jct_s"] == ""
    assert (float(rows[4]["queue_s"]), float(rows[4]["jct_s"])) == (10, 390)


def test_read_jobs_csv_names_bad_cell(tmp_path: Path) -> None:
    results, _ = hand_built()
    write_jobs_csv(tmp_path, results)
    path = tmp_path / "jobs.csv"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace(",4,", ",four,", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"jobs\.csv:3: gpus"):
        read_jobs_csv(path)


def test_queue_timeline_csv(tmp_path: Path) -> None:
    _, timeline = hand_built()
    write_queue_timeline_csv(tmp_path, timeline)
    rows = list(csv.reader((tmp_path / "queue_timeline.csv").open()))
    assert rows[0] == ["time_s", "allocated", "root.a", "root.b", "root.c"]
    assert rows[4] == ["100", "10", "4", "4", "2"]
    assert len(rows) == 1 + len(timeline.times)


def test_plots_are_pngs(tmp_path: Path) -> None:
    from gpurm.sim.plots import write_plots

    results, timeline = hand_built()
    paths = write_plots(tmp_path / "plots", results, timeline, CAPACITY)
    assert [p.name for p in paths] == ["jct_cdf.png", "queue_delay_by_size.png", "utilization.png",
                                       "queue_shares.png", "locality.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_SIGNATURE
    placement = write_plots(tmp_path / "placement", results, timeline, CAPACITY, placement=True)
    assert placement[-1].name == "slowdown_cdf.png" and placement[-1].read_bytes()[:8] == PNG_SIGNATURE


def test_plots_of_an_empty_run(tmp_path: Path) -> None:
    from gpurm.sim.plots import write_plots

    for p in write_plots(tmp_path, [], Timeline(), CAPACITY, placement=True):
        assert p.read_bytes()[:8] == PNG_SIGNATURE


def test_plots_downsample_long_timelines_keeping_area(tmp_path: Path) -> None:
    from gpurm.sim.plots import MAX_POINTS, _resample, write_plots

    tl = Timeline()
    for i in range(20_000):  # more queues than the shares plot shows, more samples than it draws
        tl.record(i * 7.0, {f"q{k}": (i * (k + 1)) % 5 for k in range(10)})
    x, ys = _resample(tl.times, [tl.allocated], 20_000 * 7.0)
    assert len(x) == MAX_POINTS + 1
    area = float(sum(ys[0][:-1] * (x[1:] - x[:-1])))
    assert area == pytest.approx(tl.integral(0, 20_000 * 7.0))
    results = [job(f"j{i}", f"q{i % 10}", 1 + i % 16, i, i + 1, i + 100 + i % 1000) for i in range(20_000)]
    for p in write_plots(tmp_path, results, tl, 64):
        assert p.read_bytes()[:8] == PNG_SIGNATURE


def test_time_below_share_counts_each_queue_while_it_is_below() -> None:
    t = Timeline()
    t.mark_below(0.0, {"a"})
    t.mark_below(5.0, {"a"})            # no change: the interval goes on
    t.mark_below(10.0, {"a", "b"})
    t.mark_below(25.0, set())
    t.mark_below(30.0, {"b"})
    t.close_below(40.0)
    assert t.below_share_s == {"a": 25.0, "b": 25.0}


def test_summary_reports_fairness() -> None:
    t = Timeline()
    t.record(0.0, {"a": 1})
    t.record(100.0, {"a": 0})
    t.below_share_s = {"root.a": 10.0, "root.b": 30.0}
    t.below_guarantee_s = {"root.a": 20.0}
    r = JobResult("j", "root.a", 1, 0.0, 0.0, 100.0, 100.0, 1, 1, 1, 0, 0, 100.0, "SUCCEEDED")
    s = summarize([r], t, 1, 1.0, 0.0)
    assert s["fairness"] == {"worst_queue": "b", "max_below_share_s": 30.0, "mean_below_share_s": 20.0,
                             "max_below_share_fraction": 0.3, "worst_guarantee_queue": "a",
                             "max_below_guarantee_s": 20.0, "mean_below_guarantee_s": 20.0,
                             "max_below_guarantee_fraction": 0.2}
    per_queue = cast(dict[str, dict[str, object]], s["per_queue"])
    assert per_queue["a"]["below_share_s"] == 10.0 and per_queue["b"]["below_share_s"] == 30.0
    assert per_queue["a"]["below_guarantee_s"] == 20.0 and per_queue["b"]["below_guarantee_s"] == 0.0


def test_the_guarantee_clock_counts_apart_from_the_share_clock() -> None:
    t = Timeline()
    t.mark_below(0.0, {"a"}, {"b"})
    t.mark_below(10.0, {"a"}, set())    # b's guarantee met: a's interval goes on
    t.close_below(30.0)
    assert t.below_share_s == {"a": 30.0} and t.below_guarantee_s == {"b": 10.0}


def test_queueing_by_class_has_p99_and_the_ratio_to_one_gpu_jobs() -> None:
    t = Timeline()
    t.record(0.0, {"a": 1})
    rs = [JobResult(f"j{k}", "root.a", 1, 0.0, 100.0 * k, 100.0 * k + 10, 10.0, 1, 1, 1, 0, 0, 10.0, "SUCCEEDED")
          for k in (3, 10, 1, 7, 2, 9, 4, 6, 8, 5)]      # not in order
    rs.append(JobResult("big", "root.a", 8, 0.0, 3000.0, 3010.0, 10.0, 1, 1, 1, 0, 0, 80.0, "SUCCEEDED"))
    s = summarize(rs, t, 8, 1.0, 0.0)
    assert cast(dict[str, object], s["queue_p99_by_class"])["1"] == 1000.0
    ratios = cast(dict[str, object], s["queue_ratio_by_class"])
    assert ratios["1"] == pytest.approx(550.0 / 600.0)      # the floor: 600 s
    assert ratios["5-8"] == pytest.approx(3000.0 / 600.0)
    assert ratios["9-16"] is None
