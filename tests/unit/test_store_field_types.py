"""store.STORED_FIELD_TYPES must name every stored field whose type a compiled build erases.

mypyc keeps `list` for `list[Attempt]`, so the reload takes those fields' full types from that table. This reads the
record classes' annotations from their source (as written, whatever build runs) and checks that each generic or
optional field is in the table with the same type.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import gpurm.common.gpus
import gpurm.common.model
import gpurm.rm.state.cluster
from gpurm.rm.storage.store import STORED_FIELD_TYPES

# The compiled modules that hold stored records (others keep their annotations in either build).
SOURCES = {"gpurm.common.model": Path(gpurm.common.model.__file__).with_name("model.py"),
           "gpurm.common.gpus": Path(gpurm.common.gpus.__file__).with_name("gpus.py"),
           "gpurm.rm.state.cluster": Path(gpurm.rm.state.cluster.__file__).with_name("cluster.py")}


def written_annotations(cls: type) -> dict[str, object]:
    tree = ast.parse(SOURCES[cls.__module__].read_text())
    module = vars(typing.cast(object, __import__(cls.__module__, fromlist=["_"])))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {st.target.id: eval(ast.unparse(st.annotation), dict(module))
                    for st in node.body if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
    raise AssertionError(f"{cls.__name__} not found in its source")


def stored_classes() -> list[type]:
    seen: list[type] = []
    todo: list[type] = [gpurm.common.model.Job, gpurm.common.model.Container, gpurm.rm.state.cluster.Node]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for hint in written_annotations(cls).values():
            for arg in (hint, *typing.get_args(hint), *(a for x in typing.get_args(hint) for a in typing.get_args(x))):
                if isinstance(arg, type) and dataclasses.is_dataclass(arg) and arg.__module__ in SOURCES:
                    todo.append(arg)
    return seen


def test_every_generic_field_of_a_stored_record_is_in_the_table() -> None:
    classes = stored_classes()
    assert {c.__name__ for c in classes} >= {"Job", "Attempt", "Learner", "Container", "Node", "GpuRecord"}
    for cls in classes:
        for name, hint in written_annotations(cls).items():
            if typing.get_origin(hint) is None:
                continue  # a plain class: the compiled build keeps it
            assert STORED_FIELD_TYPES.get(cls, {}).get(name) == hint, f"{cls.__name__}.{name}: {hint}"
