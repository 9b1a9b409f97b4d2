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
from typing import Any

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


def _scalar(field: Any, value: Any) -> Any:       # a FieldDescriptor (upb's or the pure one)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return bytes(value).decode(errors="replace")
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_plain(value)
    return value


def _is_map(field: Any) -> bool:
    return bool(field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)


def to_plain(msg: Message) -> dict[str, Any]:
    """`msg` as plain JSON-ready Python values in gpurm's shape (module doc)."""
    out: dict[str, Any] = {}
    field: Any
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {str(k): _scalar(value_field, v) for k, v in sorted(value.items())}
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        elif field.has_presence and field.containing_oneof is not None and not msg.HasField(field.name):
            out[field.name] = None      # an unset proto3 `optional` (a synthetic oneof)
        else:
            out[field.name] = _scalar(field, value)
    return out
