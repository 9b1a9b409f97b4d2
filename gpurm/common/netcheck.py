"""Checking a listen address before gRPC binds it, so a busy port is one clear line, not gRPC core's log."""

from __future__ import annotations

import errno
import socket

from gpurm.common.fields import parse_address


def listen_problem(address: str) -> str:
    """Why `address` (HOST:PORT) cannot be listened on now, or "" if it can (port 0 always can)."""
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        return str(exc)
    if port == 0:
        return ""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "address already in use (another process listens there: pick another port, or stop it)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine"
            if exc.errno == errno.EACCES:
                return "permission denied (ports below 1024 need root)"
            return exc.strerror or str(exc)
    return ""
