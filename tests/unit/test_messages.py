"""The core's vocabulary (rm/state/messages.py): the little behaviour plain data has, and the names rm/state/core.py
keeps
exporting for its callers."""

from __future__ import annotations

from gpurm.rm.state import core, messages
from gpurm.rm.state.messages import ContainerReport, Dirty, ErrorCode, RequestError


def test_a_report_is_live_while_starting_or_running() -> None:
    assert ContainerReport("c", "STARTING").live and ContainerReport("c", "RUNNING").live
    assert not any(ContainerReport("c", s).live for s in ("EXITED", "FAILED_TO_START", "LOST"))


def test_dirty_is_true_when_anything_is_marked() -> None:
    assert not Dirty()
    assert Dirty(meta=True) and Dirty(jobs={"job-1"}) and Dirty(nodes={"n1"}) and Dirty(containers={"c"})


def test_a_refusal_carries_its_code_and_message() -> None:
    e = RequestError(ErrorCode.NOT_FOUND, "job_id: no job")
    assert (e.code, e.message, str(e)) == (ErrorCode.NOT_FOUND, "job_id: no job", "job_id: no job")


def test_the_core_still_exports_every_message() -> None:
    for name in ("ErrorCode", "RequestError", "RMSettings", "LaunchAM", "JobChanged", "ContainerReport",
                 "NodeRegistration", "HeartbeatAction", "AttemptUpdate", "AllocateResult", "AppState", "Dirty"):
        assert getattr(core, name) is getattr(messages, name)
