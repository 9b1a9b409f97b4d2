"""queues.yaml: loading and validation. A document is accepted whole or rejected with every problem, each naming
the queue path, the field and the reason. See docs/queues.md for the format."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gpurm.common.fields import ConfigError, Problems, Reader, parse_duration
from gpurm.queues.tree import EVERYONE, Borrowing, Policy, PreemptionSettings, QueueDef, QueueTree

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_NAME = 64                    # characters of a queue name
MAX_DEPTH = 32
MAX_YAML_BYTES = 1 << 20         # the text of a queue config
MAX_QUEUES = 5000                # queues in one config (root not counted)
MAX_ACL_ENTRIES = 256            # entries in one acl.submit or acl.admin list
MAX_ACL_ENTRY = 128              # characters of one ACL entry (a user or @group name)
MAX_COUNT = 1_000_000            # GPUs or jobs: far above any cluster, and within every int32 field
MAX_WEIGHT = 1e6
MAX_TIMEOUT_S = 365 * 86400.0
_QUEUE_KEYS = ("weight", "min_gpus", "max_gpus", "max_running_jobs", "max_gpus_per_user", "acl", "preemptible",
               "policy", "rightsize", "queues", "min_share_preemption_timeout", "fair_share_preemption_timeout",
               "fair_share_preemption_threshold", "preemption_grace")


class _TooManyQueues(Exception):
    pass


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that notes keys given twice in one mapping (PyYAML silently keeps the last), and stops
    reading as soon as the document names more than MAX_QUEUES queues (the keys of every `queues:` mapping), so
    an oversized config is refused after reading only its first MAX_QUEUES queues."""

    duplicates: list[str]
    queue_keys = 0
    _pending_queues = False
    _queue_maps: set[int]

    def compose_node(self, parent: Any, index: Any) -> Any:
        if index is None and parent is not None:
            if self._pending_queues:
                self._pending_queues = False
                self._queue_maps.add(id(parent))
            if id(parent) in self._queue_maps:
                self.queue_keys += 1
                if self.queue_keys > MAX_QUEUES:
                    raise _TooManyQueues()
        elif isinstance(index, yaml.ScalarNode) and index.value == "queues":
            self._next_is_queues = True
        return super().compose_node(parent, index)

    def compose_mapping_node(self, anchor: Any) -> Any:
        self._pending_queues = getattr(self, "_next_is_queues", False)
        self._next_is_queues = False
        node = super().compose_mapping_node(anchor)
        self._pending_queues = False
        return node


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue   # construct_mapping below refuses an unhashable key with its line
        if key in seen:
            loader.duplicates.append(f"line {key_node.start_mark.line + 1}: {key!r} is given twice in the same "
                                     "mapping (a duplicate queue name or field)")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(source: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{source}: not valid YAML{where}: {problem}"


def load_yaml(text: str, source: str) -> Any:
    try:
        loader = _StrictLoader(text)   # reads the stream at once: refuses unprintable characters here
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(source, exc)]) from None
    loader.duplicates = []
    loader._queue_maps = set()
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(source, exc)]) from None
    except _TooManyQueues:
        raise ConfigError([f"{source}: more than {MAX_QUEUES} queues (the limit for one config); refused after "
                           f"reading {MAX_QUEUES}"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: nested too deeply to read (queues nest at most {MAX_DEPTH} levels)"]) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise ConfigError([f"{source}: {d}" for d in loader.duplicates])
    return data


def _timeout(r: Reader, key: str, default: float | None) -> float | None:
    """A preemption timeout: a duration, or `off` / null to never preempt for that reason."""
    if not r.has(key):
        r.seen.add(key)
        return default
    value = r.raw(key)
    if value is None or value in ("off", "never", False):
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        r.error(key, f"{exc} (or `off`)")
        return default
    if seconds > MAX_TIMEOUT_S:
        r.error(key, f"must be at most 365d (or `off`), got {value!r:.40}")
        return default
    return seconds


def _preemption(r: Reader, inherited: PreemptionSettings) -> PreemptionSettings:
    threshold = r.number("fair_share_preemption_threshold", inherited.fair_share_threshold, minimum=0.0,
                         maximum=1.0)
    return PreemptionSettings(
        min_share_timeout_s=_timeout(r, "min_share_preemption_timeout", inherited.min_share_timeout_s),
        fair_share_timeout_s=_timeout(r, "fair_share_preemption_timeout", inherited.fair_share_timeout_s),
        fair_share_threshold=threshold,
        grace_s=r.duration("preemption_grace", inherited.grace_s, maximum=MAX_TIMEOUT_S),
    )


def _acl(r: Reader) -> tuple[list[str] | None, list[str] | None]:
    if not r.has("acl"):
        r.seen.add("acl")
        return None, None
    a = r.section("acl")
    submit = a.strings("submit") if a.has("submit") else None
    admin = a.strings("admin") if a.has("admin") else None
    for label, entries in (("submit", submit), ("admin", admin)):
        if entries is not None and len(entries) > MAX_ACL_ENTRIES:
            a.error(label, f"{len(entries)} entries; at most {MAX_ACL_ENTRIES} (use @groups for more people)")
            continue
        for e in entries or []:
            if len(e) > MAX_ACL_ENTRY:
                a.error(label, f"{e[:32]!r}... is {len(e)} characters; at most {MAX_ACL_ENTRY}")
                continue
            if not e or e == "@" or (e != EVERYONE and not re.fullmatch(r"@?[A-Za-z0-9_.-]+\$?", e)):
                a.error(label, f"{e!r} is not a user, @group or *")
    a.reject_unknown()
    return submit, admin


def _borrowing(r: Reader) -> Borrowing:
    """The root's `borrowing`: fair (the default), las or gittins. srtf needs job durations, which only a trace
    has: `gpurm sim --borrowing srtf`."""
    if not r.has("borrowing"):
        r.seen.add("borrowing")
        return Borrowing.FAIR
    text = r.text("borrowing", "fair")
    if text in ("fair", "las", "gittins"):
        return Borrowing(text)
    r.error("borrowing", f"must be one of fair, las, gittins; got {text!r:.40}"
            + (" (srtf needs job durations: `gpurm sim --borrowing srtf` only)" if text == "srtf" else ""))
    return Borrowing.FAIR


def _queue(name: str, path: str, data: Any, p: Problems, inherited: PreemptionSettings) -> QueueDef:
    r = Reader(data, path, p)
    if path.count(".") > MAX_DEPTH:
        p.add(path, f"queues nest at most {MAX_DEPTH} levels below root")
        return QueueDef(name=name, path=path)
    q = QueueDef(name=name, path=path)
    q.weight = r.number("weight", 1.0, minimum=0.0, maximum=MAX_WEIGHT)
    q.min_gpus = r.integer("min_gpus", 0, minimum=0, maximum=MAX_COUNT)
    q.max_gpus = r.optional_int("max_gpus", minimum=0, maximum=MAX_COUNT)
    q.max_running_jobs = r.optional_int("max_running_jobs", minimum=0, maximum=MAX_COUNT)
    q.max_gpus_per_user = r.optional_int("max_gpus_per_user", minimum=0, maximum=MAX_COUNT)
    q.submit_acl, q.admin_acl = _acl(r)
    if r.has("preemptible"):
        q.preemptible = r.flag("preemptible", True)
    if r.has("rightsize"):
        q.rightsize = r.flag("rightsize", False)
    if r.has("policy"):
        text = r.text("policy", "fifo")
        try:
            q.policy = Policy(text)
        except ValueError:
            q.policy = None
        if q.policy in (None, Policy.SRTF):
            q.policy = None
            r.error("policy", f"must be one of fifo, las, gittins; got {text!r}"
                    + (" (srtf needs job durations: `gpurm sim --policy srtf` only)" if text == "srtf" else ""))
    q.preemption = _preemption(r, inherited)
    if q.max_gpus is not None and q.min_gpus > q.max_gpus:
        r.error("min_gpus", f"{q.min_gpus} is above max_gpus {q.max_gpus}")
    children = r.raw("queues")
    r.reject_unknown(_QUEUE_KEYS)
    if children is not None:
        q.children = _children(children, path, p, q.preemption)
        if not q.children and isinstance(children, dict):
            p.add(f"{path}.queues", "is empty; remove it to make this a leaf queue")
    return q


def _children(data: Any, parent: str, p: Problems, inherited: PreemptionSettings) -> list[QueueDef]:
    if not isinstance(data, dict):
        p.add(f"{parent}.queues", f"expected a mapping of queue names, got {type(data).__name__}")
        return []
    out = []
    for name, body in data.items():
        path = f"{parent}.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            p.add(path if len(path) <= 200 else f"{parent}.{str(name)[:64]}...",
                  f"queue names use letters, digits, - and _ (no dots), at most {MAX_NAME} of them")
            continue
        if name == "root":
            p.add(path, "`root` is the tree's own name; pick another")
            continue
        out.append(_queue(name, path, body, p, inherited))
    return out


def capacity_warnings(tree: QueueTree, capacity: int) -> list[str]:
    """What a valid config promises that a cluster of `capacity` GPUs cannot keep: top-level guarantees (min_gpus)
    adding up to more than the cluster has. Not an error: capacity changes as servers come and go, and the fair
    share copes (the minimums are scaled down in proportion until they fit), but no queue then gets its full
    guarantee. Per parent, children above the parent's own min or max are already errors (`_check_tree`)."""
    guaranteed = [(c.name, c.min_gpus) for c in tree.root.children if c.min_gpus]
    total = sum(m for _, m in guaranteed)
    if total <= capacity:
        return []
    detail = ", ".join(f"{name} {m}" for name, m in guaranteed)
    scale = capacity / total
    return [f"the top-level queues guarantee {total} GPUs (min_gpus: {detail}) but the cluster has {capacity}: "
            f"every guarantee is scaled down to {scale:.0%} of its min_gpus, so none is fully met; lower them to add "
            f"up to at most {capacity}"]


def _check_tree(tree: QueueTree, p: Problems) -> None:
    for q in tree.walk():
        if q.children and q is not tree.root:
            mins = sum(c.min_gpus for c in q.children)
            detail = ", ".join(f"{c.name} {c.min_gpus}" for c in q.children if c.min_gpus)
            if mins > q.min_gpus:
                p.add(f"{q.path}.min_gpus", f"its children guarantee {mins} GPUs ({detail}) but it guarantees only "
                                            f"{q.min_gpus}; raise it to at least {mins} or lower theirs")
            if q.max_gpus is not None and mins > q.max_gpus:
                p.add(f"{q.path}.max_gpus", f"its children guarantee {mins} GPUs ({detail}), above its max_gpus "
                                            f"{q.max_gpus}")
        if q.leaf and q is not tree.root and not q.effective_submit:
            p.add(f"{q.path}.acl.submit", "nobody may submit to this leaf queue (the ACLs on its path are all "
                                          "empty); add users, @groups or *")
        if q.leaf and q.policy is not None and q is tree.root:
            p.add("policy", "the root has no jobs")


def parse_queues(text: str, source: str = "queues.yaml") -> QueueTree:
    """A validated QueueTree from YAML text, or ConfigError with every problem (or the first limit exceeded:
    MAX_YAML_BYTES of text, MAX_QUEUES queues, MAX_DEPTH levels)."""
    if len(text) > MAX_YAML_BYTES or len(text.encode("utf-8", errors="replace")) > MAX_YAML_BYTES:
        raise ConfigError([f"{source}: larger than {MAX_YAML_BYTES} bytes (the limit for a queue config)"])
    data = load_yaml(text, source)
    if data is None:
        raise ConfigError([f"{source}: is empty; a queue config needs `queues:` with at least one queue"])
    p = Problems()
    r = Reader(data, "", p)
    d = r.section("defaults")
    preemption = _preemption(d, PreemptionSettings())
    d.reject_unknown()
    root = QueueDef(name="root", path="root", preemption=preemption)
    root.submit_acl, root.admin_acl = _acl(r)
    if r.has("policy"):
        text_policy = r.text("policy", "fifo")
        if text_policy in ("fifo", "las", "gittins"):
            root.policy = Policy(text_policy)
        else:
            r.error("policy", f"must be one of fifo, las, gittins; got {text_policy!r}")
    borrowing = _borrowing(r)
    children = r.raw("queues")
    r.reject_unknown()
    if not children:
        p.add("queues", "is required: at least one queue")
    else:
        root.children = _children(children, "root", p, preemption)
    tree = QueueTree(root, preemption, source=text, borrowing=borrowing)
    count = sum(1 for _ in tree.walk()) - 1
    if count > MAX_QUEUES:
        p.add("queues", f"{count} queues; at most {MAX_QUEUES}")
    _check_tree(tree, p)
    if p.items:
        raise ConfigError([f"{source}: {item}" for item in p.items])
    return tree
