"""queues.yaml validation: every problem reported with queue path, field and reason; inheritance; ACLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurm.common.fields import ConfigError
from gpurm.queues.config import capacity_warnings, parse_queues
from gpurm.queues.tree import Policy, acl_allows

ROOT = Path(__file__).resolve().parents[2]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_queues(text, "q.yaml")
    return info.value.problems


def test_the_shipped_example_is_valid_and_inherits() -> None:
    tree = parse_queues((ROOT / "configs" / "queues.yaml").read_text())
    nlp = tree.find("research.nlp")
    assert nlp is not None and nlp.leaf and nlp.effective_policy is Policy.LAS
    assert nlp.effective_submit == {"@research"} and nlp.effective_admin == {"alice", "root"}
    prod = tree.find("prod")
    assert prod is not None and not prod.effective_preemptible
    assert tree.find("root.default") is tree.find("default")
    assert nlp.preemption.grace_s == 15 and nlp.preemption.fair_share_threshold == 0.5


def test_rightsize_is_off_by_default_inherited_downward_and_a_flag() -> None:
    tree = parse_queues("queues:\n  a: {}\n  b:\n    rightsize: on\n    queues:\n      c: {}\n"
                        "      d: {rightsize: off}\n")
    flags = {name: q.effective_rightsize for name in ("a", "b", "b.c", "b.d") if (q := tree.find(name))}
    assert flags == {"a": False, "b": True, "b.c": True, "b.d": False}
    assert problems("queues:\n  a: {rightsize: sometimes}\n") == [
        "q.yaml: root.a.rightsize: must be true or false, got 'sometimes'"]


def test_defaults_when_nothing_is_set() -> None:
    tree = parse_queues("queues:\n  a: {}\n  b:\n    queues:\n      c: {}\n")
    c = tree.find("b.c")
    assert c is not None and c.weight == 1 and c.effective_preemptible and c.effective_policy is Policy.FIFO
    assert c.effective_submit == {"*"}
    assert [q.path for q in tree.leaves] == ["root.a", "root.b.c"]


def test_per_queue_preemption_overrides_and_off() -> None:
    tree = parse_queues("defaults: {fair_share_preemption_timeout: 2m}\nqueues:\n"
                        "  a: {min_share_preemption_timeout: off, preemption_grace: 5s}\n  b: {}\n")
    a, b = tree.find("a"), tree.find("b")
    assert a is not None and b is not None
    assert a.preemption.min_share_timeout_s is None and a.preemption.grace_s == 5
    assert a.preemption.fair_share_timeout_s == 120 and b.preemption.min_share_timeout_s == 30


def test_every_problem_is_named() -> None:
    ps = problems("queues:\n"
                  "  a: {weight: -1, min_gpus: 5, max_gpus: 2, policy: lottery, colour: red}\n"
                  "  b:\n    min_gpus: 2\n    max_gpus: 3\n    queues:\n      c: {min_gpus: 4}\n"
                  "  d.e: {}\n"
                  "  f: {max_running_jobs: -2, acl: {submit: []}}\n")
    text = "\n".join(ps)
    for expected in ("root.a.weight: must be at least 0", "root.a.policy: must be one of fifo, las",
                     "root.a.min_gpus: 5 is above max_gpus 2", "root.a.colour: unknown field",
                     "root.b.min_gpus: its children guarantee 4", "root.b.max_gpus: its children guarantee 4",
                     "root.d.e: queue names", "root.f.max_running_jobs: must be at least 0",
                     "root.f.acl.submit: nobody may submit"):
        assert expected in text, (expected, ps)


def test_duplicate_queue_names_are_caught() -> None:
    (p,) = problems("queues:\n  a: {}\n  b: {}\n  a: {weight: 2}\n")
    assert "line 4" in p and "'a' is given twice" in p


def test_not_yaml_and_empty() -> None:
    assert "not valid YAML" in problems("queues: [\n")[0]
    assert "at least one queue" in problems("queues: {}\n")[0]
    assert "is empty" in problems("")[0]


def test_acl_entries() -> None:
    assert acl_allows({"alice", "@ml"}, "bob", ["ml"])
    assert not acl_allows({"alice", "@ml"}, "bob", ["staff"])
    assert acl_allows({"*"}, "anyone", [])


def test_guarantees_above_the_capacity_are_a_warning_not_an_error() -> None:
    tree = parse_queues("queues:\n  research: {min_gpus: 400, queues: {nlp: {min_gpus: 300}, cv: {}}}\n"
                        "  prod: {min_gpus: 200}\n  dev: {}\n", "q.yaml")
    assert capacity_warnings(tree, 600) == [] and capacity_warnings(tree, 1000) == []
    (warning,) = capacity_warnings(tree, 512)
    assert warning.startswith("the top-level queues guarantee 600 GPUs (min_gpus: research 400, prod 200) but the "
                              "cluster has 512: every guarantee is scaled down to 85% of its min_gpus")
    assert "at most 512" in warning
