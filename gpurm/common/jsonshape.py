"""One machine-readable shape for every message gpurm prints or serves as JSON (`-o json`, the REST API).

- Enum values without their type's prefix, as the CLI's tables spell them: `SUCCEEDED`, not `JOB_SUCCEEDED`;
  `RUNNING` for a node, `LEARNER` for a container kind. The zero value is `UNSPECIFIED`.
- Numbers as JSON numbers, 64-bit ones included (protobuf's own JSON writes those as strings).
- Every field present, in its .proto name (`snake_case`), with its default when unset (a message as an object of
  defaults); an unset proto3 `optional` is null, since there unset means something.
- bytes as UTF-8 text, bad bytes replaced (what gpurm sends as bytes is log output); maps as objects; times
  stay the `*_ms` integers the messages carry (milliseconds since the Unix epoch).
"""

from __future__ import annotations

import functools
import json
import keyword
import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message


@functools.cache
def enum_prefix(enum: EnumDescriptor) -> str:
    """What every value of `enum` but the zero one starts with, up to an underscore (`JOB_` for JobState)."""
    names = [v.name for v in enum.values if v.number != 0]
    if not names:
        return ""
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    return prefix[: prefix.rfind("_") + 1] if "_" in prefix else ""


def enum_name(enum: EnumDescriptor, number: int) -> str:
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)           # a value this client's proto does not know yet
    if number == 0:
        return "UNSPECIFIED"
    return str(value.name).removeprefix(enum_prefix(enum))


# How a field's values become plain values: as they are, an enum's name, bytes as text, a message as a dict.
_PLAIN, _ENUM, _BYTES, _MESSAGE = range(4)
# A field's shape: one value, a repeated field, a map, a proto3 `optional` (null when unset).
_ONE, _REPEATED, _MAP, _OPTIONAL = range(4)
Convert = tuple[int, dict[int, str] | None]


def _convert_of(field: Any) -> Convert:      # a FieldDescriptor (upb's or the pure one)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _ENUM, {v.number: enum_name(field.enum_type, v.number) for v in field.enum_type.values}
    if field.type == FieldDescriptor.TYPE_BYTES:
        return _BYTES, None
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _MESSAGE, None
    return _PLAIN, None


def _is_map(field: Any) -> bool:
    return bool(field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)


@functools.cache
def _plan(descriptor: Any) -> tuple[tuple[str, int, Convert], ...]:
    """Each field of a message type: its name, shape and conversion, worked out once per type (reading the
    descriptors for every message of a 10,000-node listing cost more than the listing)."""
    out = []
    field: Any
    for field in descriptor.fields:
        if _is_map(field):
            out.append((field.name, _MAP, _convert_of(field.message_type.fields_by_name["value"])))
        elif field.is_repeated:
            out.append((field.name, _REPEATED, _convert_of(field)))
        elif field.has_presence and field.containing_oneof is not None:
            out.append((field.name, _OPTIONAL, _convert_of(field)))
        else:
            out.append((field.name, _ONE, _convert_of(field)))
    return tuple(out)


class _EnumNames(dict[int, str]):
    """An enum's numbers to the names the tables use; a number this client's proto does not know yet reads as
    itself (`names[value]`: one dict lookup in the generated converters)."""

    def __missing__(self, number: int) -> str:
        return str(number)


def _bytes(value: bytes) -> str:
    return bytes(value).decode(errors="replace")


# The generated converters (a cache: each is written once per message type) and what they use, in one namespace: each
# refers to its nested types' converters by name, looked up when it runs, so a type that contains itself needs
# nothing special.
_NAMESPACE: dict[str, Any] = {"_bytes": _bytes}


def _expr(convert: Convert, value: str, enum_ref: str, nested_ref: str) -> str:
    kind = convert[0]
    if kind == _PLAIN:
        return value
    if kind == _ENUM:
        return f"{enum_ref}[{value}]"
    if kind == _BYTES:
        return f"_bytes({value})"
    return f"{nested_ref}({value})"


def _converter(descriptor: Any) -> Callable[[Message], dict[str, Any]]:
    """A function turning a message of this type into its plain dict, written once per type from its plan: one dict
    display reading each field once, nested types by their own converters (a 100,000-job `gpurm jobs -o json`
    spent most of its time walking the plans field by field)."""
    ident = "c_" + descriptor.full_name.replace(".", "_")
    done: Callable[[Message], dict[str, Any]] | None = _NAMESPACE.get(ident)
    if done is not None:
        return done
    items = []
    nested_types = []
    for i, (name, shape, convert) in enumerate(_plan(descriptor)):
        access = f"getattr(m, {name!r})" if keyword.iskeyword(name) or not name.isidentifier() else f"m.{name}"
        enum_ref = f"{ident}_e{i}"
        if convert[0] == _ENUM:
            _NAMESPACE[enum_ref] = _EnumNames(convert[1] or {})
        nested_ref = ""
        if convert[0] == _MESSAGE:
            field = descriptor.fields_by_name[name]
            nested = field.message_type.fields_by_name["value"].message_type if shape == _MAP else field.message_type
            nested_ref = "c_" + nested.full_name.replace(".", "_")
            nested_types.append(nested)
        if shape == _ONE:
            expr = _expr(convert, access, enum_ref, nested_ref)
        elif shape == _REPEATED:
            expr = f"list({access})" if convert[0] == _PLAIN else \
                f"[{_expr(convert, 'v', enum_ref, nested_ref)} for v in {access}]"
        elif shape == _MAP:
            expr = f"{{str(k): {_expr(convert, 'v', enum_ref, nested_ref)} for k, v in sorted({access}.items())}}"
        else:
            expr = f"({_expr(convert, access, enum_ref, nested_ref)} if m.HasField({name!r}) else None)"
        items.append(f"        {name!r}: {expr},")
    source = f"def {ident}(m):\n    return {{\n" + "\n".join(items) + "\n    }\n"
    exec(compile(source, f"<jsonshape {descriptor.full_name}>", "exec"), _NAMESPACE)    # text written above
    converter: Callable[[Message], dict[str, Any]] = _NAMESPACE[ident]
    for nested in nested_types:        # after this one is in the namespace: a type may contain itself
        _converter(nested)
    return converter


def to_plain(msg: Message) -> dict[str, Any]:
    """`msg` as plain JSON-ready Python values in gpurm's shape (module doc)."""
    return _converter(msg.DESCRIPTOR)(msg)


# ---------------------------------------------------------------- JSON text straight from a message

class _EnumJson(dict[int, str]):
    """An enum's numbers to their names as JSON strings; a number this client's proto does not know yet as itself."""

    def __missing__(self, number: int) -> str:
        return f'"{number}"'


def _float(value: float) -> str:
    """A float as json.dumps writes it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


_BOOL = {True: "true", False: "false"}
_WRITERS: dict[str, Any] = {"_s": encode_basestring_ascii, "_bytes": _bytes, "_float": _float, "_bool": _BOOL}


def _scalar_json(field: Any, value: str, enum_ref: str, nested_ref: str) -> str:
    """The expression writing one value of `field` (a FieldDescriptor) as JSON text."""
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return f"_s({value})"
    if t == FieldDescriptor.TYPE_BYTES:
        return f"_s(_bytes({value}))"
    if t == FieldDescriptor.TYPE_BOOL:
        return f"_bool[{value}]"
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return f"_float({value})"
    if t == FieldDescriptor.TYPE_ENUM:
        return f"{enum_ref}[{value}]"
    if t == FieldDescriptor.TYPE_MESSAGE:
        return f"{nested_ref}({value})"
    return f"str({value})"                  # the integer types


def _json_writer(descriptor: Any) -> Callable[[Message], str]:
    """A function writing a message of this type as the JSON text json.dumps(to_plain(msg)) is, without the dicts:
    the keys written once into the function, each value by its type (a 100,000-job `gpurm jobs -o json` spent as
    long encoding the dicts as making them)."""
    ident = "j_" + descriptor.full_name.replace(".", "_")
    done: Callable[[Message], str] | None = _WRITERS.get(ident)
    if done is not None:
        return done
    parts = []
    nested_types = []
    for i, (name, shape, _) in enumerate(_plan(descriptor)):
        field = descriptor.fields_by_name[name]
        access = f"getattr(m, {name!r})" if keyword.iskeyword(name) or not name.isidentifier() else f"m.{name}"
        value_field = field.message_type.fields_by_name["value"] if shape == _MAP else field
        enum_ref = f"{ident}_e{i}"
        if value_field.type == FieldDescriptor.TYPE_ENUM:
            _WRITERS[enum_ref] = _EnumJson({v.number: json.dumps(enum_name(value_field.enum_type, v.number))
                                            for v in value_field.enum_type.values})
        nested_ref = ""
        if value_field.type == FieldDescriptor.TYPE_MESSAGE:
            nested_ref = "j_" + value_field.message_type.full_name.replace(".", "_")
            nested_types.append(value_field.message_type)
        one = _scalar_json(value_field, "v", enum_ref, nested_ref)
        if shape == _ONE and field.type == FieldDescriptor.TYPE_MESSAGE:
            # An unset message reads as its defaults: that text is the same every time.
            default_ref = f"{ident}_d{i}"
            _WRITERS[default_ref] = json.dumps(to_plain(message_factory.GetMessageClass(field.message_type)()))
            expr = f"({nested_ref}({access}) if m.HasField({name!r}) else {default_ref})"
        elif shape == _ONE:
            expr = _scalar_json(field, access, enum_ref, nested_ref)
        elif shape == _REPEATED:
            expr = f"('[' + ', '.join([{one} for v in {access}]) + ']' if {access} else '[]')"
        elif shape == _MAP:
            expr = (f"('{{' + ', '.join([_s(str(k)) + ': ' + {one} for k, v in sorted({access}.items())]) + '}}' "
                    f"if {access} else '{{}}')")
        else:
            expr = f"({_scalar_json(field, access, enum_ref, nested_ref)} if m.HasField({name!r}) else 'null')"
        parts.append((json.dumps(name), expr))
    # Each value into a local (an integer straight into the text), then one f-string of the literal parts (braces
    # doubled) and the values.
    lines = [f"    v{n} = {expr}\n" for n, (_, expr) in enumerate(parts) if not expr.startswith("str(m.")]
    text = "".join(("{{" if n == 0 else ", ") + key + ": {" + (expr[4:-1] if expr.startswith("str(m.") else f"v{n}")
                   + "}" for n, (key, expr) in enumerate(parts))
    source = f"def {ident}(m):\n" + "".join(lines) + f"    return f{(text + '}}' if parts else '{{}}')!r}\n"
    exec(compile(source, f"<jsonshape text {descriptor.full_name}>", "exec"), _WRITERS)    # text written above
    writer: Callable[[Message], str] = _WRITERS[ident]
    for nested in nested_types:        # after this one is in the namespace: a type may contain itself
        _json_writer(nested)
    return writer


ITEM_SEPARATOR = ",\n  "     # between the items of a listed array as `-o json` prints it (one item a line)


def to_json_text(msg: Message) -> str:
    """`msg` as JSON text on one line: exactly json.dumps(to_plain(msg)), several times faster."""
    return _json_writer(msg.DESCRIPTOR)(msg)
