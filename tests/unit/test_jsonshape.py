"""gpurm's one JSON shape (gpurm/common/jsonshape.py): enums spelled as the CLI's tables spell them, numbers as numbers,
every field present."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from gpurm.common.jsonshape import enum_name, to_json_text, to_plain
from gpurm.proto import gpurm_pb2 as pb


def test_states_lose_their_prefix_and_big_numbers_stay_numbers() -> None:
    job = pb.Job(job_id="job-7", state=pb.JOB_SUCCEEDED, submit_ms=1_790_000_000_123,
                 spec=pb.JobSpec(gpus=2, command=["x"], env={"B": "2", "A": "1"}),
                 attempts=[pb.Attempt(attempt=1, state=pb.JOB_FAILED, failure=pb.FAILURE_USER,
                                            learners=[pb.Learner(rank=0, gpu_indices=[0, 1])])])
    plain = to_plain(job)
    assert plain["state"] == "SUCCEEDED" and plain["submit_ms"] == 1_790_000_000_123
    assert plain["attempts"][0]["state"] == "FAILED" and plain["attempts"][0]["failure"] == "USER"
    assert plain["attempts"][0]["learners"][0]["gpu_indices"] == [0, 1]
    assert plain["spec"]["env"] == {"A": "1", "B": "2"} and plain["spec"]["gpus"] == 2
    assert plain["exit_code"] == 0 and plain["diagnostics"] == ""          # defaults are present
    json.dumps(plain)                                                          # JSON-ready as it is


def test_every_enum_of_the_protocol_reads_like_the_tables() -> None:
    assert to_plain(pb.NodeInfo(state=pb.NODE_LOST))["state"] == "LOST"
    assert enum_name(pb.ContainerStatus.DESCRIPTOR.fields_by_name["state"].enum_type, pb.CONTAINER_FAILED_TO_START) \
        == "FAILED_TO_START"
    assert enum_name(pb.ContainerStatus.DESCRIPTOR.fields_by_name["kind"].enum_type, pb.CONTAINER_LEARNER) \
        == "LEARNER"
    assert to_plain(pb.Job())["state"] == "UNSPECIFIED"
    assert enum_name(pb.Job.DESCRIPTOR.fields_by_name["state"].enum_type, 99) == "99"   # from a newer RM


def test_an_unset_optional_is_null_an_unset_message_is_its_defaults_and_bytes_are_text() -> None:
    plain = to_plain(pb.GetLogsResponse(data=b"loss 0.3\n\xff"))
    assert plain["data"] == "loss 0.3\n\ufffd"
    spec = to_plain(pb.Job())["spec"]
    assert spec["max_retries"] is None and spec["gpus"] == 0
    assert to_plain(pb.JobSpec(max_retries=0))["max_retries"] == 0


def _reference(msg: Any) -> dict[str, Any]:
    """The shape spelled out field by field (the module doc), to check the generated converters against."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)

        def one(v: Any, f: Any = field) -> Any:
            if f.type == FieldDescriptor.TYPE_ENUM:
                return enum_name(f.enum_type, v)
            if f.type == FieldDescriptor.TYPE_BYTES:
                return bytes(v).decode(errors="replace")
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                return _reference(v)
            return v

        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            out[field.name] = {str(k): one(v, field.message_type.fields_by_name["value"])
                               for k, v in sorted(value.items())}
        elif field.is_repeated:
            out[field.name] = [one(v) for v in value]
        elif field.has_presence and field.containing_oneof is not None:
            out[field.name] = one(value) if msg.HasField(field.name) else None
        else:
            out[field.name] = one(value)
    return out


def _filled(descriptor: Any, depth: int = 0) -> Any:
    """A message of this type with every field set (enums to a value a newer RM could send, too)."""
    msg = pb.__dict__[descriptor.name]() if descriptor.containing_type is None else None
    assert msg is not None
    for i, field in enumerate(descriptor.fields):
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    continue
                getattr(msg, field.name).update({"b": "2", "a": "1"})
            elif depth < 2:
                child = _filled(field.message_type, depth + 1)
                if field.is_repeated:
                    getattr(msg, field.name).extend([child, child])
                else:
                    getattr(msg, field.name).CopyFrom(child)
            continue
        sample: Any = {FieldDescriptor.TYPE_STRING: "s\u00e9", FieldDescriptor.TYPE_BYTES: b"log \xff",
                       FieldDescriptor.TYPE_BOOL: True, FieldDescriptor.TYPE_DOUBLE: 1.5,
                       FieldDescriptor.TYPE_FLOAT: 0.5, FieldDescriptor.TYPE_ENUM: 99 if i % 2 else 1,
                       }.get(field.type, 1 << 40 if field.type in (FieldDescriptor.TYPE_INT64,) else 7)
        if field.is_repeated:
            getattr(msg, field.name).extend([sample, sample])
        else:
            setattr(msg, field.name, sample)
    return msg


def test_every_message_type_converts_as_the_shape_spells_it_filled_or_empty() -> None:
    checked = 0
    for descriptor in pb.DESCRIPTOR.message_types_by_name.values():
        for msg in (pb.__dict__[descriptor.name](), _filled(descriptor)):
            assert to_plain(msg) == _reference(msg), descriptor.name
            assert json.dumps(to_plain(msg)) == json.dumps(_reference(msg)), descriptor.name   # the same key order
            checked += 1
    assert checked > 100


def test_the_json_text_written_straight_from_a_message_is_json_dumps_of_its_plain_shape() -> None:
    checked = 0
    for descriptor in pb.DESCRIPTOR.message_types_by_name.values():
        for msg in (pb.__dict__[descriptor.name](), _filled(descriptor)):
            assert to_json_text(msg) == json.dumps(to_plain(msg)), descriptor.name
            checked += 1
    odd = pb.Job(job_id='q"\\\n\t\u00e9\U0001f600\x00', spec=pb.JobSpec(env={"Z": "\u2603", "A": ""}),
                 attained_gpu_s=float("nan"), attempts=[pb.Attempt(attempt=1), pb.Attempt(attempt=2)])
    assert to_json_text(odd) == json.dumps(to_plain(odd))
    for value in (float("inf"), float("-inf"), 1e300, -0.0, 0.1):
        msg = pb.Job(attained_gpu_s=value)
        assert to_json_text(msg) == json.dumps(to_plain(msg))
    assert checked > 100
