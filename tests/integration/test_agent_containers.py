"""ContainerSupervisor with real child processes: env, exits, signals, logs, stops of whole process groups."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpurm.nodeagent.containers import ContainerExistsError, ContainerSupervisor, GpuBusyError
from gpurm.nodeagent.procgroup import pid_alive
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import job_user_dir

LEARNER = pb.CONTAINER_LEARNER
WAIT = 10.0  # seconds a test waits for a process event before it fails


@pytest.fixture
async def sup(tmp_path: Path) -> AsyncIterator[ContainerSupervisor]:
    s = ContainerSupervisor("node-a", tmp_path / "state", stop_grace_s=5.0,
                            agent_env={"PATH": os.environ["PATH"], "HOME": "/home/agent", "SECRET": "x"})
    try:
        yield s
    finally:
        await s.stop_all(0.5)
        await s.close()


async def run_to_end(s: ContainerSupervisor, cid: str, argv: list[str], gpus: list[int] | None = None, *,
                     env: dict[str, str] | None = None, workdir: str = "") -> ContainerRecord:
    rec = await s.start(cid, "job-1", LEARNER, argv, env or {}, workdir, gpus or [], 1, "alice")
    return await asyncio.wait_for(s.wait_ended(rec.container_id), WAIT)


def log_text(s: ContainerSupervisor, cid: str) -> str:
    return s.read_log(cid, 0, 1 << 20).data.decode()


async def read_pids(path: Path, count: int) -> list[int]:
    """Pids a script wrote, one per line, once it has written `count` of them."""
    async def poll() -> list[int]:
        while True:
            lines = path.read_text().split() if path.exists() else []
            if len(lines) >= count:
                return [int(x) for x in lines[:count]]
            await asyncio.sleep(0.01)
    return await asyncio.wait_for(poll(), WAIT)


async def test_environment(sup: ContainerSupervisor) -> None:
    dump_env = "import json, os; print(json.dumps(dict(os.environ)))"
    rec = await run_to_end(sup, "c-env", [sys.executable, "-c", dump_env], [2, 3],
                           env={"JOB_VAR": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert rec.state == pb.CONTAINER_EXITED and rec.exit_code == 0
    env = json.loads(log_text(sup, "c-env"))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # the job cannot widen its own GPUs
    assert env["GPURM_GPUS"] == "2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPURM_CONTAINER_ID"] == "c-env"
    assert env["GPURM_NODE_ID"] == "node-a"
    assert env["JOB_VAR"] == "1"
    # A root agent runs the job as nobody (tests/conftest.py), whose home does not exist: HOME is its work dir.
    assert env["HOME"] == (str(sup.containers_dir / "c-env" / "work") if os.geteuid() == 0 else "/home/agent")
    assert "SECRET" not in env  # not in the passthrough list


async def test_am_container_gets_no_gpus_and_runs_gpurm_am(sup: ContainerSupervisor) -> None:
    rec = await sup.start("c-am", "job-1", pb.CONTAINER_AM, ["--job", "job-1"], {}, "", [], 1, "alice")
    assert rec.argv == [sys.executable, "-m", "gpurm.am", "--job", "job-1"]
    await asyncio.wait_for(sup.wait_ended("c-am"), WAIT)


async def test_exit_code_and_output_in_log(sup: ContainerSupervisor, tmp_path: Path) -> None:
    changes: list[tuple[str, int]] = []
    sup.add_listener(lambda r: changes.append((r.container_id, r.state)))
    rec = await run_to_end(sup, "c-exit", ["/bin/sh", "-c", "echo out; echo err >&2; pwd; exit 3"],
                           workdir=str(tmp_path))
    assert (rec.state, rec.exit_code, rec.signal, rec.stopped) == (pb.CONTAINER_EXITED, 3, 0, False)
    assert rec.end_ms >= rec.start_ms > 0
    assert rec.diagnostics == "exited with code 3"
    assert log_text(sup, "c-exit") == f"out\nerr\n{tmp_path}\n"
    assert changes == [("c-exit", pb.CONTAINER_RUNNING), ("c-exit", pb.CONTAINER_EXITED)]
    on_disk = json.loads((sup.containers_dir / "c-exit" / "record.json").read_text())
    assert on_disk["state"] == "CONTAINER_EXITED" and on_disk["exit_code"] == 3
    # The command runs under its launcher, which leads the container's session and group.
    assert on_disk["pid"] == rec.pid and on_disk["pgid"] == on_disk["shim_pid"] != rec.pid
    status = rec.to_proto()
    assert (status.node_id, status.job_id, list(status.gpu_indices)) == ("node-a", "job-1", [])


async def test_default_workdir_is_the_container_dirs_work(sup: ContainerSupervisor) -> None:
    await run_to_end(sup, "c-pwd", ["/bin/pwd"])
    assert log_text(sup, "c-pwd").strip() == str(sup.containers_dir / "c-pwd" / "work")


async def test_signal_death(sup: ContainerSupervisor) -> None:
    rec = await run_to_end(sup, "c-sig", ["/bin/sh", "-c", "kill -SEGV $$"])
    assert (rec.state, rec.signal, rec.exit_code) == (pb.CONTAINER_EXITED, signal.SIGSEGV, 0)
    assert not rec.stopped
    assert "SIGSEGV" in rec.diagnostics


async def test_missing_workdir_fails_to_start(sup: ContainerSupervisor, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    rec = await sup.start("c-wd", "job-1", LEARNER, ["/bin/true"], {}, str(missing), [0], 1, "alice")
    assert rec.state == pb.CONTAINER_FAILED_TO_START
    assert str(missing) in rec.diagnostics and "does not exist" in rec.diagnostics
    assert rec.user_error and not rec.infra_failure and rec.to_proto().user_error   # the job's fault: no retry
    assert "\n" not in rec.diagnostics
    assert sup.gpus_in_use() == {}  # a container that never ran holds no GPU
    assert str(missing) in log_text(sup, "c-wd")


async def test_command_not_found_and_not_executable(sup: ContainerSupervisor, tmp_path: Path) -> None:
    rec = await sup.start("c-nf", "job-1", LEARNER, ["no-such-command-xyz"], {}, "", [], 1, "alice")
    assert rec.state == pb.CONTAINER_FAILED_TO_START
    assert rec.diagnostics == "cannot start 'no-such-command-xyz': command not found"
    assert rec.user_error and not rec.infra_failure
    script = tmp_path / "plain.txt"
    script.write_text("not executable\n")
    rec = await sup.start("c-perm", "job-1", LEARNER, [str(script)], {}, "", [], 1, "alice")
    assert rec.state == pb.CONTAINER_FAILED_TO_START
    assert "permission denied" in rec.diagnostics and rec.user_error


async def test_a_shell_that_cannot_find_its_command_is_a_user_error_and_other_exits_are_not(
        sup: ContainerSupervisor) -> None:
    rec = await run_to_end(sup, "c-sh127", ["/bin/sh", "-c", "no-such-command-xyz"])
    assert (rec.state, rec.exit_code) == (pb.CONTAINER_EXITED, 127)
    assert rec.user_error and rec.diagnostics.startswith("exited with code 127: the shell could not find")
    rec = await run_to_end(sup, "c-sh3", ["/bin/sh", "-c", "exit 3"])
    assert (rec.exit_code, rec.user_error) == (3, False)
    rec = await run_to_end(sup, "c-py127", ["/usr/bin/python3", "-c", "raise SystemExit(127)"])
    assert (rec.exit_code, rec.user_error) == (127, False)      # only a shell's 127 means "not found"


async def test_stop_kills_a_group_that_ignores_sigterm(sup: ContainerSupervisor, tmp_path: Path) -> None:
    pids = job_user_dir(tmp_path / "out") / "pids"
    # Ignoring TERM is inherited through exec, so both the shell and its sleep child ignore it.
    script = f"trap '' TERM; echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait"
    rec = await sup.start("c-stub", "job-1", LEARNER, ["/bin/sh", "-c", script], {}, "", [0], 1, "alice")
    leader, child = await read_pids(pids, 2)
    assert leader == rec.pid and pid_alive(child)
    stopped = await asyncio.wait_for(sup.stop("c-stub", 0.3, "preempted"), WAIT)
    assert stopped.state == pb.CONTAINER_EXITED
    assert stopped.stopped and stopped.signal == signal.SIGKILL
    assert "preempted" in stopped.diagnostics
    assert not pid_alive(leader) and not pid_alive(child)
    # idempotent: a second stop returns the same end at once
    again = await asyncio.wait_for(sup.stop("c-stub", 0.3, "again"), 1.0)
    assert again is stopped and again.signal == signal.SIGKILL


async def test_stop_polite_process_ends_by_sigterm(sup: ContainerSupervisor) -> None:
    rec = await sup.start("c-polite", "job-1", LEARNER, ["sleep", "300"], {}, "", [], 1, "alice")
    stopped = await asyncio.wait_for(sup.stop(rec.container_id, 30.0, "done"), WAIT)
    assert (stopped.signal, stopped.stopped) == (signal.SIGTERM, True)


async def test_group_member_outliving_its_leader_is_killed(sup: ContainerSupervisor, tmp_path: Path) -> None:
    pids = job_user_dir(tmp_path / "out") / "pids"
    rec = await run_to_end(sup, "c-orphan", ["/bin/sh", "-c", f"sleep 300 & echo $! > {pids}; exit 0"], [1])
    (child,) = await read_pids(pids, 1)
    assert rec.state == pb.CONTAINER_EXITED and rec.exit_code == 0
    assert not pid_alive(child)


async def test_gpu_conflict_refused(sup: ContainerSupervisor) -> None:
    await sup.start("c-a", "job-1", LEARNER, ["sleep", "300"], {}, "", [0, 1], 1, "alice")
    with pytest.raises(GpuBusyError) as info:
        await sup.start("c-b", "job-2", LEARNER, ["sleep", "300"], {}, "", [1, 2], 1, "bob")
    assert info.value.gpu == 1 and info.value.holder == "c-a"
    assert sup.record("c-b") is None
    await sup.stop("c-a", 1.0)
    # once ended, its GPUs are free again
    # (a learner that keeps running: /bin/true could end before the state is read, as one full run saw)
    rec = await sup.start("c-b", "job-2", LEARNER, ["sleep", "300"], {}, "", [1, 2], 1, "bob")
    assert rec.state == pb.CONTAINER_RUNNING and rec.gpu_indices == [1, 2]
    await sup.stop("c-b", 1.0)


async def test_start_is_idempotent(sup: ContainerSupervisor) -> None:
    first, second = await asyncio.gather(
        sup.start("c-idem", "job-1", LEARNER, ["sleep", "300"], {}, "", [0], 1, "alice"),
        sup.start("c-idem", "job-1", LEARNER, ["sleep", "300"], {}, "", [0], 1, "alice"))
    assert first is second
    assert [r.container_id for r in sup.records()] == ["c-idem"]
    ended = await sup.stop("c-idem", 1.0)
    assert sup.forget("c-idem")
    # a forgotten id is still never launched twice, and its status and log stay readable from disk
    with pytest.raises(ContainerExistsError):
        await sup.start("c-idem", "job-1", LEARNER, ["sleep", "300"], {}, "", [0], 1, "alice")
    status = sup.status("c-idem")
    assert status is not None and status.state == pb.CONTAINER_EXITED and status.signal == ended.signal
    assert sup.read_log("c-idem", 0, 10).done


async def test_a_start_whose_caller_goes_away_still_launches_and_is_watched(sup: ContainerSupervisor) -> None:
    """A StartContainer call cancelled mid-launch (the RM or AM calling it was killed): the launcher it spawned is
    watched all the same, so the container's end is seen and a stop of it returns (it used to stay STARTING,
    unwatched, and a stop of it, the agent's shutdown among them, waited forever)."""
    caller = asyncio.create_task(sup.start("c-gone", "job-1", LEARNER, ["sleep", "300"], {}, "", [0], 1, "alice"))
    while sup.record("c-gone") is None:          # the record exists: the launch is under way
        await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    rec = sup.record("c-gone")
    assert rec is not None

    async def running() -> None:
        while rec.state != pb.CONTAINER_RUNNING:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(running(), WAIT)
    assert pid_alive(rec.pid)
    stopped = await asyncio.wait_for(sup.stop("c-gone", 0.5, "done"), WAIT)
    assert stopped.state == pb.CONTAINER_EXITED and stopped.stopped and not pid_alive(rec.pid)


async def test_forget_only_ended(sup: ContainerSupervisor) -> None:
    await sup.start("c-live", "job-1", LEARNER, ["sleep", "300"], {}, "", [], 1, "alice")
    assert not sup.forget("c-live")
    assert not sup.forget("unknown")


async def test_read_log_offsets(sup: ContainerSupervisor) -> None:
    await run_to_end(sup, "c-log", ["/bin/sh", "-c", "printf 0123456789"])
    chunk = sup.read_log("c-log", 3, 4)
    assert (chunk.data, chunk.next_offset, chunk.size, chunk.done) == (b"3456", 7, 10, True)
    assert sup.read_log("c-log", -2, 100).data == b"89"
    assert sup.read_log("c-log", 50, 100).data == b""


async def test_stop_all(sup: ContainerSupervisor) -> None:
    recs = [await sup.start(f"c-all{i}", "job-1", LEARNER, ["sleep", "300"], {}, "", [i], 1, "a")
            for i in range(3)]
    ended = await asyncio.wait_for(sup.stop_all(5.0), WAIT)
    assert {r.container_id for r in ended} == {"c-all0", "c-all1", "c-all2"}
    assert all(r.state == pb.CONTAINER_EXITED and r.stopped for r in recs)
    assert not any(pid_alive(r.pid) for r in recs)


async def test_an_end_no_rm_acknowledged_is_reported_again_by_the_next_agent_process(tmp_path: Path) -> None:
    # The container ended while the agent could not reach the RM, then the agent died: the next agent process
    # must still report that end (adoption alone would skip a record that is already terminal).
    def supervisor() -> ContainerSupervisor:
        return ContainerSupervisor("node-a", tmp_path / "state", stop_grace_s=1.0,
                                   agent_env={"PATH": os.environ["PATH"]})

    first = supervisor()
    first.open()
    rec = await run_to_end(first, "c-owed", ["/bin/sh", "-c", "exit 4"])
    assert rec.exit_code == 4
    await first.close()
    second = supervisor()
    second.open()
    owed = second.record("c-owed")
    assert owed is not None and owed.state == pb.CONTAINER_EXITED and owed.exit_code == 4
    assert "c-owed" in [r.container_id for r in second.records()]          # registration carries it
    assert second.forget("c-owed")                                         # the RM acknowledged it
    await second.close()
    third = supervisor()
    third.open()
    assert third.record("c-owed") is None                                   # not reported a third time
    await third.close()
