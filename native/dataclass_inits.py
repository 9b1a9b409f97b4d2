"""Write out the `__init__` of each plain dataclass in a module's source, for the compiled copy only.

mypyc compiles a dataclass's own methods, but the `__init__` that `@dataclass` generates at import is plain
Python built by `exec`, and the simulator spends about a tenth of its time in those. A class that defines its own
`__init__` keeps it (`@dataclass` only adds methods the class lacks), so the build gives each dataclass of a
compiled module the `__init__` that `@dataclass` would have generated, as source, before mypyc sees it. It also
sets the `init=False` fields that have a default, which `@dataclass` leaves to the class attribute and a compiled
class would leave unset. The sources in the repository stay plain dataclasses. `frozen=True` becomes
`unsafe_hash=True` in that copy: the same `__eq__` and `__hash__`, without the `__setattr__` guard (which would
stop the written-out `__init__`; mypy has already checked on the real sources that nothing assigns to a frozen
field).

Classes this does not handle exactly are left alone: a class with bases, its own `__init__`, `InitVar` or
`ClassVar` fields, or `@dataclass` options other than `frozen`, `eq`, `order`, `repr` and `unsafe_hash`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

SENTINEL = "_gpurm_no_arg"      # the default of a parameter whose field has a default_factory
KEEP_OPTIONS = {"eq", "order", "repr", "unsafe_hash"}
FIELD_OPTIONS = {"default", "default_factory", "init", "repr", "compare", "hash", "metadata"}


@dataclass
class Field:
    name: str
    annotation: str
    default: str | None = None       # source of the default value
    factory: str | None = None       # source of the default factory
    init: bool = True                # a parameter of __init__


def _decorator(cls: ast.ClassDef) -> ast.expr | None:
    for d in cls.decorator_list:
        if isinstance(d, ast.Name) and d.id == "dataclass":
            return d
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "dataclass":
            return d
    return None


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _fields(cls: ast.ClassDef, source: str) -> list[Field] | None:
    """The class's fields in order, or None if it has one this module does not write out exactly."""
    out: list[Field] = []
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            return None
        if not isinstance(stmt, ast.AnnAssign):
            continue
        if not isinstance(stmt.target, ast.Name):
            return None
        annotation = ast.get_source_segment(source, stmt.annotation) or ""
        if "ClassVar" in annotation or "InitVar" in annotation:
            return None
        f = Field(stmt.target.id, annotation)
        value = stmt.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
            if value.args:
                return None
            for kw in value.keywords:
                if kw.arg not in FIELD_OPTIONS:
                    return None
                if kw.arg == "default":
                    f.default = ast.get_source_segment(source, kw.value)
                elif kw.arg == "default_factory":
                    f.factory = ast.get_source_segment(source, kw.value)
                elif kw.arg == "init":
                    if not isinstance(kw.value, ast.Constant) or not isinstance(kw.value.value, bool):
                        return None
                    f.init = kw.value.value
        elif value is not None:
            f.default = ast.get_source_segment(source, value)
        out.append(f)
    return out


def _init_source(fields: list[Field], post_init: bool, indent: str) -> str:
    params = ["self"]
    body: list[str] = []
    for f in fields:
        if f.init:
            if f.factory is not None:
                params.append(f"{f.name}: _gpurm_any = {SENTINEL}")
                body.append(f"self.{f.name} = ({f.factory})() if {f.name} is {SENTINEL} else {f.name}")
            elif f.default is not None:
                params.append(f"{f.name}: {f.annotation} = {f.default}")
                body.append(f"self.{f.name} = {f.name}")
            else:
                params.append(f"{f.name}: {f.annotation}")
                body.append(f"self.{f.name} = {f.name}")
        elif f.factory is not None:
            body.append(f"self.{f.name} = ({f.factory})()")
        elif f.default is not None:
            body.append(f"self.{f.name} = {f.default}")
    if post_init:
        body.append("self.__post_init__()")
    inner = indent + "    "
    lines = [f"{indent}def __init__({', '.join(params)}) -> None:"]
    lines += [inner + b for b in body] or [inner + "pass"]
    return "\n".join(lines) + "\n"


def write_inits(source: str) -> str:
    """The source with an `__init__` written into each dataclass it handles."""
    return inits_written(source)[0]


def inits_written(source: str) -> tuple[str, list[str]]:
    """The source with an `__init__` written into each dataclass it handles, and those classes' names."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, str]] = []        # (line index to insert before, text); decorator lines replaced
    replace: dict[int, str] = {}
    done: list[str] = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or cls.bases or cls.keywords:
            continue
        deco = _decorator(cls)
        if deco is None:
            continue
        options = deco.keywords if isinstance(deco, ast.Call) else []
        if isinstance(deco, ast.Call) and deco.args:
            continue
        if any(kw.arg not in KEEP_OPTIONS | {"frozen"} for kw in options):
            continue
        if any(kw.arg == "frozen" and not _is_true(kw.value) for kw in options):
            continue
        frozen = any(kw.arg == "frozen" for kw in options)
        if frozen and deco.lineno != deco.end_lineno:
            continue
        fields = _fields(cls, source)
        if fields is None:
            continue
        post_init = any(isinstance(s, ast.FunctionDef) and s.name == "__post_init__" for s in cls.body)
        first = cls.body[0]
        indent = " " * first.col_offset
        at = first.lineno - 1
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            at = (first.end_lineno or first.lineno)      # after the docstring
        edits.append((at, _init_source(fields, post_init, indent)))
        if frozen:
            kept = [f"{kw.arg}={ast.get_source_segment(source, kw.value)}" for kw in options
                    if kw.arg not in {"frozen", "unsafe_hash"}]
            replace[deco.lineno - 1] = " " * cls.col_offset + "@dataclass(" + ", ".join(
                [*kept, "unsafe_hash=True"]) + ")\n"
        done.append(cls.name)
    if not done:
        return source, done
    for i, text in replace.items():
        lines[i] = text
    # The sentinel goes right after the imports: the written-out __init__s use it as a default.
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    after = max((n.end_lineno or n.lineno) for n in imports) if imports else 0
    edits.append((after, f"from typing import Any as _gpurm_any\n{SENTINEL}: _gpurm_any = object()\n"))
    for at, text in sorted(edits, key=lambda e: e[0], reverse=True):
        lines.insert(at, text)
    return "".join(lines), done
