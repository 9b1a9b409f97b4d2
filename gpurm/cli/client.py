"""The CLI's connection to the RM: address resolution, identity, and one-line errors instead of tracebacks.

Identity: the OS user, sent as request metadata. Where the cluster uses mTLS (GPURM_TLS_CA, GPURM_TLS_CERT and
GPURM_TLS_KEY name the CA, the user's certificate and its key), the RM takes the user from the certificate's CN
instead and ignores the metadata.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from gpurm.cli.basics import CliError
from gpurm.common import tls
from gpurm.common.callers import USER_KEY
from gpurm.common.fields import ConfigError, format_duration, parse_duration
from gpurm.common.retry import CLI_POLICY, RECONNECT_OPTIONS, Outage, RetryPolicy, answered
from gpurm.common.rmlist import Channels, LeaderFollower, parse_rm_list, rpc_failure
from gpurm.proto import gpurm_pb2_grpc as pbg

DEFAULT_RM = "127.0.0.1:7070"
RETRY_ENV = "GPURM_RETRY_FOR"
EXIT_UNREACHABLE = 3      # the RM could not be reached (after retrying for --retry-for)
EXIT_NOT_FOUND = 4        # the job, queue or node named does not exist
EXIT_DENIED = 5           # the RM refused who asks (not their job, not an admin, no certificate it accepts)
T = TypeVar("T")
# Replies are pages (ListNodes, ListJobs: at most 5,000 rows, a few MB); room above gRPC's 4 MB default for a
# full page of big nodes, and for GetLogs' largest chunk.
MAX_RECEIVE = 64 << 20
MAX_PAGE = 5000           # the most rows the RM puts in a list page (rm/server/paging.py)
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", MAX_RECEIVE),)


def rm_address(flag: str | None) -> str:
    """The RM list as given (--rm, else $GPURM_RM, else the default): HOST:PORT[,HOST:PORT...]."""
    return flag or os.environ.get("GPURM_RM") or DEFAULT_RM


def rm_addresses(flag: str | None) -> tuple[str, ...]:
    """The RMs to try, in order (an active/standby pair: the client follows the leader). CliError (exit 2) naming
    --rm or GPURM_RM when the list is not HOST:PORT[,HOST:PORT...]."""
    try:
        return parse_rm_list(rm_address(flag))
    except ValueError as exc:
        what = "--rm" if flag else "GPURM_RM" if os.environ.get("GPURM_RM") else "the default RM address"
        raise CliError(f"{what}: {exc}") from None


def retry_window(flag: str | None) -> float:
    """--retry-for (else $GPURM_RETRY_FOR, else 60s): how long a command rides out an unreachable RM; 0 = not."""
    text = flag if flag is not None else os.environ.get(RETRY_ENV)
    if text is None or text == "":
        return CLI_POLICY.give_up_s
    try:
        return parse_duration(text)
    except ValueError as exc:
        what = "--retry-for" if flag is not None else RETRY_ENV
        raise CliError(f"{what}: {exc}") from None


def connect(args: argparse.Namespace) -> RM:
    """The RM a command's --rm / --retry-for (or their environment variables) name."""
    return RM(rm_addresses(getattr(args, "rm", None)), retry_for=retry_window(getattr(args, "retry_for", None)))


def current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid())


class RM:
    """Stubs for the RM's services, calls made with the user's identity and turned into CliErrors.

    Every call rides out an RM restart or failover: while the RM is unreachable (UNAVAILABLE, DEADLINE_EXCEEDED)
    it is tried again with capped, jittered exponential back-off (`gpurm.common.retry`) for up to `retry_for`
    seconds from the first failure, saying so once on stderr; then the command fails with one line and exit 3.
    Every Client / Admin call is safe to repeat: reads, idempotent writes (kill, scale, drain, refresh-queues),
    and submit, which the RM deduplicates by its submit_id.

    Several RMs (an active/standby pair): a call the RM could not answer as leader (unreachable, or a standby's
    refusal) goes at once to the leader the standby named, when it is one of the list, else to the next RM
    (`gpurm.common.rmlist`); the back-off sleeps only after every RM of the list failed once, and `retry_for` bounds the
    whole outage as before (0: each RM is tried once)."""

    def __init__(self, address: str | Sequence[str], timeout: float = 15.0, retry_for: float = CLI_POLICY.give_up_s,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        try:
            addresses = parse_rm_list(address)
        except ValueError as exc:
            raise CliError(f"--rm: {exc}") from None
        self.follower = LeaderFollower(addresses)
        self.timeout = timeout
        self.policy = RetryPolicy(CLI_POLICY.base_s, CLI_POLICY.max_s, retry_for)
        self.clock = clock
        self.sleep = sleep
        self.reached = False      # an answer came from the RM (then a closed socket means it went away)
        self.tty = sys.stderr.isatty()
        try:
            self.tls = tls.tls_from_env()
        except ConfigError as exc:
            raise CliError("; ".join(exc.problems)) from None
        client_tls = self.tls
        self.channels: Channels[grpc.Channel] = Channels(
            self.follower, lambda a: tls.channel(a, client_tls, RECONNECT_OPTIONS + CHANNEL_OPTIONS))
        # Stubs that call whichever RM the follower is on at call time.
        self.client: pbg.ClientStub = self.channels.stub(pbg.ClientStub)
        self.admin: pbg.AdminStub = self.channels.stub(pbg.AdminStub)
        self.metadata = ((USER_KEY, current_user()),)

    @property
    def address(self) -> str:
        """The RM called now (the leader, once one answered)."""
        return self.follower.current

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.follower.addresses

    def call(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        outage: Outage | None = None
        while True:
            try:
                reply = method(request, metadata=self.metadata, timeout=timeout or self.timeout)
            except grpc.RpcError as exc:
                failure = rpc_failure(exc, reached=self.reached)
                if not failure.failover:
                    raise self.translate(exc, outage) from None
                failed = self.follower.current
                if not self.follower.failed(failure.why, failure.hint):
                    continue            # another RM of the list to try before backing off
                if self.policy.give_up_s <= 0:
                    raise self.translate(exc, outage) from None
                now = self.clock()
                if outage is None:
                    outage = Outage(self.policy, now)
                    what = (f"no RM answers as leader (tried {self.follower.tried()})" if self.follower.several
                            else f"RM at {failed} unreachable ({failure.why})")
                    _say(f"{what}; retrying for {format_duration(self.policy.give_up_s)} ...")
                elif self.tty:        # a terminal: the time left, rewritten in place
                    _say(f"\r\x1b[2K  still unreachable, {format_duration(outage.left(now) or 0)} left ...",
                         end="")
                delay = outage.next_delay(now)
                if delay is None:
                    if self.tty and outage.tries:
                        _say("")
                    raise self.translate(exc, outage) from None
                self.sleep(delay)
                continue
            if outage is not None:
                if self.tty and outage.tries > 1:
                    _say("")
                _say(f"RM at {self.address} answers again after {format_duration(outage.elapsed(self.clock()))}")
            self.reached = True
            self.follower.succeeded()
            return reply

    def pages(self, method: Callable[..., T], request: Any, limit: int = 0) -> Iterator[T]:
        """Each reply of a paged list RPC (ListNodes, ListJobs, ListQueues), following next_page_token until the
        last page, or until `limit` rows (0: all) came, counted by `rows_of`. The next page is asked for as soon
        as a page arrives, while the caller prints this one: the RM's work and the printing overlap."""
        seen = 0
        with ThreadPoolExecutor(1, thread_name_prefix="gpurm-pages") as pool:
            pending = pool.submit(self.call, method, request)
            while True:
                reply = pending.result()
                seen += rows_of(reply)
                token = getattr(reply, "next_page_token", "")
                last = not token or (limit and seen >= limit)
                if not last:
                    following = type(request)()
                    following.CopyFrom(request)
                    following.page_token = token
                    pending = pool.submit(self.call, method, following)
                yield reply
                if last:
                    return

    def translate(self, exc: grpc.RpcError, outage: Outage | None = None) -> CliError:
        code, details = _status(exc)
        if code is grpc.StatusCode.UNAVAILABLE and (details or "").startswith("the RM's store"):
            return CliError(f"the RM is up but refuses changes: {details}")
        said = answered(exc.trailing_metadata()) if hasattr(exc, "trailing_metadata") else False
        failure = rpc_failure(exc, reached=self.reached)
        if failure.failover and (self.follower.several or failure.standby):
            tried = f" after retrying for {format_duration(outage.elapsed(self.clock()))}" if outage else ""
            mtls = (f"; over mTLS, each RM's certificate must name its host and come from the CA in {self.tls.ca}"
                    if self.tls is not None else "")
            return CliError(f"no RM answered as leader{tried}: tried {self.follower.tried()}; are they running, "
                            f"and is one of them the leader? Check --rm / GPURM_RM (HOST:PORT,HOST:PORT...), or "
                            f"wait and retry with a longer --retry-for{mtls}", code=EXIT_UNREACHABLE)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not said:
            why = " ".join((details or "").split()) or code.name
            tried = f" after retrying for {format_duration(outage.elapsed(self.clock()))}" if outage else ""
            if self.tls is not None:
                host = self.address.rsplit(":", 1)[0]
                return CliError(f"cannot reach the RM at {self.address} over mTLS{tried} ({why}); is it running, "
                                f"does its certificate name {host} and come from the CA in {self.tls.ca}, and is "
                                f"{self.tls.cert} signed by the RM's CA?", code=EXIT_UNREACHABLE)
            return CliError(f"cannot reach the RM at {self.address}{tried} ({why}); is it running? Start one with "
                            "`gpurm dev-cluster`, or point --rm / GPURM_RM at it (an RM with mTLS needs "
                            "GPURM_TLS_CA, GPURM_TLS_CERT and GPURM_TLS_KEY)", code=EXIT_UNREACHABLE)
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return CliError(f"permission denied: {details}", code=EXIT_DENIED)
        if code is grpc.StatusCode.NOT_FOUND:
            return CliError(details or "not found", code=EXIT_NOT_FOUND)
        return CliError(details or (code.name if code else "RM call failed"))

    def close(self) -> None:
        for channel in self.channels.channels.values():
            channel.close()


def page_size_arg(args: argparse.Namespace, default: int) -> int:
    """--page-size: rows per list request (the RM caps a page at MAX_PAGE)."""
    size = int(getattr(args, "page_size", default))
    if not 1 <= size <= MAX_PAGE:
        raise CliError(f"--page-size: must be from 1 to {MAX_PAGE}, got {size}")
    return size


def rows_of(reply: Any) -> int:
    """The rows a list reply holds: its one repeated list field (nodes, jobs, queues), or the items of a ListJobs
    page the RM wrote as JSON (json_count)."""
    if getattr(reply, "json_count", 0):
        return int(reply.json_count)
    for name in ("nodes", "jobs", "queues"):
        if hasattr(reply, name):
            return len(getattr(reply, name))
    return 0


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return code, details or ""


def _say(line: str, end: str = "\n") -> None:
    sys.stderr.write(line + end)
    sys.stderr.flush()
