"""Bounds on what a gRPC client can make a server hold: message size, concurrent calls, streams per connection,
handshake and idle time. The RM and every agent build their servers here (rm.yaml / agent.yaml `limits:`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gpurm.common.fields import Reader

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    max_message_bytes: int = 4 * MIB       # a request or reply above this is refused (RESOURCE_EXHAUSTED)
    max_concurrent_rpcs: int = 50000       # calls in flight (an agent's heartbeat stream is one); more are refused
    max_streams_per_connection: int = 128
    handshake_timeout_s: float = 10.0      # a connection that does not finish its TLS/HTTP2 set-up is closed
    idle_timeout_s: float = 300.0          # a connection with no call for this long is closed
    keepalive_s: float = 60.0              # ping an idle peer; a dead one is dropped after keepalive_timeout
    keepalive_timeout_s: float = 20.0

    def options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", round(self.idle_timeout_s * 1000)),
            ("grpc.keepalive_time_ms", round(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.keepalive_timeout_s * 1000)),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10000),
            # No SO_REUSEPORT: a second server on the same port must fail, not silently share it.
            ("grpc.so_reuseport", 0),
        ]


def read_limits(r: Reader, key: str = "limits") -> ServerLimits:
    """The `limits:` section of rm.yaml or agent.yaml (every key optional)."""
    d = ServerLimits()
    s = r.section(key)
    out = ServerLimits(
        max_message_bytes=s.integer("max_message_bytes", d.max_message_bytes, minimum=64 * 1024),
        max_concurrent_rpcs=s.integer("max_concurrent_rpcs", d.max_concurrent_rpcs, minimum=1),
        max_streams_per_connection=s.integer("max_streams_per_connection", d.max_streams_per_connection, minimum=1),
        handshake_timeout_s=s.duration("handshake_timeout", d.handshake_timeout_s),
        idle_timeout_s=s.duration("idle_timeout", d.idle_timeout_s),
        keepalive_s=s.duration("keepalive", d.keepalive_s),
        keepalive_timeout_s=s.duration("keepalive_timeout", d.keepalive_timeout_s),
    )
    for name in ("handshake_timeout", "idle_timeout", "keepalive", "keepalive_timeout"):
        if getattr(out, name + "_s") <= 0:
            s.error(name, "must be above 0")
    s.reject_unknown()
    return out


def make_server(limits: ServerLimits, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    return grpc.aio.server(options=limits.options(), interceptors=list(interceptors),
                           maximum_concurrent_rpcs=limits.max_concurrent_rpcs)
