"""Riding out an RM restart or failover: the one retry rule the CLI, the AM and the agent share.

A call that fails because the RM is away (UNAVAILABLE: connection refused, the RM restarting; DEADLINE_EXCEEDED)
is tried again after a capped exponential back-off with jitter (base, 2·base, 4·base ... capped at `max_s`, each
drawn from [d/2, d], so that many clients that lost the RM together do not come back in lock-step), until
`give_up_s` after the first failure of the outage (0: never give up). Pure: the caller passes `now` and sleeps.

Only calls that are safe to repeat are retried: reads, and writes that are idempotent (kill, scale, drain,
refresh-queues) or deduplicated by the RM (a submit carries a `submit_id`; an AM's allocate its `response_id`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# gRPC status names (grpc.StatusCode.X.name) that mean "the RM is away", not "the RM said no".
TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
# An RM that is up but cannot write its store answers UNAVAILABLE with this prefix: retrying does not help.
STORE_REFUSAL = "the RM's store"
# Trailing metadata the RM puts on every refusal it makes itself (rm/server/service.py `rpc`), so that its own
# UNAVAILABLE (a node's agent unreachable for a log read, the store refusing writes) is not taken for the RM being away.
ANSWERED_KEY = "x-gpurm-answered"
ANSWERED = ((ANSWERED_KEY, "1"),)

# gRPC channel options for a channel to the RM: gRPC's own reconnect back-off grows to 120 s, so a client that
# retried through a long outage could wait minutes more after the RM is back; cap it at our back-off's.
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                     ("grpc.max_reconnect_backoff_ms", 5000))


# What a failed connection says when the RM is there but the channel's security does not match its own (a
# plaintext client to an mTLS RM: the RM closes the socket; a certificate it does not trust: a failed handshake).
# Retrying cannot fix these; after an RM restart the new RM accepts the client as the old one did.
TLS_MISMATCH = ("handshake", "ssl", "certificate")
PLAIN_TO_TLS = "socket closed"


def transient(code_name: str, details: str = "", answered: bool = False, reached: bool = True) -> bool:
    """Whether a failed call's status means the RM is unreachable (worth retrying), not a refusal it made nor a
    misconfigured client. `reached`: whether this client has had an answer from the RM before (then a closed
    socket is the RM going away, not the RM refusing a plaintext connection)."""
    if code_name not in TRANSIENT or answered:
        return False
    text = (details or "").lower()
    if text.startswith(STORE_REFUSAL.lower()) or any(word in text for word in TLS_MISMATCH):
        return False
    return reached or PLAIN_TO_TLS not in text


def answered(trailing_metadata: Iterable[Any] | None) -> bool:
    """Whether a failed call's trailing metadata carries the RM's own mark (see ANSWERED_KEY)."""
    try:
        return any(key == ANSWERED_KEY for key, _ in trailing_metadata or ())
    except (TypeError, ValueError):      # not pairs: not the RM's mark
        return False


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 0.2        # the first back-off
    max_s: float = 5.0         # the longest back-off
    give_up_s: float = 60.0    # give up this long after the outage began; 0 = never

    def problems(self, prefix: str = "") -> list[str]:
        out = []
        if self.base_s <= 0:
            out.append(f"{prefix}base: must be above 0, got {self.base_s:g}")
        if self.max_s < self.base_s:
            out.append(f"{prefix}max: must be at least base ({self.base_s:g}s), got {self.max_s:g}")
        if self.give_up_s < 0:
            out.append(f"{prefix}give_up_after: must be 0 (never) or more, got {self.give_up_s:g}")
        return out


# The defaults: a person at a terminal waits a minute; an AM holds its job's GPUs through ten minutes of outage
# (the RM's own liveness clocks restart with it); an agent never gives up (its containers keep running, and
# exiting would only stop it from reporting them once the RM is back).
CLI_POLICY = RetryPolicy(base_s=0.25, max_s=5.0, give_up_s=60.0)
AM_POLICY = RetryPolicy(base_s=0.2, max_s=5.0, give_up_s=600.0)
AGENT_POLICY = RetryPolicy(base_s=0.2, max_s=5.0, give_up_s=0.0)


class Backoff:
    """Delays base, 2·base, 4·base ... capped at max_s, each drawn from [d/2, d]."""

    def __init__(self, base_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._rng = rng or random.Random()
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.max_s, self.base_s * (2 ** min(self._attempt, 30)))
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0


class Outage:
    """One stretch of failed calls to the RM: how long to sleep before the next try, and when to give up."""

    def __init__(self, policy: RetryPolicy, started: float, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.started = started
        self.tries = 0
        self._backoff = Backoff(policy.base_s, policy.max_s, rng)

    @property
    def deadline(self) -> float | None:
        return self.started + self.policy.give_up_s if self.policy.give_up_s > 0 else None

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.started)

    def left(self, now: float) -> float | None:
        """Seconds until it gives up (None: never)."""
        deadline = self.deadline
        return None if deadline is None else max(0.0, deadline - now)

    def next_delay(self, now: float) -> float | None:
        """The sleep before the next try, never past the deadline; None once the deadline has passed."""
        left = self.left(now)
        if left is not None and left <= 0:
            return None
        self.tries += 1
        delay = self._backoff.next()
        return delay if left is None else min(delay, left)
