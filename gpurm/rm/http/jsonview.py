"""The REST API's one JSON shape for protobuf answers (docs/http.md, "JSON shape").

Every field is present (proto3 defaults included; an unset `optional` field is null), names are the proto field
names (snake_case), enum values drop their type's prefix as the CLI prints them (`SUCCEEDED`, not `JOB_SUCCEEDED`;
`RUNNING` for a node), 64-bit integers are JSON numbers (not strings, unlike protobuf's json_format), bytes are
UTF-8 text with bad bytes replaced.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message


@functools.cache
def _enum_prefix(enum: EnumDescriptor) -> str:
    """The prefix its values share (`JOB_` of JOB_QUEUED ...), the UNSPECIFIED value left out."""
    names = [v.name for v in enum.values if not v.name.endswith("_UNSPECIFIED")]
    common = names[0] if names else ""
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    return common[:common.rfind("_") + 1] if "_" in common else ""


def enum_name(enum: Any, number: int) -> str:
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    if value.name.endswith("_UNSPECIFIED"):
        return "UNSPECIFIED"
    return str(value.name).removeprefix(_enum_prefix(enum))


def _scalar(fd: Any, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(fd.enum_type, value)
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return to_json(value)
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return bytes(value).decode(errors="replace")
    return value


def to_json(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fd: Any
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            out[fd.name] = {str(k): _scalar(vfd, v) for k, v in sorted(value.items())}
        elif fd.is_repeated:
            out[fd.name] = [_scalar(fd, v) for v in value]
        elif fd.has_presence and fd.containing_oneof is not None and not msg.HasField(fd.name):
            out[fd.name] = None       # proto3 `optional`, unset
        else:
            out[fd.name] = _scalar(fd, value)
    return out
