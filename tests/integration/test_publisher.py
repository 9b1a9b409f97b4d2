"""The RM's MQTT publisher (rm/server/publisher.py) against a real broker: a burst of retained job events goes out
several at a time (each QoS 1 publish awaits its PUBACK), and the broker ends up holding the newest payload of
every topic, none lost, none stale."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpurm.common import mqtt
from gpurm.rm.server.publisher import PIPELINE, Publisher
from tests.conftest import TestBroker


def test_a_burst_of_retained_events_reaches_the_broker_newest_first_and_whole(broker: TestBroker,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    topics = [f"gpurm/jobs/job-{i}" for i in range(3 * PIPELINE + 7)]     # more than one batch

    async def main() -> dict[str, bytes]:
        pub = Publisher(broker.url, "test", broker.auth.rm)
        pub.start()
        try:
            for i, topic in enumerate(topics):
                pub.publish_retained(topic, f"first {i}".encode())
            for i, topic in enumerate(topics[::3]):   # newer events for some, while the first ones go out
                pub.publish_retained(topic, f"newest {i}".encode())
            for _ in range(400):
                await asyncio.sleep(0.05)
                if pub.connected and not pub._retained:
                    break
            assert not pub._retained, f"{len(pub._retained)} retained events never went out"
        finally:
            await pub.stop()
        seen: dict[str, bytes] = {}
        async with mqtt.client(broker.url, broker.auth.reader) as reader:
            await reader.subscribe("gpurm/jobs/+", qos=1)
            try:
                async with asyncio.timeout(10):
                    async for message in reader.messages:
                        seen[str(message.topic)] = bytes(message.payload)   # type: ignore[arg-type]
                        if len(seen) == len(topics) and all(
                                seen.get(t, b"").startswith(b"newest") for t in topics[::3]):
                            break
            except TimeoutError:
                pass
        return seen

    with caplog.at_level(logging.WARNING):
        seen = asyncio.run(main())
    # A batch in flight is what the publisher asks for: no warning per publish about the calls waiting (aiomqtt's).
    assert not [r for r in caplog.records if "pending publish" in r.getMessage()]
    assert set(seen) == set(topics)
    newest = {t: f"newest {i}".encode() for i, t in enumerate(topics[::3])}
    for i, topic in enumerate(topics):
        assert seen[topic] == newest.get(topic, f"first {i}".encode()), topic
