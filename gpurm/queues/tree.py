"""The queue tree: queue definitions as validated from the admin's config, paths, inheritance and ACLs. Pure."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpurm.queues.fairshare import ShareNode

EVERYONE = "*"


class Policy(enum.Enum):
    FIFO = "fifo"   # submit order
    LAS = "las"     # least attained GPU-service first (Tiresias 2D-LAS levels), ties by submit order
    SRTF = "srtf"   # shortest remaining GPU-time first: needs job durations, so the simulator's oracle only
    GITTINS = "gittins"   # Tiresias' 2D-Gittins index from the sizes of finished jobs (las until enough finished)


class Borrowing(enum.Enum):
    """How borrowed capacity (GPUs held beyond a queue's steady share) is ordered across queues: `fair` (YARN: the
    queue furthest below its share) or a policy ranking every job beyond its queue's steady share cluster-wide, as
    one Tiresias queue (DESIGN.md; rm/sched/borrowing.py)."""

    FAIR = "fair"
    LAS = "las"
    GITTINS = "gittins"
    SRTF = "srtf"         # needs job durations: the simulator's oracle only

    @property
    def policy(self) -> Policy | None:
        """The policy borrowers are ranked by; None under `fair`."""
        return None if self is Borrowing.FAIR else Policy(self.value)


@dataclass(frozen=True)
class PreemptionSettings:
    min_share_timeout_s: float | None = 30.0       # None: never preempt for the min share
    fair_share_timeout_s: float | None = 60.0      # None: never preempt for the fair share
    fair_share_threshold: float = 0.5
    grace_s: float = 15.0


@dataclass
class QueueDef:
    name: str
    path: str                                   # root.research.nlp
    weight: float = 1.0
    min_gpus: int = 0
    max_gpus: int | None = None                 # None = unlimited
    max_running_jobs: int | None = None
    max_gpus_per_user: int | None = None
    submit_acl: list[str] | None = None         # None = not set here (inherit)
    admin_acl: list[str] | None = None
    preemptible: bool | None = None             # None = inherit (root: true)
    policy: Policy | None = None                # None = inherit (root: fifo)
    rightsize: bool | None = None               # None = inherit (root: off); docs/queues.md, "Right-sizing"
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    children: list[QueueDef] = field(default_factory=list)
    parent: QueueDef | None = field(default=None, repr=False, compare=False)
    # The effective_* values, computed when first asked: a tree is never changed once built (a refresh builds a
    # new one). Plain fields, not functools.cached_property: that does not cache in a class compiled by mypyc.
    _preemptible: bool | None = field(default=None, init=False, repr=False, compare=False)
    _policy: Policy | None = field(default=None, init=False, repr=False, compare=False)
    _submit: set[str] | None = field(default=None, init=False, repr=False, compare=False)
    _admin: set[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A class compiled by mypyc has no class attribute to fall back on: set the init=False fields here.
        self._preemptible = self._policy = None
        self._submit = self._admin = None

    @property
    def leaf(self) -> bool:
        return not self.children

    @property
    def short(self) -> str:
        """The path users type: research.nlp."""
        return self.path.removeprefix("root.") if self.path != "root" else "root"

    def ancestry(self) -> Iterator[QueueDef]:
        """This queue, then its parent, up to the root."""
        q: QueueDef | None = self
        while q is not None:
            yield q
            q = q.parent

    @property
    def effective_preemptible(self) -> bool:
        # A queue is preemptible only if it and every ancestor allow it.
        if self._preemptible is None:
            self._preemptible = all(q.preemptible is not False for q in self.ancestry())
        return self._preemptible

    @property
    def effective_rightsize(self) -> bool:
        """Whether agents limit this queue's learners' memory per detected phase: the nearest setting on the path."""
        return next((q.rightsize for q in self.ancestry() if q.rightsize is not None), False)

    @property
    def effective_policy(self) -> Policy:
        if self._policy is None:
            self._policy = next((q.policy for q in self.ancestry() if q.policy is not None), Policy.FIFO)
        return self._policy

    def _acl(self, attr: str) -> set[str] | None:
        entries: set[str] = set()
        any_set = False
        for q in self.ancestry():
            acl = getattr(q, attr)
            if acl is not None:
                any_set = True
                entries |= set(acl)
        return entries if any_set else None

    @property
    def effective_submit(self) -> set[str]:
        """Who may submit: the union of the ACLs on the path (inherited downward); nobody set one = everyone."""
        if self._submit is None:
            acl = self._acl("submit_acl")
            self._submit = {EVERYONE} if acl is None else acl
        return self._submit

    @property
    def effective_admin(self) -> set[str]:
        if self._admin is None:
            self._admin = self._acl("admin_acl") or set()
        return self._admin


def acl_allows(acl: Iterable[str], user: str, groups: Iterable[str]) -> bool:
    entries = set(acl)
    if EVERYONE in entries or user in entries:
        return True
    return any(f"@{g}" in entries for g in groups)


@dataclass
class QueueTree:
    root: QueueDef
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    source: str = ""                # the YAML it came from ("" for the built-in default)
    borrowing: Borrowing = Borrowing.FAIR   # the root's `borrowing`: how borrowed capacity is ordered

    def __post_init__(self) -> None:
        self.by_path: dict[str, QueueDef] = {}
        stack = [self.root]
        while stack:
            q = stack.pop()
            self.by_path[q.path] = q
            for c in q.children:
                c.parent = q
                stack.append(c)
        self.leaves: list[QueueDef] = sorted(
            (q for q in self.by_path.values() if q.leaf and q is not self.root), key=lambda q: q.path)

    def walk(self) -> list[QueueDef]:
        """Every queue, depth first, children in path order (the order `gpurm queues` prints)."""
        out: list[QueueDef] = []

        def visit(q: QueueDef) -> None:
            out.append(q)
            for c in sorted(q.children, key=lambda c: c.name):
                visit(c)

        visit(self.root)
        return out

    def find(self, name: str) -> QueueDef | None:
        """A queue by the path a user typed: `research.nlp` or `root.research.nlp`."""
        return self.by_path.get(name if name == "root" or name.startswith("root.") else f"root.{name}")

    def share_tree(self, demand: dict[str, int] | None = None) -> ShareNode:
        demand = demand or {}

        def build(q: QueueDef) -> ShareNode:
            return ShareNode(q.path, q.weight, q.min_gpus, q.max_gpus, [build(c) for c in q.children],
                             demand.get(q.path, 0))

        return build(self.root)


def default_tree() -> QueueTree:
    """What the RM runs without a queues file: one `default` queue open to everyone."""
    root = QueueDef("root", "root", children=[QueueDef("default", "root.default")])
    return QueueTree(root)
