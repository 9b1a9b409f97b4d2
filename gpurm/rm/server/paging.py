"""Pages of the list RPCs (ListNodes, ListJobs, ListQueues) and of the REST lists: opaque page tokens, page
sizes, and the sorted key indexes that let a page cost O(page + log n) instead of O(all records).

Paging is by key set, not by offset: a token names the last key a page returned (a node id, a job's submit
sequence), so records added between two pages never shift or repeat a row. A token is the lowercase hex of
`<kind>:<key>` (UTF-8); a caller treats it as opaque. Hex, so that the REST API's document can state exactly which
tokens the RM takes (`TOKEN_PATTERNS`): any text of that form is a position in its list, and nothing else is.

The indexes follow the core's dicts (`core.jobs`, `core.cluster.nodes`) without hooks in the core: both dicts
only ever grow, and Python keeps a dict's insertion order, so what was added since the last page is the dict's
tail; `sync` reads just that tail (and checks that it starts right after the last key it saw). A dict that lost
keys, or a new dict (the shell rebuilt its core from the store), is indexed again from scratch.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from gpurm.common.model import Job, JobState
from gpurm.rm.state.messages import ErrorCode, RequestError

DEFAULT_NODES = 500        # a ListNodes without page_size
DEFAULT_JOBS = 500         # a ListJobs without page_size (and without limit)
DEFAULT_QUEUES = 1000      # a ListQueues without page_size: a whole tree, for any sane queue config
MAX_PAGE = 5000            # the most any page_size gets (a 5,000-node page is ~7 MB: under the 16 MB the CLI takes)
MAX_SCAN = 20_000          # nodes a filtered ListNodes page looks at before it answers (short) with a token

K = TypeVar("K", int, str)     # a sort key: a job's submit sequence, a node id
V = TypeVar("V")

NODES = "n"                # token kinds: a token of one list is refused by another
JOBS_UP = "j"              # jobs oldest first (gRPC ListJobs, `gpurm jobs`)
JOBS_DOWN = "jd"           # jobs newest first (REST /api/v1/jobs, the web UI)
QUEUES = "q"


def page_size(requested: int, default: int, cap: int = MAX_PAGE, field: str = "page_size") -> int:
    """The rows a page holds: `default` when none was asked for, never more than `cap`."""
    if requested < 0:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, f"{field}: must be 0 (the default, {default}) or more, "
                                                       f"got {requested}")
    return min(requested, cap) if requested else min(default, cap)


MAX_TOKEN = 2048           # characters of a page token


def _hex(text: str) -> str:
    return text.encode().hex()


# What each list's tokens look like: the kind's hex, then its key's: a node id or queue path (any text), or a job's
# submit sequence (decimal digits, whose UTF-8 bytes are 0x30-0x39). The REST document states these (openapi.py).
TOKEN_PATTERNS = {
    NODES: f"^{_hex(NODES + ':')}(?:[0-9a-f]{{2}}){{1,{MAX_TOKEN // 2 - 2}}}$",
    QUEUES: f"^{_hex(QUEUES + ':')}(?:[0-9a-f]{{2}}){{1,{MAX_TOKEN // 2 - 2}}}$",
    JOBS_UP: f"^{_hex(JOBS_UP + ':')}(?:3[0-9]){{1,18}}$",
    JOBS_DOWN: f"^{_hex(JOBS_DOWN + ':')}(?:3[0-9]){{1,18}}$",
}
_TOKEN_RE = {kind: re.compile(pattern) for kind, pattern in TOKEN_PATTERNS.items()}


def encode_token(kind: str, key: str | int) -> str:
    return _hex(f"{kind}:{key}")


def decode_token(kind: str, token: str, field: str = "page_token") -> str:
    """The key a token of this kind names (any token matching its pattern names a position in the list);
    RequestError(INVALID_ARGUMENT) naming `field` for anything else."""
    if len(token) > MAX_TOKEN or not _TOKEN_RE[kind].fullmatch(token):
        raise RequestError(ErrorCode.INVALID_ARGUMENT,
                           f"{field}: not a page token this RM returned for this list: {token[:40]!r} (pass a "
                           "reply's next_page_token unchanged, or nothing for the first page)")
    # Any bytes after the kind are a position (keys compare as text): an undecodable one stands as U+FFFD.
    return bytes.fromhex(token).decode("utf-8", "replace").partition(":")[2]


def decode_seq(kind: str, token: str, field: str = "page_token") -> int:
    return int(decode_token(kind, token, field))      # the pattern allows digits only


class GrowingIndex(Generic[K]):
    """The keys of a dict that only grows, sorted by `order(value)`: ([sort keys], [dict keys]) in step."""

    def __init__(self, order: Callable[[Any], K]) -> None:
        self.order: Callable[[Any], K] = order
        self.source: dict[str, Any] | None = None
        self.sort_keys: list[K] = []
        self.ids: list[str] = []
        self.last: str | None = None          # the source's last key when last synced

    def sync(self, source: dict[str, Any]) -> list[tuple[str, Any]] | None:
        """Index what `source` gained since the last call: its tail, checked to start right after the last key
        indexed. Returns the (key, value) pairs added, or None when it indexed `source` from scratch (another
        dict, or one that lost keys)."""
        n = len(source)
        if source is self.source and n >= len(self.ids):
            new = n - len(self.ids)
            tail = list(itertools.islice(reversed(source.items()), new + 1))    # the new pairs and the one before
            before = tail[new][0] if len(tail) > new else None
            if before == self.last:
                tail = tail[:new]
                tail.reverse()
                for k, v in tail:
                    self.add(k, v)
                if tail:
                    self.last = tail[-1][0]
                return tail
        self.source = source
        pairs = sorted(((self.order(v), k) for k, v in source.items()), key=lambda p: p[0])
        self.sort_keys = [p[0] for p in pairs]
        self.ids = [p[1] for p in pairs]
        self.last = next(reversed(source), None)
        return None

    def add(self, dict_key: str, value: Any) -> None:
        key = self.order(value)
        if not self.sort_keys or self.sort_keys[-1] < key:        # the usual case: a newer key
            self.sort_keys.append(key)
            self.ids.append(dict_key)
            return
        i = bisect.bisect_right(self.sort_keys, key)
        self.sort_keys.insert(i, key)
        self.ids.insert(i, dict_key)

    def __len__(self) -> int:
        return len(self.ids)

    def after(self, key: K | None, descending: bool = False) -> Iterator[str]:
        """Dict keys whose sort key comes strictly after `key` (None: from the start), in page order."""
        keys = self.sort_keys
        if not descending:
            start = 0 if key is None else bisect.bisect_right(keys, key)
            return iter(self.ids[i] for i in range(start, len(keys)))
        end = len(keys) if key is None else bisect.bisect_left(keys, key)
        return iter(self.ids[i] for i in range(end - 1, -1, -1))


class JobIndex:
    """Jobs by submit sequence: all of them, per user, per queue, and the unfinished ones (a filtered page scans
    only its part). A job never leaves a terminal state, so `live` holds every unfinished job plus some that
    ended since they were indexed; a scan skips those and `compact_live` drops them once they are many."""

    def __init__(self) -> None:
        self.all: GrowingIndex[int] = GrowingIndex(_seq)
        self.by_user: dict[str, GrowingIndex[int]] = {}
        self.by_queue: dict[str, GrowingIndex[int]] = {}
        self.live: GrowingIndex[int] = GrowingIndex(_seq)

    def compact_live(self, jobs: dict[str, Job]) -> None:
        keep = [i for i, job_id in enumerate(self.live.ids) if not jobs[job_id].state.terminal]
        self.live.sort_keys = [self.live.sort_keys[i] for i in keep]
        self.live.ids = [self.live.ids[i] for i in keep]

    def sync(self, jobs: dict[str, Job]) -> None:
        fresh = self.all.sync(jobs)
        if fresh is None:                       # indexed from scratch: the parts too
            self.by_user, self.by_queue = {}, {}
            self.live = GrowingIndex(_seq)
            fresh = [(job_id, jobs[job_id]) for job_id in self.all.ids]
        for job_id, job in fresh:
            self.by_user.setdefault(job.user, GrowingIndex(_seq)).add(job_id, job)
            self.by_queue.setdefault(job.queue, GrowingIndex(_seq)).add(job_id, job)
            if not job.state.terminal:
                self.live.add(job_id, job)

    def part(self, queue: str, user: str) -> GrowingIndex[int] | None:
        """The smallest index that holds every job the filters can match (None: no job can match)."""
        parts: list[GrowingIndex[int] | None] = [self.all]
        if user:
            parts.append(self.by_user.get(user))
        if queue:
            qs = [self.by_queue[q] for q in dict.fromkeys((queue, f"root.{queue}")) if q in self.by_queue]
            if len(qs) > 1:
                parts.append(self.all)
            else:
                parts.append(qs[0] if qs else None)
        if any(p is None for p in parts):
            return None
        return min((p for p in parts if p is not None), key=len)


    def count(self, queue: str, user: str) -> int | None:
        """How many jobs the user and queue filters match, when the index sizes say it (None: not without a
        scan, i.e. both filters at once)."""
        if queue and user:
            return 0 if self.part(queue, user) is None else None
        if user:
            found = self.by_user.get(user)
            return len(found) if found is not None else 0
        if queue:
            return sum(len(self.by_queue[q]) for q in dict.fromkeys((queue, f"root.{queue}")) if q in self.by_queue)
        return len(self.all)


def _seq(job: Job) -> int:
    return job.seq


def job_filter(states: Iterable[JobState], queue: str, user: str,
               name: Callable[[str], bool] | None = None) -> Callable[[Job], bool]:
    wanted = frozenset(states)

    def match(j: Job) -> bool:
        return (not wanted or j.state in wanted) and (not queue or j.queue in (queue, f"root.{queue}")) \
            and (not user or j.user == user) and (name is None or bool(name(j.spec.name)))
    return match


def job_page(index: JobIndex, jobs: dict[str, Job], states: Iterable[JobState] = (), queue: str = "",
             user: str = "", *, size: int, after: int | None = None, newest: int = 0,
             descending: bool = False, name: Callable[[str], bool] | None = None) -> tuple[list[Job], int | None]:
    """One page of matching jobs and the sequence to continue after (None: this was the last page).

    Ascending (oldest first): after the job of sequence `after`; with no `after`, from the oldest, or from the
    newest `newest` matching jobs when `newest` > 0. Descending (newest first): before `after`. A page scans only
    the jobs it skips and returns: a user or queue filter scans only that user's or queue's jobs, a filter on
    unfinished states only the unfinished jobs."""
    index.sync(jobs)
    part = index.part(queue, user)
    if part is None:
        return [], None
    states = frozenset(states)
    live = bool(states) and not any(s.terminal for s in states) and part is index.all
    if live:
        part = index.live                   # only unfinished states asked for: scan the unfinished jobs
    match = job_filter(states, queue, user, name)
    dead = 0                                # ended jobs still in `live`, skipped
    if not descending and after is None and newest > 0:
        # Find the start: the newest `newest` matching jobs, walked back from the newest.
        seen = 0
        start: int | None = None
        for job_id in part.after(None, descending=True):
            job = jobs[job_id]
            if match(job):
                seen += 1
                start = job.seq
                if seen >= newest:
                    break
            elif live and job.state.terminal:
                dead += 1
        if start is None:
            return [], None
        after = start - 1
    out: list[Job] = []
    last: int | None = None
    more = False
    for job_id in part.after(after, descending=descending):
        if len(out) >= size:
            more = True
            break
        job = jobs[job_id]
        last = job.seq
        if match(job):
            out.append(job)
        elif live and job.state.terminal:
            dead += 1
    if live and dead > len(index.live) // 4 + 64:
        index.compact_live(jobs)            # paid for by the scans that skipped them
    return out, (last if more else None)


class NodeIndex:
    """Node ids in order, following `cluster.nodes`."""

    def __init__(self) -> None:
        self.index: GrowingIndex[str] = GrowingIndex(_node_id)

    def page(self, nodes: dict[str, V], size: int, after: str | None, match: Callable[[V], bool] | None = None,
             scan: int = MAX_SCAN) -> tuple[list[V], str | None]:
        """Up to `size` nodes after `after` (that `match`, when given) and the node id to continue after (None:
        the last page). A filtered page looks at `scan` nodes at most: it may come back short, even empty, with a
        token to go on."""
        self.index.sync(nodes)
        out: list[V] = []
        last: str | None = None
        for looked, node_id in enumerate(self.index.after(after)):
            if len(out) >= size or looked >= scan:
                return out, last
            node = nodes[node_id]
            if match is None or match(node):
                out.append(node)
            last = node_id
        return out, None


def _node_id(node: Any) -> str:
    return str(node.node_id)


class ListIndexes:
    """The shell's indexes for list pages (one set per shell; each follows the core's dicts)."""

    def __init__(self) -> None:
        self.jobs = JobIndex()
        self.nodes = NodeIndex()


def fetch_all(call: Callable[[Any], Any], request: Any, field: str) -> list[Any]:
    """Every row of a paged list RPC, for a caller that needs them all at once: `call(request)` is one RPC (e.g.
    `lambda r: stub.ListNodes(r, timeout=10)`), `field` the reply's list (`nodes`, `jobs`, `queues`). Each page
    continues after the one before (key-set paging: rows added meanwhile neither repeat nor shift)."""
    out: list[Any] = []
    while True:
        reply = call(request)
        out.extend(getattr(reply, field))
        if not reply.next_page_token:
            return out
        request.page_token = reply.next_page_token
