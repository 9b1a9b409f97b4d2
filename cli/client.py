"""The CLI's connection to the RM: address resolution, identity, and one-line errors instead of tracebacks."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from gpurm.proto import gpurm_pb2_grpc as pbg

DEFAULT_RM = "127.0.0.1:7070"
T = TypeVar("T")


class CliError(Exception):
    """Ends the command with one line on stderr and an exit code (2 = bad input or unusable target)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def rm_address(flag: str | None) -> str:
    return flag or os.environ.get("GPURM_RM") or DEFAULT_RM


def current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid())


class RM:
    """Stubs for the RM's services, calls made with the user's identity and turned into CliErrors."""

    def __init__(self, address: str, timeout: float = 15.0) -> None:
        self.address = address
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address)
        self.client = pbg.ClientStub(self.channel)
        self.admin = pbg.AdminStub(self.channel)
        self.metadata = (("x-gpurm-user", current_user()),)

    def call(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return method(request, metadata=self.metadata, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise self.translate(exc) from None

    def translate(self, exc: grpc.RpcError) -> CliError:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return CliError(f"cannot reach the RM at {self.address} ({(details or '').strip() or code.name}); "
                            "is it running? Start one with `gpurm dev-cluster`, or point --rm / GPURM_RM at it")
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return CliError(f"permission denied: {details}")
        return CliError(details or (code.name if code else "RM call failed"))

    def close(self) -> None:
        self.channel.close()
