"""agent.yaml loading and validation, and the fake GPU topology."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.nodeagent.config import DEFAULT_ENV_PASSTHROUGH, ConfigError, load_agent_config
from gpurm.nodeagent.fakegpu import FakeGpuProvider
from gpurm.nodeagent.gpus import GpuDiscoveryError, make_provider
from gpurm.proto import gpurm_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
FAKE2 = {"gpus": {"fake": 2}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    cfg = load_agent_config(None, FAKE2, environ={})
    assert cfg.node_id  # the short hostname
    assert "." not in cfg.node_id
    assert cfg.host == "127.0.0.1"
    assert cfg.listen == "0.0.0.0:7071"
    assert cfg.listen_port == 7071
    assert cfg.rm == "127.0.0.1:7070"
    assert cfg.rack == "rack-0"
    assert cfg.ib_domain == "rack-0"
    assert cfg.state_dir == Path("/var/lib/gpurm/agent")
    assert cfg.gpus.fake == 2
    assert cfg.gpus.model == "H100-80GB"
    assert cfg.gpus.memory_mib == 81559
    assert cfg.gpus.nvlink_islands == 1
    assert cfg.containers.stop_grace_s == 10.0
    assert cfg.containers.keep_on_shutdown is False
    assert cfg.containers.env_passthrough == DEFAULT_ENV_PASSTHROUGH
    assert cfg.containers.log_poll_s == 0.25
    assert cfg.cpus >= 1
    assert cfg.memory_mib > 0


def test_file_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, """
node_id: from-file
rack: r7
listen: 127.0.0.1:9000
cpus: 64
memory_mib: 512000
gpus: {fake: 4, model: A100-40GB, memory_mib: 40960}
containers: {stop_grace: 1m, keep_on_shutdown: true, env_passthrough: [PATH], log_poll: 100ms}
""")
    cfg = load_agent_config(path, {"node_id": "n1", "listen": "127.0.0.1:0", "rack": None}, environ={})
    assert cfg.node_id == "n1"
    assert cfg.listen_port == 0
    assert cfg.rack == "r7"  # a None override means "not given"
    assert cfg.ib_domain == "r7"
    assert (cfg.cpus, cfg.memory_mib) == (64, 512000)
    assert (cfg.gpus.fake, cfg.gpus.model, cfg.gpus.memory_mib) == (4, "A100-40GB", 40960)
    assert cfg.containers.stop_grace_s == 60.0
    assert cfg.containers.keep_on_shutdown is True
    assert cfg.containers.env_passthrough == ("PATH",)
    assert cfg.containers.log_poll_s == pytest.approx(0.1)


def test_rm_from_environment_only_when_not_in_file(tmp_path: Path) -> None:
    assert load_agent_config(None, FAKE2, environ={"GPURM_RM": "rm1:7000"}).rm == "rm1:7000"
    path = write(tmp_path, "rm: rm2:7000\ngpus: {fake: 1}\n")
    assert load_agent_config(path, {}, environ={"GPURM_RM": "rm1:7000"}).rm == "rm2:7000"


def test_rm_takes_a_list_of_rms(tmp_path: Path) -> None:
    path = write(tmp_path, "rm: [rm-a:7070, rm-b:7070]\ngpus: {fake: 1}\n")
    cfg = load_agent_config(path, {}, environ={})
    assert cfg.rm == "rm-a:7070,rm-b:7070" and cfg.rm_list == ("rm-a:7070", "rm-b:7070")
    path = write(tmp_path, "rm: 'rm-a:7070, rm-b:7070'\ngpus: {fake: 1}\n")
    assert load_agent_config(path, {}, environ={}).rm_list == ("rm-a:7070", "rm-b:7070")
    assert load_agent_config(None, FAKE2, environ={"GPURM_RM": "a:1,b:2"}).rm_list == ("a:1", "b:2")
    assert load_agent_config(None, {**FAKE2, "rm": "c:1,d:2"}, environ={}).rm_list == ("c:1", "d:2")   # --rm


@pytest.mark.parametrize(("rm", "why"), [
    ("[rm-a:7070, rm-a:7070]", "rm: 'rm-a:7070' is listed twice"),
    ("'rm-a:7070,'", "rm: item 2 is empty"),
    ("[rm-a:7070, {x: 1}]", "rm: item 2: expected HOST:PORT, got dict"),
    ("7070", "rm: expected HOST:PORT or a list of them, got 7070"),
    ("[rm-a:0]", "rm: 'rm-a:0': port must be from 1 to 65535"),
])
def test_a_bad_rm_list_is_named(tmp_path: Path, rm: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(write(tmp_path, f"rm: {rm}\ngpus: {{fake: 1}}\n"), {}, environ={})
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(why), info.value.problems


def test_a_bad_gpurm_rm_is_named_as_such() -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, FAKE2, environ={"GPURM_RM": "a:1,,b:2"})
    assert info.value.problems == ["rm: item 2 is empty (write HOST:PORT[,HOST:PORT...] with no empty items) "
                                   "(from GPURM_RM)"]


def test_unknown_keys_are_rejected_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, "node_idd: x\ngpus: {fake: 1, modle: X}\ncontainers: {grace: 5s}\n")
    with pytest.raises(ConfigError) as info:
        load_agent_config(path, {}, environ={})
    text = "\n".join(info.value.problems)
    assert "node_idd: unknown field (did you mean 'node_id'?)" in text
    assert "gpus.modle: unknown field (did you mean 'model'?)" in text
    assert "containers.grace: unknown field" in text
    assert len(info.value.problems) == 3


def test_unknown_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match="listn"):
        load_agent_config(None, {**FAKE2, "listn": "1.2.3.4:5"}, environ={})


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, """
listen: nowhere
rm: host:99999
gpus: {fake: 4, nvlink_islands: 3}
containers: {stop_grace: soon, keep_on_shutdown: maybe, log_poll: 0}
""")
    with pytest.raises(ConfigError) as info:
        load_agent_config(path, {}, environ={})
    fields = [p.split(":")[0] for p in info.value.problems]
    assert fields == ["listen", "rm", "gpus.nvlink_islands", "containers.stop_grace",
                      "containers.keep_on_shutdown", "containers.log_poll"]
    assert "expected a duration like 90s, 5m or 500ms, got 'soon'" in info.value.problems[3]


def test_missing_gpus_is_one_clear_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, {}, environ={})
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("gpus: no GPU provider configured")
    assert "gpus.fake" in info.value.problems[0]


def test_nvml_config() -> None:
    cfg = load_agent_config(None, {"gpus": {"nvml": True}}, environ={})
    assert cfg.gpus.nvml and cfg.gpus.fake is None
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, {"gpus": {"nvml": True, "fake": 2, "fail_gpus": [0]}}, environ={})
    assert info.value.problems == ["gpus.fake: set only one of gpus.fake and gpus.nvml",
                                   "gpus.fail_gpus: only the fake provider (gpus.fake) injects faults"]


def test_health_and_telemetry_config(tmp_path: Path) -> None:
    cfg = load_agent_config(None, FAKE2, environ={})
    assert (cfg.health.gpu_interval_s, cfg.health.script, cfg.telemetry.interval_s) == (5.0, None, 5.0)
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\necho ok\n")
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, {**FAKE2, "health": {"script": str(script), "interval": "0s"},
                                 "telemetry": {"interval": "soon"}}, environ={})
    assert [p.split(":")[0] for p in info.value.problems] == ["health.interval", "health.script",
                                                               "telemetry.interval"]
    script.chmod(0o755)
    cfg = load_agent_config(None, {"gpus": {"fake": 4, "fail_gpus": [3]},
                                   "health": {"script": str(script), "interval": "2s", "timeout": "1s"},
                                   "telemetry": {"interval": 0}}, environ={})
    assert cfg.gpus.fail_gpus == (3,)
    assert (cfg.health.script, cfg.health.interval_s, cfg.health.timeout_s) == (script, 2.0, 1.0)
    assert cfg.telemetry.interval_s == 0
    with pytest.raises(ConfigError, match=r"gpus.fail_gpus: indices \[4\] are not GPUs"):
        load_agent_config(None, {"gpus": {"fake": 4, "fail_gpus": [4]}}, environ={})


def test_container_series_interval(tmp_path: Path) -> None:
    assert load_agent_config(None, FAKE2, environ={}).telemetry.container_interval_s == 15.0
    cfg = load_agent_config(None, {**FAKE2, "telemetry": {"container_interval": "200ms"}}, environ={})
    assert cfg.telemetry.container_interval_s == 0.2
    assert load_agent_config(None, {**FAKE2, "telemetry": {"container_interval": 0}},
                             environ={}).telemetry.container_interval_s == 0
    for bad, why in (("-1s", "expected a duration"), ("1ms", r"must be 0 \(off\) or at least 0.05s"),
                     ("2d", "must be at most")):
        with pytest.raises(ConfigError, match=f"telemetry.container_interval: .*{why}"):
            load_agent_config(None, {**FAKE2, "telemetry": {"container_interval": bad}}, environ={})


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_agent_config(write(tmp_path, "gpus: [fake\n"), {}, environ={})
    with pytest.raises(ConfigError, match="cannot read agent config"):
        load_agent_config(tmp_path / "absent.yaml", {}, environ={})


def test_example_config_loads() -> None:
    cfg = load_agent_config(REPO / "configs" / "agent.yaml", {}, environ={})
    assert cfg.gpus.fake == 8
    assert cfg.ib_domain == "ib-a"


def test_fake_topology_two_islands() -> None:
    cfg = load_agent_config(None, {"node_id": "n1", "cpus": 16, "gpus": {"fake": 4, "nvlink_islands": 2}},
                            environ={})
    gpus = make_provider(cfg).discover()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert [g.cpu_affinity for g in gpus] == ["0-7", "0-7", "8-15", "8-15"]
    assert len({g.uuid for g in gpus}) == 4
    assert len({g.pci_bus_id for g in gpus}) == 4
    assert [g.pci_bus_id for g in gpus] == sorted(g.pci_bus_id for g in gpus)
    links = {(g.index, lk.peer): (lk.level, lk.nvlinks) for g in gpus for lk in g.links}
    assert links[(0, 1)] == (pb.LINK_NVLINK, 18)
    assert links[(2, 3)] == (pb.LINK_NVLINK, 18)
    assert links[(1, 2)] == (pb.LINK_SYSTEM, 0)
    assert links[(3, 0)] == (pb.LINK_SYSTEM, 0)
    assert (0, 0) not in links
    assert len(links) == 12
    info = gpus[1].to_proto()
    assert info.model == "H100-80GB" and info.memory_mib == 81559 and info.healthy
    assert [(lk.peer, lk.level) for lk in info.links] == [(0, pb.LINK_NVLINK), (2, pb.LINK_SYSTEM),
                                                          (3, pb.LINK_SYSTEM)]


def test_fake_uuids_are_deterministic_per_node() -> None:
    a = FakeGpuProvider(2, "X", 1, 1, "n1").discover()
    b = FakeGpuProvider(2, "X", 1, 1, "n1").discover()
    c = FakeGpuProvider(2, "X", 1, 1, "n2").discover()
    assert [g.uuid for g in a] == [g.uuid for g in b]
    assert not {g.uuid for g in a} & {g.uuid for g in c}
    assert all(g.uuid.startswith("GPU-") for g in a)


def test_one_island_is_all_nvlink() -> None:
    gpus = FakeGpuProvider(8, "X", 1, 1, "n1").discover()
    assert all(lk.level == pb.LINK_NVLINK for g in gpus for lk in g.links)


def test_islands_must_divide_count() -> None:
    with pytest.raises(ConfigError, match="nvlink_islands: must divide"):
        load_agent_config(None, {"gpus": {"fake": 6, "nvlink_islands": 4}}, environ={})
    with pytest.raises(GpuDiscoveryError):
        FakeGpuProvider(6, "X", 1, 4, "n1")


def test_the_metrics_exporter_listens_on_loopback_by_default_and_can_be_turned_off() -> None:
    assert load_agent_config(None, FAKE2, environ={}).telemetry.metrics_listen == "127.0.0.1:0"
    assert load_agent_config(REPO / "configs" / "agent.yaml", {}, environ={}).telemetry.metrics_listen == \
        "127.0.0.1:9400"
    off = load_agent_config(None, {**FAKE2, "telemetry": {"metrics_listen": "off"}}, environ={})
    assert off.telemetry.metrics_listen == ""
    with pytest.raises(ConfigError, match=r"telemetry\.metrics_listen"):
        load_agent_config(None, {**FAKE2, "telemetry": {"metrics_listen": "no-port-here"}}, environ={})


def test_rm_retry_defaults_to_never_giving_up_and_is_validated() -> None:
    cfg = load_agent_config(None, FAKE2, environ={})
    assert (cfg.rm_retry.base_s, cfg.rm_retry.max_s, cfg.rm_retry.give_up_s) == (0.2, 5.0, 0.0)
    cfg = load_agent_config(None, {**FAKE2, "rm_retry": {"base": "1s", "max": "30s", "give_up_after": "1h"}},
                            environ={})
    assert (cfg.rm_retry.base_s, cfg.rm_retry.max_s, cfg.rm_retry.give_up_s) == (1.0, 30.0, 3600.0)
    with pytest.raises(ConfigError) as err:
        load_agent_config(None, {**FAKE2, "rm_retry": {"base": "10s", "max": "1s", "every": 3}}, environ={})
    assert any("rm_retry.max" in p and "at least base" in p for p in err.value.problems), err.value.problems
    assert any("rm_retry.every" in p for p in err.value.problems), err.value.problems


def test_mqtt_advertise_is_checked() -> None:
    assert load_agent_config(None, FAKE2, environ={}).mqtt_advertise == ""
    cfg = load_agent_config(None, {**FAKE2, "mqtt": {"advertise": "mqtt://10.0.0.5:1883"}}, environ={})
    assert cfg.mqtt_advertise == "mqtt://10.0.0.5:1883"
    for bad in ("10.0.0.5:1883", "mqtt://10.0.0.5", "mqtt://:1883", "mqtt://broker:0"):
        with pytest.raises(ConfigError) as err:
            load_agent_config(None, {**FAKE2, "mqtt": {"advertise": bad}}, environ={})
        assert any(p.startswith("mqtt.advertise") and "mqtt://HOST:PORT" in p for p in err.value.problems), bad
    with pytest.raises(ConfigError, match=r"mqtt\.url"):
        load_agent_config(None, {**FAKE2, "mqtt": {"url": "mqtt://x:1"}}, environ={})
