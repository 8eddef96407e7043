"""What shape a request's output must take (structured output): JSON, JSON matching a schema, a regular
expression or one of fixed choices, as OpenAI's response_format and vLLM's guided_* fields ask. Checked
here for what needs no grammar compiler; the worker compiles it (worker/engine/grammar.py) and refuses
what its compiler cannot take, with the compiler's reason."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from services.common.errors import InvalidArgument

FIELD = "structured_output"  # the name errors give, on both APIs' paths


class StructureKind(Enum):
    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # JSON valid for spec, a JSON Schema document
    REGEX = "regex"  # text matching spec, a regular expression
    CHOICE = "choice"  # exactly one of choices


@dataclass(frozen=True)
class StructuredOutput:
    """kind; spec: the schema's JSON text (JSON_SCHEMA) or the expression (REGEX); choices (CHOICE).
    strict: for a schema, refuse properties it does not declare (OpenAI's strict), as vLLM does."""

    kind: StructureKind
    spec: str = ""
    choices: tuple[str, ...] = ()
    strict: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.kind is StructureKind.JSON_SCHEMA:
            try:
                schema = json.loads(self.spec)
            except ValueError as err:
                raise InvalidArgument(FIELD, f"the JSON schema is not valid JSON: {err}") from None
            if not isinstance(schema, dict):
                raise InvalidArgument(FIELD, "the JSON schema must be a JSON object")
        elif self.kind is StructureKind.REGEX and not self.spec:
            raise InvalidArgument(FIELD, "the regular expression is empty")
        elif self.kind is StructureKind.CHOICE and (not self.choices or not all(self.choices)):
            raise InvalidArgument(FIELD, "choices must be one or more non-empty strings")
