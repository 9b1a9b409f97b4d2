"""Live container output over MQTT, for `gpurm logs -f`: topic `gpurm/logs/<job_id>/<container_id>`.

Each message is an 8-byte big-endian (logical, see logfiles.py) offset of the chunk in the container's output
followed by up to 64 KiB of raw bytes (QoS 0), so a reader sees gaps and can fill them from ReadLog. The file,
not the broker, is the record: with no broker, or an unreachable one, the agent keeps going and publishes
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiomqtt

from gpurm.nodeagent.backoff import Backoff
from gpurm.nodeagent.containers import ContainerSupervisor
from gpurm.nodeagent.logfiles import logical_size, read_range
from gpurm.nodeagent.records import ContainerRecord

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
# The most published per container per poll; beyond it the stream skips ahead (a reader sees the gap).
MAX_BACKLOG_BYTES = 1024 * 1024
OFFSET = struct.Struct(">Q")


def log_topic(job_id: str, container_id: str) -> str:
    return f"gpurm/logs/{job_id}/{container_id}"


def parse_mqtt_url(url: str) -> tuple[str, int]:
    """`mqtt://host:port` (or tcp://) → (host, port); ValueError naming the problem."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
        raise ValueError(f"expected mqtt://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port or 1883


@dataclass
class _Tracked:
    job_id: str
    cdir: Path
    offset: int = 0
    ended: bool = False


class LogStreamer:
    def __init__(self, supervisor: ContainerSupervisor, *, poll_s: float, node_id: str) -> None:
        self.supervisor = supervisor
        self.poll_s = poll_s
        self.node_id = node_id
        self.published_messages = 0
        self._url: str | None = None  # None = not known yet (hold output); "" = the cluster has no broker
        self._changed = asyncio.Event()
        self._tracked: dict[str, _Tracked] = {}
        self._backoff = Backoff(0.5, 30.0)
        for rec in supervisor.records():
            self._on_change(rec)
        supervisor.add_listener(self._on_change)

    def set_broker(self, url: str) -> None:
        """The broker URL from the RM's registration reply ("" = none)."""
        if url != self._url:
            self._url = url
            self._changed.set()

    async def run(self) -> None:
        """Publish new output until cancelled."""
        warned = False
        while True:
            url = self._url
            if not url:
                if url == "":
                    self._prune_ended()  # no broker: nobody will ever read what ended
                await self._wait_change(self.poll_s)
                continue
            try:
                host, port = parse_mqtt_url(url)
            except ValueError as exc:
                log.warning("log streaming off: %s", exc)
                await self._wait_change(None)
                continue
            try:
                async with aiomqtt.Client(host, port, protocol=aiomqtt.ProtocolVersion.V311, timeout=5.0,
                                          identifier=f"gpurm-agent-{self.node_id}-{uuid.uuid4().hex[:8]}"
                                          ) as client:
                    if warned:
                        log.info("log streaming: connected to the MQTT broker at %s", url)
                    warned = False
                    self._backoff.reset()
                    while self._url == url:
                        await self.publish_new(client)
                        await self._wait_change(self.poll_s)
            except Exception as exc:  # MqttError mostly; nothing here may stop the agent
                if not isinstance(exc, aiomqtt.MqttError):
                    log.exception("log streaming failed; retrying")
                elif not warned:
                    log.warning("log streaming: MQTT broker at %s unreachable (%s); output is kept in the "
                                "log files and published once it is back", url, exc)
                    warned = True
                await self._wait_change(self._backoff.next())

    async def publish_new(self, client: aiomqtt.Client) -> None:
        """Publish what every tracked container wrote since the last call; drop ended, drained ones.

        Offsets are logical (bytes written since the container started, across rotations of output.log)."""
        for cid, t in list(self._tracked.items()):
            ended = t.ended  # read before the size: an ended container's output is final
            size = logical_size(t.cdir)
            t.offset = min(t.offset, size)  # truncated under us: follow the file
            if size - t.offset > MAX_BACKLOG_BYTES:
                t.offset = size - MAX_BACKLOG_BYTES
            while t.offset < size:
                got = read_range(t.cdir, t.offset, min(CHUNK_BYTES, size - t.offset))
                if not got.data:
                    break
                await client.publish(log_topic(t.job_id, cid), OFFSET.pack(got.start) + got.data, qos=0)
                self.published_messages += 1
                t.offset = got.start + len(got.data)
            if ended:
                del self._tracked[cid]

    # ------------------------------------------------------------------ internals

    def _on_change(self, rec: ContainerRecord) -> None:
        t = self._tracked.get(rec.container_id)
        if t is None:
            if rec.terminal and rec.pid == 0:
                # Never ran (failed to start): its one diagnostic line is in ReadLog and the status.
                return
            t = self._tracked[rec.container_id] = _Tracked(
                rec.job_id, self.supervisor.container_dir(rec.container_id))
        t.ended = rec.terminal

    def _prune_ended(self) -> None:
        for cid in [c for c, t in self._tracked.items() if t.ended]:
            del self._tracked[cid]

    async def _wait_change(self, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass
        self._changed.clear()
