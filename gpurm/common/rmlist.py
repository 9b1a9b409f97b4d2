"""Several RMs, one leader: the address list every client (CLI, agent, AM) takes, and the rule that follows the
leader across them. Pure: no sockets, no sleeps; the CLI (sync gRPC) and the agent / AM (grpc.aio) each wrap it in
a few lines of their own.

An RM pair (active/standby, issue 19) is named as a list: `--rm a:7070,b:7070`, `GPURM_RM=a:7070,b:7070`, agent.yaml
`rm: [a:7070, b:7070]`. A standby answers every call with UNAVAILABLE, details starting "standby", and, when it
knows the leader, trailing metadata `x-gpurm-leader: HOST:PORT`. A dead RM answers UNAVAILABLE with no hint.

On such a failure the client moves on: to the hinted leader when the hint names an address of its own list (a hint
outside the list is ignored: a client is never redirected to an address it was not configured with), else to the
next address in turn. The shared back-off (`gpurm.common.retry`) sleeps only after a whole round of the list failed,
so a dead first address costs one refused connection, not a back-off; the give-up budgets stay as they were.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpurm.common.fields import parse_address
from gpurm.common.retry import answered, transient

LEADER_KEY = "x-gpurm-leader"   # trailing metadata of a standby's refusal: the leader's HOST:PORT
STANDBY_PREFIX = "standby"      # a standby's refusal details start with this
MAX_RMS = 16                    # the most addresses a list may hold
C = TypeVar("C")                # a channel: grpc.Channel or grpc.aio.Channel


def parse_rm_list(value: str | Sequence[Any]) -> tuple[str, ...]:
    """`a:7070,b:7070` (or a list of such items) → the addresses, in order. Raises ValueError saying why (an empty
    item, an address without a valid port, a duplicate, more than MAX_RMS); the caller names the flag or field."""
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, Sequence):
        items = [part for item in value for part in (item.split(",") if isinstance(item, str) else [item])]
    else:
        raise ValueError(f"expected HOST:PORT or a list of them, got {type(value).__name__}")
    out: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for n, item in enumerate(items, 1):
        if not isinstance(item, str):
            raise ValueError(f"item {n}: expected HOST:PORT, got {type(item).__name__}")
        text = item.strip()
        if not text:
            raise ValueError(f"item {n} is empty (write HOST:PORT[,HOST:PORT...] with no empty items)")
        try:
            host, port = parse_address(text)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if not text.rpartition(":")[0].strip("[]"):
            raise ValueError(f"{text!r}: a host is required (HOST:PORT)")
        if port == 0:
            raise ValueError(f"{text!r}: port must be from 1 to 65535")
        key = (host.lower(), port)
        if key in seen:
            before = f" (as {seen[key]!r} before)" if seen[key] != text else ""
            raise ValueError(f"{text!r} is listed twice{before}")
        seen[key] = text
        out.append(text)
    if len(out) > MAX_RMS:
        raise ValueError(f"at most {MAX_RMS} RM addresses, got {len(out)}")
    return tuple(out)


def leader_hint(trailing_metadata: Iterable[Any] | None) -> str:
    """The leader a standby named in its refusal's trailing metadata ('' when none)."""
    try:
        for key, value in trailing_metadata or ():
            if key == LEADER_KEY:
                return (value.decode() if isinstance(value, bytes) else str(value)).strip()
    except (TypeError, ValueError, UnicodeDecodeError):
        pass
    return ""


@dataclass(frozen=True)
class Failure:
    """What a failed call to one RM says, for the follower: whether to move on, and where."""

    failover: bool       # the RM is away or is not the leader: try another (the call is safe to repeat)
    hint: str            # the leader a standby named ('' when none)
    why: str             # one line for people: "connection refused", "standby, leader b:7070"
    standby: bool = False  # a standby's refusal (the RM is up, and not the leader)


def classify(code_name: str, details: str, trailing_metadata: Iterable[Any] | None, reached: bool = True) -> Failure:
    """A failed call's status → Failure. A standby's refusal (a leader hint, or details starting "standby") moves
    on even though the RM answered it; otherwise the shared rule (`retry.transient`) decides."""
    try:
        pairs = list(trailing_metadata or ())
    except TypeError:
        pairs = []
    hint = leader_hint(pairs)
    text = (details or "").strip()
    standby = code_name == "UNAVAILABLE" and (bool(hint) or text.lower().startswith(STANDBY_PREFIX))
    if standby:
        return Failure(True, hint, f"standby, leader {hint}" if hint else "standby, leader not known yet", True)
    ok = transient(code_name, details, answered(pairs), reached=reached)
    return Failure(ok, "", short_reason(text) or code_name or "?")


def short_reason(details: str) -> str:
    """gRPC's connection failure in a few words: 'failed to connect to all addresses; last error: UNKNOWN:
    ipv4:10.0.0.2:7070: Failed to connect to remote host: Connection refused' → 'Failed to connect to remote host:
    Connection refused' (the address is said beside it); else the first line, at most 120 characters."""
    first = details.strip().split("\n")[0]
    _, sep, rest = first.partition("last error: ")
    if sep:
        first = re.sub(r"^(ipv4|ipv6|unix|dns):\S+?: ", "", re.sub(r"^[A-Z_]+: ", "", rest)) or first
    return first[:120]


def rpc_failure(exc: BaseException, reached: bool = True) -> Failure:
    """classify() for a grpc.RpcError (sync or aio); anything else is not a failover."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    name = code.name if code is not None and hasattr(code, "name") else ""
    return classify(name, details or "", trailing, reached=reached)


@dataclass
class LeaderFollower:
    """Which RM of the list to call now. `failed()` after a call failed over, `succeeded()` after an answer.

    A round tries every address of the list once (a hint is followed only to an address not yet tried in the
    round, so a stale hint cannot keep an address from being tried); only a round that failed whole asks the
    caller to back off, and the caller's Outage (its give-up budget) counts rounds, not addresses."""

    addresses: tuple[str, ...]
    index: int = 0
    failed_now: set[int] = field(default_factory=set)         # positions that failed in this round
    last: dict[str, str] = field(default_factory=dict)       # address -> why its last try failed (this outage)

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("no RM address")

    @property
    def current(self) -> str:
        return self.addresses[self.index]

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1

    def failed(self, why: str, hint: str = "") -> bool:
        """The current RM failed (why) and may have named the leader (hint). Moves to the hinted leader when it is
        one of the list and not the RM that just failed, else to the next address. True: a whole round failed,
        back off before the next try."""
        self.last[self.current] = why
        self.failed_now.add(self.index)
        n = len(self.addresses)
        target = self._position(hint) if hint else None
        if len(self.failed_now) >= n:          # a whole round failed: back off, then begin the next one
            self.failed_now.clear()
            self.index = target if target is not None and target != self.index else (self.index + 1) % n
            return True
        if target is not None and target not in self.failed_now:
            self.index = target
        else:
            self.index = next(i for i in ((self.index + k) % n for k in range(1, n)) if i not in self.failed_now)
        return False

    def succeeded(self) -> None:
        self.failed_now.clear()
        self.last.clear()

    def tried(self) -> str:
        """'a:7070 (connection refused), b:7070 (standby, leader not known yet)': what this outage saw."""
        return ", ".join(f"{a} ({self.last[a]})" if a in self.last else a for a in self.addresses)

    def _position(self, address: str) -> int | None:
        key = _key(address)
        for i, known in enumerate(self.addresses):
            if key is not None and _key(known) == key:
                return i
        return None


def _key(address: str) -> tuple[str, int] | None:
    """An address as compared: the host without case, the port."""
    try:
        host, port = parse_address(address)
    except ValueError:
        return None
    return host.lower(), port


class Channels(Generic[C]):
    """One channel per RM address, made when first needed, and stubs that always call the follower's current RM:
    `stub(pbg.ClientStub).ListJobs(...)` resolves the address at call time, so a stub handed out once (to a view
    follower, to commands) follows the leader."""

    def __init__(self, follower: LeaderFollower, make: Callable[[str], C]) -> None:
        self.follower = follower
        self._make = make
        self.channels: dict[str, C] = {}
        self._stubs: dict[tuple[str, Any], Any] = {}

    def channel(self, address: str | None = None) -> C:
        address = address or self.follower.current
        ch = self.channels.get(address)
        if ch is None:
            ch = self.channels[address] = self._make(address)
        return ch

    def stub_for(self, factory: Callable[[C], Any], address: str | None = None) -> Any:
        address = address or self.follower.current
        key = (address, factory)
        stub = self._stubs.get(key)
        if stub is None:
            stub = self._stubs[key] = factory(self.channel(address))
        return stub

    def stub(self, factory: Callable[[C], Any]) -> Any:
        return _FollowingStub(self, factory)


class _FollowingStub:
    def __init__(self, channels: Channels[Any], factory: Callable[[Any], Any]) -> None:
        self._channels = channels
        self._factory = factory

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> Any:
            return getattr(self._channels.stub_for(self._factory), name)(*args, **kwargs)

        method.__name__ = name
        return method
