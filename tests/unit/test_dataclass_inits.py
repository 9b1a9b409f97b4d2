"""The native build's written-out dataclass __init__s (native/dataclass_inits.py) behave as @dataclass's own."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpurm.native import MODULES, ROOT
from gpurm.native.dataclass_inits import inits_written

SAMPLE = '''
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Plain:
    """A docstring."""

    a: int
    b: str = "x"
    c: list[int] = field(default_factory=list)
    d: dict[str, int] | None = field(default=None, repr=False)
    e: float = field(default=0.5, init=False)
    f: int = field(init=False)

    def __post_init__(self) -> None:
        self.f = self.a * 2


@dataclass(frozen=True)
class Frozen:
    x: int
    y: tuple[int, ...] = ()


@dataclass(order=True)
class Ordered:
    k: int
    v: str = ""


class NotADataclass:
    z: int = 3


@dataclass
class OwnInit:
    q: int

    def __init__(self) -> None:
        self.q = 7
'''


@contextmanager
def loaded(source: str, name: str) -> Iterator[dict[str, Any]]:
    """`source` run as module `name` (dataclasses look their module up in sys.modules)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
        yield module.__dict__
    finally:
        del sys.modules[name]


def test_instances_are_the_same_as_with_dataclass_own_init() -> None:
    rewritten, done = inits_written(SAMPLE)
    assert done == ["Plain", "Frozen", "Ordered"]            # OwnInit keeps its own
    with loaded(SAMPLE, "dc_before") as before, loaded(rewritten, "dc_after") as after:
        for make in (lambda m: m["Plain"](1), lambda m: m["Plain"](2, "y", [3], {"k": 1}),
                     lambda m: m["Plain"](a=4, c=[]), lambda m: m["Frozen"](1, (2,)), lambda m: m["Ordered"](5)):
            old, new = make(before), make(after)
            # (A field with init=False and a plain default is set on the instance now, where @dataclass leaves
            # the class attribute to answer: the same value, and a compiled class has no such fallback.)
            assert all(getattr(old, f.name) == getattr(new, f.name) for f in dataclasses.fields(old))
            assert repr(old).split("(", 1)[1] == repr(new).split("(", 1)[1]
        # A factory default is a new object each time, as with @dataclass.
        assert after["Plain"](1).c is not after["Plain"](1).c
        assert hash(after["Frozen"](1, (2,))) == hash(after["Frozen"](1, (2,)))
        assert after["Ordered"](1) < after["Ordered"](2)
        assert after["OwnInit"]().q == 7
        with pytest.raises(TypeError):
            after["Plain"]()                                  # a required field is required


@pytest.mark.parametrize(("pkg", "name"), MODULES)
def test_every_compiled_module_keeps_its_dataclass_signatures(pkg: str, name: str) -> None:
    source = Path(ROOT / pkg / name).read_text()
    rewritten, done = inits_written(source)
    with loaded(source, f"dc_{pkg}_{name[:-3]}_before") as before, \
            loaded(rewritten, f"dc_{pkg}_{name[:-3]}_after") as after:
        for cls_name in done:
            old, new = before[cls_name], after[cls_name]
            assert dataclasses.is_dataclass(new)
            old_params = inspect.signature(old.__init__).parameters
            new_params = inspect.signature(new.__init__).parameters
            assert list(old_params) == list(new_params), cls_name
            for p, q in zip(old_params.values(), new_params.values(), strict=True):
                # A factory's parameter defaults to a sentinel in both (dataclass' own is private).
                assert (p.default is inspect.Parameter.empty) == (q.default is inspect.Parameter.empty), (cls_name, p)
                if p.default is not inspect.Parameter.empty and repr(p.default) != "<factory>":
                    assert repr(p.default) == repr(q.default), (cls_name, p)     # (enums: one class per load)
            assert [f.name for f in dataclasses.fields(old)] == [f.name for f in dataclasses.fields(new)]
