"""The REST API's JSON shape for protobuf answers: gpurm's one shape (gpurm/common/jsonshape.py), the same as
`-o json`."""

from __future__ import annotations

from gpurm.common.jsonshape import enum_name, to_plain

to_json = to_plain

__all__ = ["enum_name", "to_json"]
