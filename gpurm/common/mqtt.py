"""MQTT plumbing shared by the RM, the agents, AMs and the CLI: URL parsing, topic names, credentials and clients
with them. The RM is the only publisher (role gpurm-rm, its publisher is gpurm/rm/server/publisher.py); everyone
else reads (gpurm-reader), with credentials the RM hands out over gRPC (gpurm/rm/security/brokerauth.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiomqtt

TOPIC_JOB = "gpurm/jobs/{job_id}"                     # retained JSON: the job's latest state
TOPIC_VIEW = "gpurm/cluster/view"                     # retained ClusterView snapshot (protobuf)
TOPIC_VIEW_DELTA = "gpurm/cluster/delta"              # ClusterView holding only changed nodes (protobuf)
TOPIC_TELEMETRY = "gpurm/telemetry/{node_id}"         # retained JSON GPU telemetry (from the node's heartbeat)


# An AM's broker URL when its node's agent.yaml sets mqtt.advertise (the RM's view of the broker does not work there).
MQTT_URL_ENV = "GPURM_MQTT_URL"


@dataclass(frozen=True)
class Credentials:
    """A login on the broker (one of brokerauth's two roles)."""
    username: str
    password: str = field(repr=False)


def parse_mqtt_url(url: str) -> tuple[str, int]:
    rest = url.removeprefix("mqtt://").rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected mqtt://HOST:PORT, got {url!r}")
    return host, int(port)


def client(url: str, credentials: Credentials | None, identifier: str = "", inflight: int = 0) -> aiomqtt.Client:
    """A client for the broker at `url`; without credentials the broker refuses it (no anonymous clients).
    `inflight`: QoS 1 publishes awaiting their PUBACK at once (0: paho's 20), and aiomqtt warns only past twice
    that many waiting."""
    host, port = parse_mqtt_url(url)
    # amqtt speaks MQTT 3.1.1 only; mosquitto speaks both.
    c = aiomqtt.Client(host, port, identifier=identifier or None, protocol=aiomqtt.ProtocolVersion.V311,
                       timeout=5, username=credentials.username if credentials else None,
                       password=credentials.password if credentials else None,
                       max_inflight_messages=inflight or None)
    if inflight:
        c.pending_calls_threshold = 2 * inflight
    return c
