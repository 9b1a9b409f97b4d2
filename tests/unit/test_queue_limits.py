"""Queue config limits (queues/config.py): each refused config names the limit it broke."""

from __future__ import annotations

import pytest

from gpurm.common.fields import ConfigError
from gpurm.queues.config import (
    MAX_ACL_ENTRIES,
    MAX_ACL_ENTRY,
    MAX_DEPTH,
    MAX_NAME,
    MAX_QUEUES,
    MAX_YAML_BYTES,
    parse_queues,
)


def flat(n: int) -> str:
    """n leaf queues open to everyone, in YAML flow style (cheap to read)."""
    return "acl: {submit: ['*']}\nqueues: {" + ", ".join(f"q{i}: " for i in range(n)) + "}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_queues(text, "q.yaml")
    return exc.value.problems


def test_the_text_size_limit_is_checked_before_reading() -> None:
    assert problems("queues: {a: }\n#" + "x" * MAX_YAML_BYTES) == [
        f"q.yaml: larger than {MAX_YAML_BYTES} bytes (the limit for a queue config)"]
    assert problems("queues: {a: }\n#" + "é" * (MAX_YAML_BYTES // 2)) == [
        f"q.yaml: larger than {MAX_YAML_BYTES} bytes (the limit for a queue config)"], "bytes, not characters"


def test_the_queue_count_limit_counts_every_level() -> None:
    assert len(parse_queues(flat(MAX_QUEUES)).leaves) == MAX_QUEUES
    assert problems(flat(MAX_QUEUES + 1)) == [
        f"q.yaml: more than {MAX_QUEUES} queues (the limit for one config); refused after reading {MAX_QUEUES}"]
    half = MAX_QUEUES // 2
    two_parents = ("acl: {submit: ['*']}\nqueues:\n"
                   + "".join(f"  p{p}:\n    queues: {{" + ", ".join(f"q{i}: " for i in range(half)) + "}\n"
                             for p in range(2)))
    assert any(f"more than {MAX_QUEUES} queues" in p for p in problems(two_parents)), "parents count too"


def test_a_key_named_queues_elsewhere_is_not_counted_as_a_queue_mapping() -> None:
    text = "acl: {submit: ['*']}\nqueues:\n  a:\n    acl: {submit: [queues]}\n"
    assert [q.path for q in parse_queues(text).leaves] == ["root.a"]


def test_depth_name_and_acl_limits() -> None:
    text, indent = "acl: {submit: ['*']}\nqueues:\n", "  "
    for level in range(MAX_DEPTH + 1):
        text += f"{indent}l{level}:\n" + (f"{indent}  queues:\n" if level < MAX_DEPTH else "")
        indent += "    "
    assert any(f"nest at most {MAX_DEPTH} levels" in p for p in problems(text))
    assert any(f"at most {MAX_NAME} of them" in p for p in problems(flat(0).replace("{}", "{" + "n" * 65 + ": }")))
    users = ", ".join(f"u{i}" for i in range(MAX_ACL_ENTRIES + 1))
    assert problems(f"queues:\n  a:\n    acl: {{submit: [{users}]}}\n") == [
        f"q.yaml: root.a.acl.submit: {MAX_ACL_ENTRIES + 1} entries; at most {MAX_ACL_ENTRIES} (use @groups for "
        "more people)"]
    long_user = "u" * (MAX_ACL_ENTRY + 1)
    text = f"queues:\n  a:\n    acl: {{admin: [{long_user}], submit: ['*']}}\n"
    assert problems(text) == [f"q.yaml: root.a.acl.admin: '{'u' * 32}'... is {MAX_ACL_ENTRY + 1} characters; at most "
                              f"{MAX_ACL_ENTRY}"]
