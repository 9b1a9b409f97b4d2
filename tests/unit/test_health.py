"""Node health from the admin script (YARN NodeManager semantics), GPU health decisions, and the fake provider's
injected faults and telemetry."""

from __future__ import annotations

from pathlib import Path

from gpurm.nodeagent.fakegpu import FakeGpuProvider, parse_fault
from gpurm.nodeagent.gpus import GpuEvent, GpuEventKind
from gpurm.nodeagent.health import (
    CRITICAL_XIDS,
    GpuHealthBook,
    NodeHealth,
    ScriptOutcome,
    event_reason,
    interpret_script,
)


def test_error_line_makes_the_node_unhealthy() -> None:
    r = interpret_script("checking disks\nERROR /scratch is 100% full\nERROR and more\n", 0)
    assert (r.outcome, r.report) == (ScriptOutcome.ERROR, "ERROR /scratch is 100% full")
    # Only a line that *starts* with ERROR counts.
    assert interpret_script("all good, no ERROR here\n  ERROR indented\n", 0).outcome is ScriptOutcome.OK


def test_non_zero_exit_without_error_line_is_healthy() -> None:
    r = interpret_script("oops: command not found\n", 127)
    assert (r.outcome, r.exit_code) == (ScriptOutcome.OK, 127)
    node = NodeHealth()
    assert node.apply(r, now=1.0) is False
    assert node.healthy


def test_error_line_wins_whatever_the_exit_code() -> None:
    assert interpret_script("ERROR GPU fan failed", 3).outcome is ScriptOutcome.ERROR


def test_timeout_keeps_the_last_verdict() -> None:
    node = NodeHealth()
    assert node.apply(interpret_script("ERROR bad disk", 1), now=10.0)
    assert (node.healthy, node.report, node.since) == (False, "ERROR bad disk", 10.0)
    timed_out = interpret_script("", None, timed_out=True)
    assert timed_out.outcome is ScriptOutcome.TIMED_OUT
    assert node.apply(timed_out, now=20.0) is False
    assert (node.healthy, node.report, node.last_run) == (False, "ERROR bad disk", 20.0)
    assert node.apply(interpret_script("fine\n", 0), now=30.0)
    assert (node.healthy, node.report, node.since) == (True, "", 30.0)
    assert NodeHealth().apply(timed_out, now=1.0) is False  # healthy stays healthy


def test_script_that_cannot_run_is_unhealthy() -> None:
    r = interpret_script("", None, cannot_run="/etc/gpurm/check.sh: Permission denied")
    assert r.outcome is ScriptOutcome.CANNOT_RUN
    node = NodeHealth()
    assert node.apply(r, now=0.0)
    assert node.report == "health script cannot run: /etc/gpurm/check.sh: Permission denied"


def test_changed_report_is_a_change() -> None:
    node = NodeHealth()
    assert node.apply(interpret_script("ERROR a", 1), now=0.0)
    assert not node.apply(interpret_script("ERROR a", 1), now=1.0)
    assert node.apply(interpret_script("ERROR b", 1), now=2.0)
    long = interpret_script("ERROR " + "x" * 1000, 1)
    assert len(long.report) == 500


def test_critical_xids_documented_set() -> None:
    assert sorted(CRITICAL_XIDS) == [48, 63, 64, 74, 79, 92, 94, 95]
    assert event_reason(GpuEvent(0, GpuEventKind.XID, xid=31)) is None
    assert event_reason(GpuEvent(0, GpuEventKind.XID, xid=74)) == "XID 74 (NVLink error)"
    assert event_reason(GpuEvent(0, GpuEventKind.LOST, detail="NVML: GPU is lost")) == "fell off the bus"


def test_fake_provider_faults_and_telemetry(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    fake = FakeGpuProvider(4, "H100-80GB", 81559, 2, "n1", cpus=8, fail_gpus=[0], fault_file=faults)
    gpus = fake.discover()
    book = GpuHealthBook(gpus)
    changes = book.observe(fake.poll_events(), now=0.0)
    assert [(c.index, c.reason) for c in changes] == [(0, "injected fault (gpus.fail_gpus)")]
    assert fake.poll_events() == []
    faults.write_text("# drill\n2 xid 79\n3 lost\n9 lost\n1 xid 13\n")
    changes = book.observe(fake.poll_events(), now=1.0)
    assert [(c.index, c.reason) for c in changes] == [(2, "XID 79 (GPU has fallen off the bus)"),
                                                      (3, "fell off the bus")]
    assert gpus[1].healthy  # XID 13 is the application's
    assert fake.poll_events() == []  # each line once
    # Telemetry: deterministic, idle GPUs at 0 %, a held GPU busy; the lost GPU answers nothing.
    samples = fake.sample({1: "job-1-c1"})
    assert [s.index for s in samples] == [0, 1, 2]
    assert samples[0].util_pct == 0
    assert 55 <= (samples[1].util_pct or 0) <= 95
    assert samples == fake.sample({1: "job-1-c1"})
    assert parse_fault("1 ecc", 4) == GpuEvent(1, GpuEventKind.ECC, detail="uncorrectable ECC errors (injected)")
    assert parse_fault("1 fan on fire", 4) == GpuEvent(1, GpuEventKind.FAULT, detail="fan on fire")
    assert parse_fault("x lost", 4) is None
