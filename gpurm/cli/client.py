"""The CLI's connection to the RM: address resolution, identity, and one-line errors instead of tracebacks.

Identity: the OS user, sent as request metadata. Where the cluster uses mTLS (GPURM_TLS_CA, GPURM_TLS_CERT and
GPURM_TLS_KEY name the CA, the user's certificate and its key), the RM takes the user from the certificate's CN
instead and ignores the metadata.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from gpurm.proto import gpurm_pb2_grpc as pbg
from gpurm.queues.fields import ConfigError
from gpurm.rm import tls

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
        try:
            self.tls = tls.tls_from_env()
        except ConfigError as exc:
            raise CliError("; ".join(exc.problems)) from None
        self.channel = tls.channel(address, self.tls)
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
        if code is grpc.StatusCode.UNAVAILABLE and (details or "").startswith("the RM's store"):
            return CliError(f"the RM is up but refuses changes: {details}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            why = (details or "").strip() or code.name
            if self.tls is not None:
                host = self.address.rsplit(":", 1)[0]
                return CliError(f"cannot reach the RM at {self.address} over mTLS ({why}); is it running, does its "
                                f"certificate name {host} and come from the CA in {self.tls.ca}, and is "
                                f"{self.tls.cert} signed by the RM's CA?")
            return CliError(f"cannot reach the RM at {self.address} ({why}); is it running? Start one with "
                            "`gpurm dev-cluster`, or point --rm / GPURM_RM at it (an RM with mTLS needs "
                            "GPURM_TLS_CA, GPURM_TLS_CERT and GPURM_TLS_KEY)")
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return CliError(f"permission denied: {details}")
        return CliError(details or (code.name if code else "RM call failed"))

    def close(self) -> None:
        self.channel.close()
