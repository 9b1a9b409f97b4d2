"""Pure parts of image jobs: the spec's image / mounts / shm_size, agent.yaml's engine settings, the engine's
run command, mount policy, GPU passing and how a foreground run's exit code reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError, Problems, Reader
from gpurm.common.jobspec import Mount, parse_job_yaml, parse_mount, spec_from_proto, spec_to_proto
from gpurm.nodeagent import engine as oci


def test_image_mounts_and_shm_size_read_and_survive_the_wire() -> None:
    spec = parse_job_yaml("gpus: 2\ncommand: python train.py\nimage: registry.example/team/torch:2.3\n"
                          "mounts: [/data, {source: /scratch, target: /out, writable: true}]\nshm_size: 8g\n")
    assert spec.image == "registry.example/team/torch:2.3" and spec.shm_size_mib == 8192
    assert spec.mounts == [Mount("/data", "/data"), Mount("/scratch", "/out", True)]
    back = spec_from_proto(spec_to_proto(spec))
    assert (back.image, back.mounts, back.shm_size_mib) == (spec.image, spec.mounts, spec.shm_size_mib)
    assert parse_job_yaml("gpus: 1\ncommand: x\n").image == ""     # a job without an image runs as before


@pytest.mark.parametrize(("text", "field"), [
    ("image: 'bad image!'", "image:"),
    ("mounts: [/data]", "mounts: only for jobs with an image"),
    ("image: x\nmounts: [/etc]", "mounts[0].target"),
    ("image: x\nmounts: [relative]", "mounts[0].source"),
    ("image: x\nmounts: ['/a:/b', '/c:/b']", "mounted twice"),
    ("image: x\nshm_size: lots", "shm_size: must be a size"),
    ("image: x\nmounts: /data", "mounts: must be a list"),
])
def test_bad_container_fields_are_named(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_job_yaml(f"gpus: 1\ncommand: x\n{text}\n")
    assert field in str(err.value), err.value


def test_mount_text_forms() -> None:
    assert parse_mount("/d") == Mount("/d", "/d", False)
    assert parse_mount("/d:/in:rw") == Mount("/d", "/in", True)
    with pytest.raises(ValueError, match="SRC"):
        parse_mount("/a:/b:/c:ro")


def engine_cfg(data: object) -> tuple[oci.EngineConfig, list[str]]:
    problems = Problems()
    cfg = oci.read_engine_config(Reader(data, "containers", problems))
    return cfg, problems.items


def test_agent_yaml_engine_settings() -> None:
    cfg, problems = engine_cfg({"engine": "podman", "engine_runtime": "runc", "engine_cgroup_manager": "cgroupfs",
                                "engine_ulimits": ["nofile=1024:1024"], "pull_timeout": "2m",
                                "mounts_allowed": ["/data", {"path": "/scratch", "writable": True}]})
    assert not problems
    assert cfg.kind is oci.EngineKind.PODMAN and cfg.runtime == "runc" and cfg.ulimits == ("nofile=1024:1024",)
    assert cfg.pull_timeout_s == 120 and cfg.mounts_allowed == (oci.MountRule("/data"), oci.MountRule("/scratch", True))
    assert engine_cfg({})[0] == oci.EngineConfig()        # auto everything
    _, problems = engine_cfg({"engine": "lxc", "engine_ulimits": ["nofile"], "mounts_allowed": ["data"]})
    assert len(problems) == 3 and any("engine" in p and "lxc" in p for p in problems), problems


def test_run_argv_drops_privileges_and_keeps_secrets_off_the_command_line(tmp_path: Path) -> None:
    engine = oci.Engine(oci.EngineKind.PODMAN, "/usr/bin/podman", ("--runtime", "runc"), ("nofile=64:64",))
    by_name, by_value = oci.split_env({"TOKEN": "s3cret", "PATH": "/bin"})
    argv = oci.run_argv(engine, oci.EngineRun(
        name="n", image="img:1", argv=["python", "t.py"], labels={"gpurm.container": "c1"}, uid=1000, gid=100,
        work_dir=tmp_path, env_names=by_name, env_values=by_value, mounts=[Mount("/d", "/d")], shm_size_mib=64,
        cpus=2.5, memory_mib=512, groups=[5, 0]))
    text = " ".join(argv)
    assert argv[:3] == ["/usr/bin/podman", "--runtime", "runc"] and argv[-3:] == ["img:1", "python", "t.py"]
    for part in ("--user 1000:100", "--cap-drop all", "--security-opt no-new-privileges", "--network host",
                 "--init", "--ulimit nofile=64:64", "-v /d:/d:ro", "--shm-size 64m", "--cpus 2.5", "--memory 512m",
                 "--env TOKEN", "--env PATH=/bin", "--label gpurm.container=c1", f"-v {tmp_path}:/gpurm/work:rw"):
        assert part in text, part
    assert "s3cret" not in text and "--group-add 5" in text and "--group-add 0" not in text
    with pytest.raises(ValueError):
        oci.run_argv(engine, oci.EngineRun(name="n", image="i", argv=[], labels={}, uid=0, gid=0, work_dir=tmp_path))


def test_mounts_follow_the_servers_rules(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to("/etc")
    rules = (oci.MountRule(str(data)),)
    assert oci.check_mounts([Mount(str(data / "sub"), "/d")], rules) == ""
    assert "read-only" in oci.check_mounts([Mount(str(data), "/d", True)], rules)
    assert "does not allow" in oci.check_mounts([Mount(str(tmp_path / "link"), "/d")], (oci.MountRule(str(tmp_path)),))
    assert "does not allow" in oci.check_mounts([Mount(str(tmp_path) + "/data2", "/d")], rules)


def test_gpus_pass_by_cdi_devices_or_env() -> None:
    uuids = {2: "GPU-a", 5: "GPU-b"}
    flags, env = oci.gpu_args(oci.GpuPassing.CDI, [2, 5], uuids)
    assert flags == ["--device", "nvidia.com/gpu=GPU-a", "--device", "nvidia.com/gpu=GPU-b"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    flags, env = oci.gpu_args(oci.GpuPassing.DEVICES, [5], uuids)
    assert flags[:2] == ["--device", "/dev/nvidia5"] and env["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert oci.gpu_args(oci.GpuPassing.ENV, [2], uuids) == ([], {})


def test_a_foreground_runs_exit_code_reads_as_the_containers_end() -> None:
    assert oci.image_exit(125, False)[3] is True                     # the engine failed: the server's fault
    assert oci.image_exit(127, False)[2] is True                     # command not in the image: the job's
    assert oci.image_exit(143, True)[0] == -15                       # stopped: killed by SIGTERM
    assert oci.image_exit(143, False)[0] == 143                      # its own exit code otherwise
    assert oci.image_exit(0, False) == (0, "", False, False)


def test_an_image_job_plans_only_on_servers_with_an_engine() -> None:
    from gpurm.am.runner import servers_from_view
    from gpurm.proto import gpurm_pb2 as pb

    view = pb.ClusterView(nodes=[
        pb.NodeView(node_id="a", rack="r", gpus_total=2, gpus_healthy=2, free_gpus=[0, 1], state=pb.NODE_RUNNING,
                    container_engine="podman"),
        pb.NodeView(node_id="b", rack="r", gpus_total=2, gpus_healthy=2, free_gpus=[0, 1], state=pb.NODE_RUNNING)])
    assert [s.node_id for s in servers_from_view(view)] == ["a", "b"]
    assert [s.node_id for s in servers_from_view(view, image="localhost/x:1")] == ["a"]


def test_image_names_compare_as_engines_resolve_them() -> None:
    from gpurm.common.jobspec import image_key

    assert image_key("torch:2.3") == "docker.io/library/torch:2.3"
    assert image_key("team/torch") == "docker.io/team/torch:latest"
    assert image_key("localhost/x") == "localhost/x:latest"
    assert image_key("reg.example:5000/a/b:1") == "reg.example:5000/a/b:1"
    assert image_key("reg.example/a@sha256:ab") == "reg.example/a@sha256:ab"


def test_at_equal_locality_the_plan_prefers_servers_holding_the_image() -> None:
    from gpurm.am.placement import ServerView, plan
    from gpurm.common.jobspec import LocalityLevel

    def server(name: str, free: int, image: bool = False) -> ServerView:
        return ServerView(node_id=name, rack="r", total=4, free=tuple(range(free)), has_image=image)

    for level in (LocalityLevel.NODE, LocalityLevel.PACKED, LocalityLevel.ANY):
        for salt in (None, 7):
            chosen = plan(2, [server("a", 4), server("b", 4), server("z", 4, image=True)], level, salt=salt)
            assert chosen is not None and [p.node_id for p in chosen.parts] == ["z"], (level, salt)
    # Locality (best fit) first: a tighter server wins over one that holds the image.
    chosen = plan(2, [server("a", 2), server("z", 4, image=True)], LocalityLevel.NODE)
    assert chosen is not None and [p.node_id for p in chosen.parts] == ["a"]
    # Several servers: those holding the image fill first among equals.
    chosen = plan(8, [server("a", 4), server("b", 4), server("c", 4, image=True)], LocalityLevel.ANY)
    assert chosen is not None and "c" in [p.node_id for p in chosen.parts]


def test_only_plain_environment_names_reach_the_engines_command_line() -> None:
    by_name, by_value = oci.split_env({"OK_1": "a", "-e": "x", "A=B": "y", "PATH": "/bin", "bad name": "z"})
    assert by_name == ["OK_1"] and by_value == {"PATH": "/bin"}


def test_the_image_example_job_file_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    spec = parse_job_yaml((root / "configs" / "jobs" / "image-hello.yaml").read_text())
    assert spec.image.startswith("docker.io/") and spec.shm_size_mib == 1024 and spec.workdir == ""
