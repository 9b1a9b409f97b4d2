"""Which of several RMs on one PostgreSQL leads: a lease row with an epoch, and fenced writes.

One row (`rm_leader`, id 1) names the leader, the address it serves on (and its web UI's URL, once that is up), its
epoch and until when its lease runs.
Every time is the database's own (`now()`), so the RMs' clocks need not agree. A candidate takes the lease when
it is free or has run out, and the epoch goes up by one at every takeover; the leader renews it every third of
its length. A leader that has not renewed for a lease length minus a margin, counted on its own monotonic clock
from before the last renewal was sent, steps down: by then a standby may hold the lease.

Fencing: every write the leader makes checks, in its own transaction, that the row still carries its epoch
(`FOR SHARE`: a takeover's UPDATE waits for that write to end, or the write sees the new epoch). A deposed
leader's write is refused, never committed (rm/storage/postgres.py calls `fence`). Nothing the RM does takes effect
before its write is committed (docs/ARCHITECTURE.md), so a refused write changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS rm_leader (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    address TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    since TIMESTAMPTZ NOT NULL,
    expires TIMESTAMPTZ NOT NULL);
INSERT INTO rm_leader VALUES (1, '', '', 0, now(), now()) ON CONFLICT (id) DO NOTHING;
ALTER TABLE rm_leader ADD COLUMN IF NOT EXISTS http_url TEXT NOT NULL DEFAULT '';
"""
TAKE = """
UPDATE rm_leader SET holder = %(holder)s, address = %(address)s, http_url = '', epoch = epoch + 1, since = now(),
       expires = now() + make_interval(secs => %(ttl)s)
 WHERE id = 1 AND (holder = '' OR expires < now())
RETURNING epoch"""
RENEW = """
UPDATE rm_leader SET expires = now() + make_interval(secs => %(ttl)s)
 WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s
RETURNING epoch"""
RELEASE = """
UPDATE rm_leader SET holder = '', expires = now() WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s"""
SET_HTTP = """
UPDATE rm_leader SET http_url = %(url)s WHERE id = 1 AND holder = %(holder)s AND epoch = %(epoch)s"""
READ = "SELECT holder, address, epoch, since, expires, now(), http_url FROM rm_leader WHERE id = 1"
FENCE = "SELECT holder, epoch FROM rm_leader WHERE id = 1 FOR SHARE"

STEP_DOWN_MARGIN = 0.2     # of the lease: a leader steps down this much before its lease could run out
TRY_EVERY_S = 1.0          # seconds between a standby's tries to take the lease (at most; a third of it if less)


def standby_try_every_s(ttl_s: float) -> float:
    return min(TRY_EVERY_S, ttl_s / 3)


def takeover_within_s(ttl_s: float) -> float:
    """The longest a leader that stops (killed, paused, cut off) leaves the set without one: its lease runs out at
    most `ttl` after its last renewal, and a standby tries to take it every `standby_try_every_s`."""
    return ttl_s + standby_try_every_s(ttl_s)


class Fenced(Exception):
    """This RM's epoch is no longer the leader's: its write is refused."""


@dataclass(frozen=True)
class LeaderInfo:
    """What the lease row says (`gpurm admin ha status`)."""

    holder: str
    address: str
    epoch: int
    since: datetime | None
    expires: datetime | None
    db_now: datetime | None
    http_url: str = ""            # the leader's web UI and REST API ("" until it serves them, or without HTTP)

    @property
    def held(self) -> bool:
        return bool(self.holder) and self.expires is not None and self.db_now is not None \
            and self.expires >= self.db_now


@dataclass
class Term:
    """This RM's hold on the lease, timed on its own monotonic clock (pure: `now` is passed in)."""

    ttl_s: float
    epoch: int = 0
    renewed_at: float = 0.0      # when the last successful renewal (or the take) was *sent*

    @property
    def leading(self) -> bool:
        return self.epoch > 0

    def renew_due(self, now: float) -> bool:
        return self.leading and now - self.renewed_at >= self.ttl_s / 3

    def must_step_down(self, now: float) -> bool:
        """The lease may have run out by now (renewals failed): stop serving before a standby takes over."""
        return self.leading and now - self.renewed_at >= self.ttl_s * (1 - STEP_DOWN_MARGIN)

    def step_down_in(self, now: float) -> float:
        """Seconds until `must_step_down` (0 when it must now): a renewal is never waited on past it."""
        return max(0.0, self.renewed_at + self.ttl_s * (1 - STEP_DOWN_MARGIN) - now)

    def took(self, epoch: int, sent_at: float) -> None:
        self.epoch = epoch
        self.renewed_at = sent_at

    def renewed(self, sent_at: float) -> None:
        self.renewed_at = sent_at

    def lost(self) -> None:
        self.epoch = 0


@dataclass
class Lease:
    """The lease row, through one autocommit psycopg connection (sync: called from a thread, see rm/server/standby.py).
    `holder` is unique per RM process, so an RM that restarts never mistakes an old term for its own."""

    conn: Any                     # psycopg.Connection, autocommit
    address: str
    ttl_s: float
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)

    def ensure_schema(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(SCHEMA)

    def take(self) -> int:
        """The new epoch if this RM now leads, else 0."""
        row = self.conn.execute(TAKE, {"holder": self.holder, "address": self.address, "ttl": self.ttl_s}).fetchone()
        if row:
            log.info("took the lead: epoch %d", row[0])
        return int(row[0]) if row else 0

    def renew(self, epoch: int) -> bool:
        row = self.conn.execute(RENEW, {"holder": self.holder, "epoch": epoch, "ttl": self.ttl_s}).fetchone()
        return row is not None

    def release(self, epoch: int) -> None:
        """Give the lease up now (a clean stop): a standby takes over at its next try, not at the lease's end."""
        self.conn.execute(RELEASE, {"holder": self.holder, "epoch": epoch})

    def set_http_url(self, epoch: int, url: str) -> None:
        """Name this leader's web UI in the row, for standbys to send browsers and scripts to."""
        self.conn.execute(SET_HTTP, {"holder": self.holder, "epoch": epoch, "url": url})

    def read(self) -> LeaderInfo:
        row = self.conn.execute(READ).fetchone()
        if row is None:
            return LeaderInfo("", "", 0, None, None, None)
        return LeaderInfo(str(row[0]), str(row[1]), int(row[2]), row[3], row[4], row[5], str(row[6] or ""))


def fence(cur: Any, holder: str, epoch: int) -> None:
    """Inside a write transaction: refuse it unless this RM's epoch still leads (raises Fenced)."""
    row = cur.execute(FENCE).fetchone()
    if row is None or row[0] != holder or int(row[1]) != epoch:
        raise Fenced(f"this RM (epoch {epoch}) no longer leads: epoch {row[1] if row else '?'} does; "
                     "its write is refused")
