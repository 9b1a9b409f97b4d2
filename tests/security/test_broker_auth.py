"""Finding 4 (issue 13): the MQTT broker was anonymous, so anyone could publish a forged ClusterView delta on
gpurm/cluster/delta (version 2^62: every waiting AM ignores the RM's real views) and read every job's output.

Against real brokers (the embedded amqtt, and mosquitto started with the files `gpurm admin broker-files`
writes): anonymous and wrong-password clients are refused; the read-only login the RM hands out cannot publish a
forged delta or view (a subscriber with the RM's rights never receives it) and cannot subscribe beyond views, jobs
and telemetry; it can read the view; the RM's login publishes. End to end: a dev cluster on the embedded broker
runs a multi-node job with every AM following the view over MQTT, after the attack was tried on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from gpurm.common import mqtt
from gpurm.common.mqtt import Credentials
from gpurm.proto import gpurm_pb2 as pb
from gpurm.rm.security.brokerauth import load
from tests.conftest import TestBroker, free_port, run_broker, wait_port
from tests.integration.harness import ROOT, DevCluster
from tests.integration.rmproc import RMProcess, poll

WAIT = 10.0
FORGED = pb.ClusterView(version=2**62, base_version=0, delta=True, time_ms=1,
                        nodes=[pb.NodeView(node_id="forged")]).SerializeToString()
HAS_MOSQUITTO = bool(shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists())


@pytest.fixture(scope="module", params=["amqtt", "mosquitto"])
def any_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """Each broker kind in turn (mosquitto only where the binary exists); the suite's own broker is one of them."""
    with run_broker(tmp_path_factory.mktemp(f"auth-{request.param}"), kind=request.param) as b:
        yield b


async def refused(url: str, credentials: Credentials | None) -> bool:
    try:
        async with mqtt.client(url, credentials):
            return False
    except aiomqtt.MqttError:
        return True


def test_anonymous_and_wrong_password_clients_are_refused(any_broker: TestBroker) -> None:
    b = any_broker
    assert asyncio.run(refused(b.url, None))
    assert asyncio.run(refused(b.url, Credentials(b.auth.rm.username, b.auth.reader.password)))
    assert asyncio.run(refused(b.url, Credentials("mallory", b.auth.rm.password)))
    assert not asyncio.run(refused(b.url, b.auth.rm))        # the same broker takes the real logins
    assert not asyncio.run(refused(b.url, b.auth.reader))


async def forge_and_watch(b: TestBroker, forger: Credentials) -> list[tuple[str, bytes]]:
    """An RM-rights subscriber on the view topics; `forger` publishes a forged delta and a forged retained view,
    then the RM publishes a marker. Returns what the subscriber got up to the marker, and any retained view."""
    got: list[tuple[str, bytes]] = []
    marker = uuid.uuid4().bytes
    async with mqtt.client(b.url, b.auth.rm) as watcher:
        await watcher.subscribe(mqtt.TOPIC_VIEW_DELTA, qos=1)
        async with mqtt.client(b.url, forger) as attacker:
            await attacker.publish(mqtt.TOPIC_VIEW_DELTA, FORGED, qos=1)
            await attacker.publish(mqtt.TOPIC_VIEW, FORGED, qos=1, retain=True)
        async with mqtt.client(b.url, b.auth.rm) as rm:
            await rm.publish(mqtt.TOPIC_VIEW_DELTA, marker, qos=1)
        async for message in watcher.messages:
            payload = bytes(message.payload) if isinstance(message.payload, bytes | bytearray) else b""
            if payload == marker:
                break
            got.append((str(message.topic), payload))
    async with mqtt.client(b.url, b.auth.rm) as late:        # a new subscriber: is a forged view retained?
        await late.subscribe(mqtt.TOPIC_VIEW, qos=1)
        try:
            async with asyncio.timeout(1.0):
                async for message in late.messages:
                    got.append((str(message.topic), bytes(message.payload)))  # type: ignore[arg-type]
        except TimeoutError:
            pass
    return got


def test_the_reader_cannot_forge_a_view(any_broker: TestBroker) -> None:
    got = asyncio.run(asyncio.wait_for(forge_and_watch(any_broker, any_broker.auth.reader), WAIT))
    assert all(payload != FORGED for _, payload in got), got


def test_the_same_forgery_with_the_rm_login_does_arrive(any_broker: TestBroker) -> None:
    """The attack above is a real one: with publishing rights it gets through (so its absence above is the ACL)."""
    got = asyncio.run(asyncio.wait_for(forge_and_watch(any_broker, any_broker.auth.rm), WAIT))
    assert (mqtt.TOPIC_VIEW_DELTA, FORGED) in got and (mqtt.TOPIC_VIEW, FORGED) in got
    async def clear() -> None:                                  # leave no forged retained view for others
        async with mqtt.client(any_broker.url, any_broker.auth.rm) as rm:
            await rm.publish(mqtt.TOPIC_VIEW, b"", qos=1, retain=True)
    asyncio.run(clear())


async def reader_sees(b: TestBroker, job_topic: str) -> tuple[bytes, list[int]]:
    view = pb.ClusterView(version=7, nodes=[pb.NodeView(node_id="n1")]).SerializeToString()
    async with mqtt.client(b.url, b.auth.rm) as rm:
        await rm.publish(job_topic, view, qos=1, retain=True)
    async with mqtt.client(b.url, b.auth.reader) as reader:
        granted: list[int] = []
        for wide in ("gpurm/#", "gpurm/logs/#", "#", "$SYS/#"):
            codes = await reader.subscribe(wide, qos=0)
            granted += [int(c.value if hasattr(c, "value") else c) for c in codes]
        await reader.subscribe(job_topic, qos=1)
        async for message in reader.messages:
            if str(message.topic) == job_topic:
                return bytes(message.payload), granted  # type: ignore[arg-type]
    raise AssertionError("no message")


def test_the_reader_reads_jobs_and_views_and_nothing_wider(any_broker: TestBroker) -> None:
    job_topic = mqtt.TOPIC_JOB.format(job_id=f"job-{uuid.uuid4().hex[:8]}")
    payload, granted = asyncio.run(asyncio.wait_for(reader_sees(any_broker, job_topic), WAIT))
    assert pb.ClusterView.FromString(payload).version == 7          # the RM's login published, the reader read
    # mosquitto grants a subscription it will never deliver on (ACLs filter each message); amqtt refuses it.
    if any_broker.kind == "amqtt":
        assert granted == [0x80] * 4, granted


def test_the_reader_never_receives_log_topics(any_broker: TestBroker) -> None:
    """Whatever a broker grants on SUBSCRIBE, nothing outside views/jobs/telemetry reaches the reader."""
    secret_topic = f"gpurm/logs/job-{uuid.uuid4().hex[:8]}/c1"

    async def run() -> list[str]:
        seen: list[str] = []
        async with mqtt.client(any_broker.url, any_broker.auth.reader) as reader:
            await reader.subscribe("gpurm/#", qos=1)
            await reader.subscribe(mqtt.TOPIC_JOB.format(job_id="marker"), qos=1)
            async with mqtt.client(any_broker.url, any_broker.auth.rm) as rm:
                await rm.publish(secret_topic, b"learner output", qos=1)
                await rm.publish(mqtt.TOPIC_JOB.format(job_id="marker"), b"{}", qos=1)
            async for message in reader.messages:
                seen.append(str(message.topic))
                if str(message.topic).endswith("/marker"):
                    return seen
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), WAIT))
    assert seen and seen[-1].endswith("/marker") and secret_topic not in seen, seen


@pytest.mark.skipif(not HAS_MOSQUITTO, reason="no mosquitto binary here")
def test_broker_files_command_configures_mosquitto(tmp_path: Path) -> None:
    """`gpurm admin broker-files` writes what mosquitto needs; mosquitto started with it enforces the roles."""
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "admin", "broker-files", str(tmp_path / "etc"),
                          "--state-dir", str(tmp_path / "rm"), "--listen", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    auth = load(tmp_path / "rm" / "broker.secret")
    conf = tmp_path / "main.conf"   # as a packaged mosquitto would include it; root stays root under /tmp
    conf.write_text(f"user {pwd.getpwuid(os.geteuid()).pw_name}\npersistence false\n"
                    f"include_dir {tmp_path / 'etc'}\n")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with (tmp_path / "mosquitto.log").open("wb") as log:
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_port(port)
        url = f"mqtt://127.0.0.1:{port}"
        b = TestBroker(url, "mosquitto", auth, tmp_path / "unused", tmp_path / "unused")
        assert asyncio.run(refused(url, None))
        got = asyncio.run(asyncio.wait_for(forge_and_watch(b, auth.reader), WAIT))
        assert all(payload != FORGED for _, payload in got), got
    finally:
        proc.terminate()
        proc.wait(5)

    bad = subprocess.run([sys.executable, "-m", "gpurm.cli.main", "admin", "broker-files", str(tmp_path / "x"),
                          "--state-dir", str(tmp_path / "rm"), "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert bad.returncode == 2 and "--listen: port must be 1-65535" in bad.stderr
    assert not (tmp_path / "x").exists()                       # bad input changes nothing


def test_dev_cluster_on_the_embedded_broker_runs_jobs_after_a_forgery(tmp_path: Path) -> None:
    """The embedded broker with credentials, end to end: the reader login anyone can get from GetClusterInfo
    cannot freeze the AMs with a forged delta; a 2-node job runs with its AM following the view over MQTT."""
    c = DevCluster(tmp_path / "c", nodes=2, racks=1)           # no --mqtt-url: the RM's embedded amqtt
    try:
        info = c.client.GetClusterInfo(pb.ClusterInfoRequest(), timeout=5)
        assert info.mqtt_username == "gpurm-reader" and info.mqtt_password
        secret = load(tmp_path / "c" / "rm" / "broker.secret")
        assert info.mqtt_password == secret.reader.password and info.mqtt_password != secret.rm.password
        b = TestBroker(info.mqtt_url, "amqtt", secret, tmp_path / "unused", tmp_path / "unused")
        assert asyncio.run(refused(info.mqtt_url, None))
        got = asyncio.run(asyncio.wait_for(
            forge_and_watch(b, Credentials(info.mqtt_username, info.mqtt_password)), WAIT))
        assert all(payload != FORGED for _, payload in got), got

        toy = str(ROOT / "configs" / "jobs" / "toy_train.py")
        job_id = c.submit("--gpus", "16", "--", "python3", toy, "--steps", "5")
        follow = c.gpurm("logs", job_id, "-f", timeout=90)       # GetLogs polling through the RM, to the end
        assert follow.code == 0, follow.err
        assert follow.out.count("[rank 0] step ") == 5 and "[rank 1] rank 1 done" in follow.out, follow.out
        job = c.wait_job(job_id, timeout=30)
        assert job.state == pb.JOB_SUCCEEDED, job.diagnostics
        am_log = c.gpurm("logs", job_id, "--am").out
        summary = next(line for line in am_log.splitlines() if "cluster view:" in line)
        assert "polling the RM" not in am_log, am_log                 # the AM's reader login was accepted
        version = int(summary.split("version ")[1].split(",")[0])
        assert version < 2**62, summary                            # the forged version never arrived
    finally:
        c.stop()


def test_an_rm_with_a_wrong_password_is_refused_and_says_which_key(tmp_path: Path, broker: TestBroker) -> None:
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("not-the-password\n")
    rm = RMProcess(tmp_path / "rm", dataclasses.replace(broker, rm_password_file=wrong))
    try:
        poll(lambda: "refused the login 'gpurm-rm'" in rm.log_text() or None, WAIT,
             lambda: f"no refusal in the RM's log:\n{rm.log_text()}")
        assert "check mqtt.username and mqtt.password_file" in rm.log_text()
    finally:
        assert rm.close() == 0, rm.log_text()
