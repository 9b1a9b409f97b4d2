"""The RM's MQTT publisher: job events, the cluster view and GPU telemetry go out in the background and never block
the RM (topics and clients are gpurm/common/mqtt.py), and the check a node's telemetry passes before the RM
republishes it."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import random
from collections import OrderedDict

import aiomqtt
from aiomqtt.exceptions import MqttConnectError

from gpurm.common.aio import stop_task
from gpurm.common.mqtt import Credentials, client

log = logging.getLogger(__name__)

MAX_TELEMETRY_BYTES = 64 * 1024   # one node's telemetry JSON, as its heartbeat carries it
PIPELINE = 64                     # retained messages in flight at once (each awaits its PUBACK)
PUBLISH_TIMEOUT_S = 10.0          # ... all of them acknowledged within this, or the connection is made anew


def telemetry_problem(node_id: str, payload: bytes) -> str:
    """Why a node's heartbeat telemetry may not be republished on gpurm/telemetry/<node_id> ("" = it may): at
    most 64 KiB, a JSON object, naming no other node, and a node id that is one plain topic level."""
    if not node_id or any(c in node_id for c in "/+#\0"):
        return f"telemetry: node id {node_id[:128]!r} cannot be one MQTT topic level (no /, +, # or NUL)"
    if len(payload) > MAX_TELEMETRY_BYTES:
        return f"telemetry: {len(payload)} bytes, the most is {MAX_TELEMETRY_BYTES}"
    try:
        data = json.loads(payload)
    except ValueError as exc:
        return f"telemetry: not JSON: {str(exc)[:200]}"
    if not isinstance(data, dict):
        return f"telemetry: expected a JSON object, got {type(data).__name__}"
    if data.get("node_id", node_id) != node_id:
        return f"telemetry: names node {str(data.get('node_id'))[:128]!r}, not the sender {node_id[:128]!r}"
    return ""



class Publisher:
    """Publishes in the background and never blocks its caller.

    Retained topics are coalesced (only the newest payload per topic is kept while waiting), so a broker outage
    costs memory proportional to the number of topics, not of messages; on reconnect the newest state of every
    topic goes out. Non-retained messages wait in a bounded queue and the oldest are dropped first.
    """

    def __init__(self, url: str, name: str, credentials: Credentials, max_stream: int = 10000) -> None:
        self.url = url
        self.credentials = credentials
        self.name = name
        self._retained: OrderedDict[str, bytes] = OrderedDict()
        self._stream: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(max_stream)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.published = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"mqtt-publisher-{self.name}")

    async def stop(self) -> None:
        await stop_task(self._task)      # cancelled while connecting, it may carry on: see gpurm/common/aio.py

    def publish_retained(self, topic: str, payload: bytes) -> None:
        self._retained[topic] = payload
        self._retained.move_to_end(topic)
        self._wake.set()

    def publish(self, topic: str, payload: bytes) -> None:
        if self._stream.full():
            self._stream.get_nowait()
        self._stream.put_nowait((topic, payload))
        self._wake.set()

    async def _run(self) -> None:
        delay = 0.2
        warned = False
        while True:
            try:
                async with client(self.url, self.credentials, inflight=PIPELINE) as c:
                    self.connected = True
                    delay = 0.2
                    if warned:
                        log.info("%s: MQTT broker %s reachable again", self.name, self.url)
                        warned = False
                    await self._pump(c)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.connected = False
                if not warned:
                    if isinstance(exc, MqttConnectError):
                        log.warning("%s: MQTT broker %s refused the login %r (%s): check mqtt.username and "
                                    "mqtt.password_file, or the broker's password file; retrying", self.name,
                                    self.url, self.credentials.username, exc)
                    else:
                        log.warning("%s: MQTT broker %s unreachable (%s); retrying", self.name, self.url, exc)
                    warned = True
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)

    async def _pump(self, c: aiomqtt.Client) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not self._stream.empty():
                topic, payload = self._stream.get_nowait()
                await c.publish(topic, payload, qos=0)
                self.published += 1
            while self._retained:
                # Several at once: each QoS 1 publish waits for its PUBACK, and one at a time the publisher spent a
                # broker round trip per job event (a burst of submits is one event each).
                # One deadline for the batch (aiomqtt's own per publish costs a task and a timer each): a broker that
                # does not answer in time breaks the connection, and the batch goes out again on the next.
                batch = list(itertools.islice(self._retained.items(), PIPELINE))
                async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                    await asyncio.gather(*(c.publish(topic, payload, qos=1, retain=True, timeout=math.inf)
                                           for topic, payload in batch))
                for topic, payload in batch:
                    # Only drop it if no newer payload arrived while publishing.
                    if self._retained.get(topic) is payload:
                        del self._retained[topic]
                self.published += len(batch)
