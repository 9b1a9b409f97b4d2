"""Image jobs' learners under the agent's supervisor with the real engine (podman): identity and isolation inside,
a missing image, stops with the grace period, mounts, and an agent restart (adoption by labels)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpurm.common.jobspec import Mount
from gpurm.nodeagent import engine as oci
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.imagerun import ImageSpec
from gpurm.nodeagent.records import ContainerRecord
from gpurm.proto import gpurm_pb2 as pb
from tests.integration.containers_fixture import engine_containers, images, needs_podman, podman

pytestmark = needs_podman
__all__ = ["images"]  # the fixture, used by name
WAIT = 30.0


@pytest.fixture(scope="module")
def engine() -> oci.Engine:
    found, note = asyncio.run(oci.detect(oci.EngineConfig(kind=oci.EngineKind.PODMAN), fake_gpus=True))
    assert found is not None, note
    return found


def supervisor(state: Path, engine: oci.Engine, rules: tuple[oci.MountRule, ...] = ()) -> ContainerSupervisor:
    s = ContainerSupervisor("node-a", state, stop_grace_s=5.0, agent_env={"PATH": os.environ["PATH"]})
    s.engine = oci.Engine(engine.kind, engine.binary, engine.global_args, engine.ulimits, engine.gpu_passing,
                          pull_timeout_s=20.0, mounts_allowed=rules)
    return s


@pytest.fixture
async def sup(tmp_path: Path, engine: oci.Engine) -> AsyncIterator[ContainerSupervisor]:
    s = supervisor(tmp_path / "state", engine)
    try:
        yield s
    finally:
        await s.stop_all(0.5)
        await s.close()


async def start(s: ContainerSupervisor, cid: str, image: str, script: str, *, gpus: list[int] | None = None,
                env: dict[str, str] | None = None, mounts: tuple[Mount, ...] = ()) -> ContainerRecord:
    return await s.start(cid, "job-1", pb.CONTAINER_LEARNER, ["sh", "-c", script], env or {}, "", gpus or [], 1,
                         "alice", image=ImageSpec(image, mounts))


async def ended(s: ContainerSupervisor, cid: str) -> ContainerRecord:
    return await asyncio.wait_for(s.wait_ended(cid), WAIT)


def log_text(s: ContainerSupervisor, cid: str) -> str:
    return s.read_log(cid, 0, 1 << 20).data.decode()


async def wait_log(s: ContainerSupervisor, cid: str, text: str) -> None:
    async def poll() -> None:
        while text not in log_text(s, cid):
            await asyncio.sleep(0.05)
    await asyncio.wait_for(poll(), WAIT)


async def test_runs_in_its_image_as_the_jobs_user_without_privileges(sup: ContainerSupervisor,
                                                                     images: dict[str, str]) -> None:
    script = ("id -u; id -g; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; cat /secret-a.txt; "
              "echo gpus=$CUDA_VISIBLE_DEVICES var=$JOB_VAR; pwd; ls /secret-b.txt 2>&1; echo pid1=$(cat /proc/1/comm)")
    rec = await start(sup, "c-id", images["a"], script, gpus=[1], env={"JOB_VAR": "x y"})
    rec = await ended(sup, "c-id")
    out = log_text(sup, "c-id")
    assert rec.state == pb.CONTAINER_EXITED and rec.exit_code == 0, (rec.diagnostics, out)
    lines = out.splitlines()
    assert lines[0] == lines[1] == "65534", out             # nobody (a root agent in insecure mode), never 0
    assert "CapEff:\t0000000000000000" in out and "CapPrm:\t0000000000000000" in out, out
    assert "NoNewPrivs:\t1" in out, out
    assert "only in image a" in out and "gpus=1 var=x y" in out, out
    assert "/gpurm/work" in lines and "No such file" in out, out  # its own filesystem: b's file is not there
    assert "pid1=" in out and "pid1=sh" not in out            # its own PID namespace, an init in front
    assert not engine_containers(f"gpurm.container={rec.container_id}")   # removed after its end
    assert rec.image == images["a"] and rec.engine_name


async def test_two_images_do_not_see_each_others_files(sup: ContainerSupervisor, images: dict[str, str]) -> None:
    await start(sup, "c-a", images["a"], "echo mine > /gpurm/work/a.txt; cat /secret-a.txt; sleep 30")
    await wait_log(sup, "c-a", "only in image a")
    await start(sup, "c-b", images["b"],
                f"cat /secret-a.txt; ls /gpurm/work; cat {sup.containers_dir}/c-a/work/a.txt; cat /secret-b.txt")
    rec = await ended(sup, "c-b")
    assert rec.exit_code == 0
    out = log_text(sup, "c-b")
    assert "only in image b" in out and "only in image a" not in out and "mine" not in out, out
    assert (sup.containers_dir / "c-a" / "work" / "a.txt").read_text() == "mine\n"   # a wrote its own work dir
    await sup.stop("c-a", 0.5)


async def test_a_missing_image_fails_to_start_as_the_jobs_error(sup: ContainerSupervisor) -> None:
    await start(sup, "c-missing", "localhost/gpurm-no-such-image:1", "true")
    rec = await ended(sup, "c-missing")
    assert rec.state == pb.CONTAINER_FAILED_TO_START and rec.user_error and not rec.infra_failure, rec
    assert "localhost/gpurm-no-such-image:1" in rec.diagnostics and "could not be pulled" in rec.diagnostics
    assert "pulling image" in log_text(sup, "c-missing")


async def test_stop_sends_term_then_kills_after_the_grace(sup: ContainerSupervisor, images: dict[str, str]) -> None:
    await start(sup, "c-term", images["a"],
                'trap "echo got TERM; exit 7" TERM; echo up; while true; do sleep 0.1; done')
    await wait_log(sup, "c-term", "up")
    rec = await asyncio.wait_for(sup.stop("c-term", 5.0, "preempted"), WAIT)
    assert rec.stopped and rec.exit_code == 7 and "got TERM" in log_text(sup, "c-term"), rec.diagnostics
    await start(sup, "c-deaf", images["a"], 'trap "" TERM; echo up; while true; do sleep 0.1; done')
    await wait_log(sup, "c-deaf", "up")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    rec = await asyncio.wait_for(sup.stop("c-deaf", 1.0, "killed"), WAIT)
    assert rec.signal == 9 and rec.stopped, rec.diagnostics
    assert loop.time() - t0 >= 1.0
    assert not engine_containers(f"gpurm.container={rec.container_id}")


async def test_mounts_only_where_the_server_allows(tmp_path: Path, engine: oci.Engine,
                                                   images: dict[str, str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("shared data\n")
    s = supervisor(tmp_path / "state", engine, (oci.MountRule(str(data), writable=False),))
    try:
        await start(s, "c-ro", images["a"], "cat /data/in.txt; touch /data/x 2>&1 || echo cannot write",
                    mounts=(Mount(str(data), "/data"),))
        rec = await ended(s, "c-ro")
        assert rec.exit_code == 0 and "shared data" in log_text(s, "c-ro") and "cannot write" in log_text(s, "c-ro")
        await start(s, "c-rw", images["a"], "true", mounts=(Mount(str(data), "/data", writable=True),))
        rec = await ended(s, "c-rw")
        assert rec.state == pb.CONTAINER_FAILED_TO_START and rec.user_error and "read-only" in rec.diagnostics
        await start(s, "c-etc", images["a"], "true", mounts=(Mount("/etc", "/data"),))
        rec = await ended(s, "c-etc")
        assert rec.state == pb.CONTAINER_FAILED_TO_START and "does not allow" in rec.diagnostics
    finally:
        await s.stop_all(0.5)
        await s.close()


async def test_a_restarted_agent_adopts_its_containers_and_removes_strangers(
        tmp_path: Path, engine: oci.Engine, images: dict[str, str]) -> None:
    state = tmp_path / "state"
    first = supervisor(state, engine)
    first.open()
    flag = "/gpurm/work/go"
    await start(first, "c-kept", images["a"], f"echo up; while ! test -e {flag}; do sleep 0.1; done; echo done; exit 4")
    await wait_log(first, "c-kept", "up")
    await first.close()                                  # the agent goes; its container keeps running
    stray = f"gpurm-stray-{os.getpid()}"
    podman("create", "--name", stray, "--label", f"{oci.LABEL_AGENT}={first.marker_prefix}", "--label",
           f"{oci.LABEL_CONTAINER}=ghost", images["a"], "true")
    second = supervisor(state, engine)
    try:
        adopted = second.open()
        assert [r.container_id for r in adopted] == ["c-kept"] and adopted[0].state == pb.CONTAINER_RUNNING
        removed = await oci.reap(engine, second.marker_prefix, {r.engine_name for r in adopted})
        assert removed == [stray] and engine_containers(f"{oci.LABEL_AGENT}={second.marker_prefix}") == [
            adopted[0].engine_name]
        (state / "containers" / "c-kept" / "work" / "go").touch()
        rec = await ended(second, "c-kept")
        assert rec.state == pb.CONTAINER_EXITED and rec.exit_code == 4, rec.diagnostics
        assert "done" in log_text(second, "c-kept")
    finally:
        await second.stop_all(0.5)
        await second.close()
        podman("rm", "-f", stray, check=False)


async def test_the_agents_cpu_and_memory_limits_apply_in_the_container(tmp_path: Path, engine: oci.Engine,
                                                                       images: dict[str, str]) -> None:
    s = supervisor(tmp_path / "state", engine)
    s.node_gpus, s.node_cpus, s.node_memory_mib = 2, 4, 1024        # one GPU of two: 2 CPUs, 512 MiB
    try:
        script = ("cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max 2>/dev/null || "
                  "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        await start(s, "c-lim", images["a"], script, gpus=[0])
        rec = await ended(s, "c-lim")
        out = log_text(s, "c-lim").split()
        assert rec.exit_code == 0, (rec.diagnostics, out)
        assert out[0] == str(512 << 20) and out[1] == "200000", out   # cgroup v2 (memory.max, cpu.max) or v1
    finally:
        await s.stop_all(0.5)
        await s.close()
