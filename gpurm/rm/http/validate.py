"""Request bodies checked against the OpenAPI document's own schemas (openapi.py), so that the document states
exactly what the server takes: a body the schema refuses is refused (400, naming the field), and the job-spec
rules (common/jobspec.py) then see only what the schema allows."""

from __future__ import annotations

import functools
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from gpurm.common.fields import ConfigError
from gpurm.rm.http import openapi

MAX_PROBLEMS = 5


@functools.lru_cache(maxsize=4)
def job_spec_validators(facts: openapi.Facts) -> tuple[Draft202012Validator, Draft202012Validator]:
    """The document's two shapes of a job spec (oneOf): whole GPUs, a share of one."""
    whole, shared = openapi.job_spec_input(facts)["oneOf"]
    return Draft202012Validator(whole), Draft202012Validator(shared)


KILL_VALIDATOR = Draft202012Validator(openapi.KILL_INPUT)


def _field(error: ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "body"


def _problem(error: ValidationError) -> str:
    where = _field(error)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in str(error.message) else "a field"
        return f"{missing if where == 'body' else where + '.' + missing}: is required"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(schema.get("properties", {}))) if isinstance(
            error.instance, dict) else []
        return f"{where}: unknown field {', '.join(map(repr, extra))[:120]} (see {openapi.DOC_PATH})"
    if "propertyNames" in error.schema_path:
        return (f"{where}: {str(error.instance)[:60]!r} is not an allowed name (a letter or _, then letters, digits "
                "or _; not CUDA_VISIBLE_DEVICES or GPURM_*)")
    described = schema.get("description")
    if error.validator in ("anyOf", "pattern", "enum") and described:
        return f"{where}: must be {described}; got {str(error.instance)[:60]!r}"
    if error.validator == "pattern":
        return f"{where}: {str(error.instance)[:60]!r} is not of the accepted form (see {openapi.DOC_PATH})"
    return f"{where}: {str(error.message)[:200]}"


def check(validator: Draft202012Validator, data: Any) -> None:
    """ConfigError listing (up to MAX_PROBLEMS) what the schema refuses in `data`, each naming its field."""
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError([_problem(e) for e in errors[:MAX_PROBLEMS]])


def check_job_spec(data: Any, facts: openapi.Facts) -> None:
    """As the document's oneOf, whose shapes differ in the type of `gpus` (text: a share of one GPU): checked
    against the shape `gpus` picks, so each problem names its field."""
    whole, shared = job_spec_validators(facts)
    shape = shared if isinstance(data, dict) and isinstance(data.get("gpus"), str) else whole
    check(shape, data)


def check_kill(data: Any) -> None:
    check(KILL_VALIDATOR, data)
