"""Dataclass records <-> JSON-able dicts, for the state store. Enums travel by name; unknown keys are ignored
so an older RM can read a newer record, and missing keys take the field's default."""

from __future__ import annotations

import dataclasses
import enum
import keyword
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class RecordError(ValueError):
    """A stored record this RM cannot read: `field` is the dotted path to the bad value ("" for the record)."""

    def __init__(self, reason: str, field: str = "") -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.reason = reason
        self.field = field

    def within(self, name: str) -> RecordError:
        return RecordError(self.reason, f"{name}.{self.field}" if self.field else name)

_HINTS: dict[type, dict[str, Any]] = {}
_PLAIN = frozenset({str, int, float, bool, type(None)})
_DUMPERS: dict[type, Callable[[Any], dict[str, Any]]] = {}     # record class -> its dumper (_dumper)


def to_dict(record: object) -> dict[str, Any]:
    dump = _DUMPERS.get(type(record))
    if dump is None:
        assert dataclasses.is_dataclass(record) and not isinstance(record, type)
        dump = _DUMPERS[type(record)] = _dumper(type(record))
    return dump(record)


def _dumper(cls: type) -> Callable[[Any], dict[str, Any]]:
    """A function turning a record of `cls` into its dict, written once per class: each field read once, a plain
    value (most are) kept without a call, anything else through _dump (the store serialises every record a
    request changes; a submit's job was 18 us of the loop through the generic walk)."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return lambda r: {n: _dump(getattr(r, n)) for n in names}
    reads = "".join(f"    v{i} = r.{n}\n" for i, n in enumerate(names))
    items = ", ".join(f"{n!r}: v{i} if type(v{i}) in _PLAIN else _dump(v{i})" for i, n in enumerate(names))
    source = f"def dump(r):\n{reads}    return {{{items}}}\n"
    space: dict[str, Any] = {"_PLAIN": _PLAIN, "_dump": _dump}
    exec(compile(source, f"<records {cls.__name__}>", "exec"), space)     # text written above from field names
    made: Callable[[Any], dict[str, Any]] = space["dump"]
    return made


def _dump(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind in _DUMPERS:
        return _DUMPERS[kind](value)
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, list | tuple):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(_dump(v) for v in value)
    return value


# Field types by class, for the fields whose annotations a compiled build erases (mypyc keeps `list` for
# `list[Attempt]`): they tell the reload how to rebuild nested records and int keys. The caller owns the table.
FieldTypes = Mapping[type, Mapping[str, Any]]


def from_dict(cls: type[T], data: dict[str, Any], field_types: FieldTypes | None = None) -> T:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    if field_types and cls in field_types:
        hints = {**hints, **field_types[cls]}
    if not isinstance(data, dict):
        raise RecordError(f"expected a {cls.__name__} record (a mapping), got {type(data).__name__}")
    kwargs = {}
    missing = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.name in data:
            try:
                kwargs[f.name] = _load(hints[f.name], data[f.name], field_types)
            except RecordError as exc:
                raise exc.within(f.name) from None
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise RecordError(f"cannot read {str(data[f.name])[:80]!r} ({type(exc).__name__})", f.name
                                  ) from None
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            missing.append(f.name)
    if missing:
        raise RecordError(f"missing (required in a {cls.__name__} record)", ", ".join(missing))
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"not a valid {cls.__name__} record ({exc})") from None


def _load(hint: Any, value: Any, field_types: FieldTypes | None) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _load(inner[0], value, field_types) if len(inner) == 1 else value
    if origin is list:
        return [_load(args[0], v, field_types) for v in value]
    if origin is tuple:
        return tuple(_load(args[0], v, field_types) for v in value)
    if origin in (set, frozenset):
        return origin(_load(args[0], v, field_types) for v in value)
    if origin is dict:
        key_hint = args[0]
        return {(int(k) if key_hint is int else k): _load(args[1], v, field_types) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint[value]
        except (KeyError, TypeError):
            raise RecordError(f"unknown {hint.__name__} value {str(value)[:64]!r} (written by a newer gpurm?)"
                              ) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_dict(hint, value, field_types)
    if hint is float and isinstance(value, int):
        return float(value)
    return value
