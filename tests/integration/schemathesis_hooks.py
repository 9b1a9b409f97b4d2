"""schemathesis hooks for tests/integration/test_http_schema.py (loaded by SCHEMATHESIS_HOOKS).

A job spec's rules between fields are stated in the document's words, not in JSON Schema, which cannot state them
(openapi.py: JobSpecInput's description). A generated body that the schema allows is made to follow them too, so
that a refusal of a schema-valid body is a real mismatch. A body that breaks the schema stays broken: only fields
of the right types are touched."""

from __future__ import annotations

from typing import Any

import schemathesis


def follow_the_rules_between_fields(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    gpus = body.get("gpus")
    if isinstance(gpus, dict) and isinstance(gpus.get("min"), int) and isinstance(gpus.get("max"), int) \
            and gpus["max"] < gpus["min"]:
        body["gpus"] = {**gpus, "max": gpus["min"]}
    if isinstance(gpus, str) and body.get("placement") == "spread":
        body["placement"] = "pack"
    command = body.get("command")
    if isinstance(command, list) and command[:2] == ["/bin/sh", "-c"] and len(command) == 2:
        body["command"] = [*command, "true"]
    return body


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    if ctx.operation.method.upper() == "POST" and ctx.operation.path == "/jobs":
        return follow_the_rules_between_fields(body)
    return body
