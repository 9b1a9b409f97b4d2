"""Container output published over a real MQTT broker (mosquitto, or the embedded one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.logstream import OFFSET, LogStreamer, parse_mqtt_url
from gpurm.proto import gpurm_pb2 as pb
from tests.conftest import free_port

WAIT = 10.0


class Subscriber:
    """Collects (topic, offset, data) of every log message."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, int, bytes]] = []
        self.changed = asyncio.Event()

    def text(self, topic: str) -> bytes:
        """The stream of one topic reassembled by offset; fails on a gap or overlap."""
        out = b""
        for _topic, offset, data in sorted((m for m in self.messages if m[0] == topic), key=lambda m: m[1]):
            assert offset == len(out), f"gap or overlap at {offset} (have {len(out)})"
            out += data
        return out

    async def wait_text(self, topic: str, expected: bytes) -> None:
        async def poll() -> None:
            while True:
                self.changed.clear()  # before the check, so a message arriving after it still wakes us
                if self._text_or_none(topic) == expected:
                    return
                await self.changed.wait()
        await asyncio.wait_for(poll(), WAIT)

    def _text_or_none(self, topic: str) -> bytes | None:
        try:
            return self.text(topic)
        except AssertionError:
            return None


@pytest.fixture
async def subscriber(mqtt_url: str) -> AsyncIterator[Subscriber]:
    host, port = parse_mqtt_url(mqtt_url)
    sub = Subscriber()
    ready = asyncio.Event()

    async def listen() -> None:
        async with aiomqtt.Client(host, port, protocol=aiomqtt.ProtocolVersion.V311) as client:
            await client.subscribe("gpurm/logs/#")
            ready.set()
            async for message in client.messages:
                payload = message.payload
                assert isinstance(payload, bytes)
                (offset,) = OFFSET.unpack(payload[:8])
                sub.messages.append((str(message.topic), offset, payload[8:]))
                sub.changed.set()

    task = asyncio.create_task(listen())
    await asyncio.wait_for(ready.wait(), WAIT)
    try:
        yield sub
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def sup(tmp_path: Path) -> AsyncIterator[ContainerSupervisor]:
    s = ContainerSupervisor("node-a", tmp_path / "state", stop_grace_s=1.0)
    try:
        yield s
    finally:
        await s.stop_all(0.5)
        await s.close()


@pytest.fixture
async def streamer(sup: ContainerSupervisor) -> AsyncIterator[LogStreamer]:
    st = LogStreamer(sup, poll_s=0.02, node_id="node-a")
    task = asyncio.create_task(st.run())
    try:
        yield st
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_output_is_published_with_offsets(sup: ContainerSupervisor, streamer: LogStreamer,
                                                subscriber: Subscriber, mqtt_url: str) -> None:
    streamer.set_broker(mqtt_url)
    # 150 000 bytes then a line: more than two 64 KiB chunks, written before the container exits.
    script = "head -c 150000 /dev/zero | tr '\\0' x; echo; echo done"
    await sup.start("c-log", "job-7", pb.CONTAINER_LEARNER, ["/bin/sh", "-c", script], {}, "", [], 1, "u")
    expected = b"x" * 150000 + b"\ndone\n"
    await subscriber.wait_text("gpurm/logs/job-7/c-log", expected)
    assert max(len(m[2]) for m in subscriber.messages) <= 64 * 1024
    assert sup.read_log("c-log", 0, 1 << 20).data == expected


async def test_unreachable_broker_is_survived_and_output_caught_up(
        sup: ContainerSupervisor, streamer: LogStreamer, subscriber: Subscriber, mqtt_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gpurm.nodeagent.logstream")
    streamer.set_broker(f"mqtt://127.0.0.1:{free_port()}")  # nobody listens there
    rec = await sup.start("c-late", "job-8", pb.CONTAINER_LEARNER, ["/bin/sh", "-c", "echo early"], {}, "",
                          [], 1, "u")
    await asyncio.wait_for(sup.wait_ended(rec.container_id), WAIT)

    async def warned() -> None:
        while "unreachable" not in caplog.text:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(warned(), WAIT)
    assert subscriber.messages == []
    streamer.set_broker(mqtt_url)  # the broker is back (or the RM handed out a new URL)
    await subscriber.wait_text("gpurm/logs/job-8/c-late", b"early\n")
    assert caplog.text.count("unreachable") == 1  # warned once, not on every retry
