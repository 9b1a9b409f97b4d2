"""`gpurm sim` as a user runs it: the real command in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REQUIRED = ("jobs", "gpus", "load_factor", "makespan_s", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
            "p99_queue_s", "gpu_utilization", "locality", "preemptions", "retries", "per_queue", "queue_by_size",
            "wall_s")


def gpurm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpurm.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


JOBS = [{"id": "a", "submit": 0, "gpus": 4, "duration": 100, "queue": "research.nlp"},
        {"id": "b", "submit": "10s", "gpus": 8, "duration": "5m", "queue": "research.vision"},
        {"id": "c", "submit": 20, "gpus": 1, "duration": 30, "queue": "prod"}]


def test_help_has_an_example() -> None:
    r = gpurm("sim", "--help")
    assert r.returncode == 0
    assert "example:" in r.stdout and "--trace" in r.stdout and "--window" in r.stdout


def test_a_run_writes_summary_jobs_and_plots(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    out = tmp_path / "out"
    r = gpurm("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--out", str(out),
              "-o", "json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    for key in REQUIRED:
        assert key in summary, key
    assert summary["jobs"] == 3 and summary["finished"] == 3 and summary["gpus"] == 16
    assert set(summary["per_queue"]) == {"research.nlp", "research.vision", "prod"}
    assert json.loads((out / "summary.json").read_text())["jobs"] == 3
    assert len((out / "jobs.csv").read_text().splitlines()) == 4
    for png in ("jct_cdf.png", "queue_delay_by_size.png", "utilization.png", "queue_shares.png"):
        assert (out / png).stat().st_size > 1000


def test_table_output_is_aligned(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    r = gpurm("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--out", str(tmp_path / "o"),
              "--no-plots")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0]
    assert header.startswith("FIGURE") and "VALUE" in header
    col = header.index("VALUE")
    assert all(line[col - 2:col] == "  " for line in lines[1:10])
    assert "wrote summary.json" in r.stdout


def test_queue_config_must_hold_the_trace_queues(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  research:\n    queues:\n      nlp: {weight: 2}\n      vision: {}\n")
    r = gpurm("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--queues", str(queues),
              "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "prod" in r.stderr and "--queues" in r.stderr
    assert not (tmp_path / "o").exists()
    queues.write_text("queues:\n  research:\n    queues:\n      nlp: {weight: 2}\n      vision: {}\n  prod: {}\n")
    r = gpurm("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--queues", str(queues),
              "--out", str(tmp_path / "o"), "--no-plots", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["finished"] == 3


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(JOBS[0]) + "\n" + json.dumps({"submit": 5, "gpus": 0, "duration": 10}) + "\n")
    good = write_jsonl(tmp_path / "good.jsonl", JOBS)
    cases = [
        (["--trace", str(bad), "--format", "jsonl", "--cluster", "1x2x8"], "bad.jsonl:2: gpus"),
        (["--trace", str(tmp_path / "nope.csv"), "--format", "philly-csv", "--cluster", "8x8x8"], "nope.csv"),
        (["--trace", str(good), "--format", "jsonl", "--cluster", "8x0x8"], "--cluster"),
        (["--trace", str(good), "--format", "jsonl", "--cluster", "8x8x8", "--window", "5"], "--window"),
        (["--trace", str(good), "--format", "nope", "--cluster", "8x8x8"], "--format"),
        (["--trace", str(good), "--format", "jsonl", "--cluster", "8x8x8", "--failures", "-1"], "--failures"),
    ]
    for args, needle in cases:
        r = gpurm("sim", *args, "--out", str(tmp_path / "o"))
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr, (needle, r.stderr)
    big = write_jsonl(tmp_path / "big.jsonl", [{"submit": 0, "gpus": 64, "duration": 10}])
    r = gpurm("sim", "--trace", str(big), "--format", "jsonl", "--cluster", "1x2x8", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "64" in r.stderr
    assert not (tmp_path / "o").exists()


def test_runtime_model_flags(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    base = ("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--no-plots", "-o", "json")
    r = gpurm(*base, "--out", str(tmp_path / "p"), "--checkpoint-interval", "10m", "--restart-cost", "30s")
    assert r.returncode == 0, r.stderr
    runtime = json.loads(r.stdout)["runtime"]
    assert runtime["model"] == "placement"
    assert runtime["checkpoint_interval_s"] == 600 and runtime["restart_cost_s"] == 30
    r = gpurm(*base, "--out", str(tmp_path / "i"), "--runtime-model", "ideal")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["runtime"] == {"model": "ideal"}
    config = tmp_path / "rt.yaml"
    config.write_text("rack_factor: 2\n")
    for flags, named in ((("--checkpoint-interval", "0"), "--checkpoint-interval"),
                         (("--checkpoint-interval", "soon"), "--checkpoint-interval"),
                         (("--restart-cost", "-5"), "--restart-cost"),
                         (("--runtime-model", "fast"), "--runtime-model"),
                         (("--runtime-config", str(config)), "rack_factor"),
                         (("--runtime-config", str(tmp_path / "none.yaml")), "--runtime-config"),
                         (("--runtime-model", "ideal", "--restart-cost", "5"), "--runtime-model")):
        r = gpurm(*base, "--out", str(tmp_path / "bad"), *flags)
        assert r.returncode == 2, (flags, r.stdout, r.stderr)
        assert named in r.stderr, (flags, r.stderr)


def test_the_quick_exit_flushes_everything_and_spares_profilers(tmp_path: Path) -> None:
    # `gpurm sim` ends without the interpreter's teardown (cli/main.py entry): what it printed must all arrive, and
    # a profiler, which writes its results at exit, must still get to write them.
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    profile = tmp_path / "sim.prof"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "gpurm.cli.main", "sim",
                        "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--out",
                        str(tmp_path / "o"), "--no-plots", "-o", "json"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["finished"] == 3
    assert profile.stat().st_size > 0


def test_reservations_and_the_history_flags(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "t.jsonl", JOBS)
    prior = tmp_path / "prior.csv"
    prior.write_text("queue,gpus,duration_s\nprod,1,30\nprod,1,60\n")
    base = ("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--no-plots", "-o", "json")
    r = gpurm(*base, "--out", str(tmp_path / "o"), "--reservations", "2", "--reserve-after", "5m",
              "--reserve-behind", "3", "--history-by", "queue", "--history-prior", str(prior))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert {k: summary["inputs"][k] for k in ("reservations", "reserve_after_s", "reserve_behind", "history_by",
                                              "history_prior_jobs")} == {
        "reservations": 2, "reserve_after_s": 300, "reserve_behind": 3, "history_by": "queue",
        "history_prior_jobs": 2}
    assert set(summary["reservations"]) == {"made", "expired", "idle_gpu_h"}
    assert set(summary["queue_p99_by_class"]) == set(summary["queue_by_class"])
    assert "max_below_guarantee_s" in summary["fairness"]
    for flags, named in ((("--reservations", "-1"), "--reservations"), (("--history-by", "team"), "--history-by"),
                         (("--history-prior", str(tmp_path / "nope.csv")), "--history-prior"),
                         (("--reserve-after", "soon"), "--reserve-after"),
                         (("--reserve-behind", "-1"), "--reserve-behind")):
        r = gpurm(*base, "--out", str(tmp_path / "bad"), *flags)
        assert r.returncode == 2 and named in r.stderr, (flags, r.stderr)


def test_borrowing_flag_and_config(tmp_path: Path) -> None:
    # a borrows a second 8-GPU server beyond its steady share (8 of 16); two hours on, b's short job arrives. No
    # fair-share preemption: under `fair` it waits for a's jobs to end (10 h); under a borrowing policy it takes
    # the borrower's GPUs (inside b's steady share: its guarantee) after the borrower's minimum run.
    trace = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a1", "submit": 0, "gpus": 8, "duration": "10h", "queue": "a"},
        {"id": "a2", "submit": 10, "gpus": 8, "duration": "10h", "queue": "a"},
        {"id": "b1", "submit": "2h", "gpus": 8, "duration": "10m", "queue": "b"}])
    queues = tmp_path / "q.yaml"
    plain = ("defaults: {fair_share_preemption_timeout: off, min_share_preemption_timeout: off}\n"
             "queues: {a: {}, b: {}}\n")
    queues.write_text(plain)
    base = ("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--no-plots", "-o", "json",
            "--queues", str(queues))

    def sim(name: str, *flags: str) -> tuple[dict[str, object], float]:
        r = gpurm(*base, "--out", str(tmp_path / name), *flags)
        assert r.returncode == 0, r.stderr
        rows = (tmp_path / name / "jobs.csv").read_text().splitlines()
        header = rows[0].split(",")
        b1 = next(dict(zip(header, row.split(","), strict=True)) for row in rows[1:] if row.startswith("b1,"))
        return json.loads(r.stdout), float(b1["queue_s"])

    summary, waited = sim("fair")
    assert summary["borrowing"] == {"policy": "fair", "preemptions": 0} and summary["inputs"]["borrowing"] == "fair"
    assert waited > 7 * 3600
    summary, waited = sim("las", "--borrowing", "las")
    assert summary["borrowing"] == {"policy": "las", "preemptions": 1} and summary["inputs"]["borrowing"] == "las"
    assert waited < 600
    queues.write_text("borrowing: gittins\n" + plain)          # the config's own, unless the flag says otherwise
    assert sim("config")[0]["borrowing"] == {"policy": "gittins", "preemptions": 1}
    assert sim("flag", "--borrowing", "fair")[0]["borrowing"] == {"policy": "fair", "preemptions": 0}
    r = gpurm("sim", "--trace", str(trace), "--format", "jsonl", "--cluster", "1x2x8", "--no-plots", "--queues",
              str(queues), "--out", str(tmp_path / "t"), "--borrowing", "srtf")   # the table; srtf: the sim only
    assert r.returncode == 0, r.stderr
    assert "borrowed GPUs ordered by" in r.stdout and "srtf (1 borrowers preempted)" in r.stdout
    r = gpurm(*base, "--out", str(tmp_path / "bad"), "--borrowing", "lifo")
    assert r.returncode == 2 and "--borrowing" in r.stderr
    queues.write_text("borrowing: lifo\n" + plain)
    r = gpurm(*base, "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "borrowing: must be one of fair, las, gittins" in r.stderr
