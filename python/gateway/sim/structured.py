"""Structured output for the simulator: when a request asks for JSON, the answer is JSON, valid for
the schema it gave, as a real model with structured outputs answers.

Where each API takes it:
  chat completions  response_format: {type: json_schema, json_schema: {schema}} or {type: json_object}
  responses         text.format: {type: json_schema, schema} or {type: json_object}
  messages          output_config.format (or the beta's output_format): {type: json_schema, schema}
  gemini            generationConfig: {responseMimeType: application/json, responseJsonSchema}
  bedrock           outputConfig.textFormat: {type: json_schema, structure: {jsonSchema: {schema}}}
                    (Converse: the schema is a JSON string)

The value is built from the schema deterministically (the same schema, the same answer): every
property of an object (required ones and the rest), arrays with as many items as minItems asks (at
least one), an enum's or a const's first value, strings a word (or a date, e-mail, URI or UUID for
those formats) within minLength/maxLength, numbers within minimum/maximum, booleans true; anyOf and
oneOf take their first branch that is not null, allOf merges, $ref follows $defs/definitions.
A schema-less JSON request (json_object) gets an object holding the answer's words.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .words import WORDS

# Characters of the JSON text per streamed piece.
PIECE_CHARS = 8
MAX_DEPTH = 12


def requested_schema(req: dict[str, Any], api: str) -> dict[str, Any] | None:
    """The JSON schema the request asks its answer to follow ({} for JSON without a schema), or
    None for free text. `api`: "chat", "responses", "messages", "gemini" or "bedrock"."""
    fmt: Any
    if api == "bedrock":
        return _converse_schema(req)
    if api == "gemini":
        config = req.get("generationConfig")
        if not isinstance(config, dict) or config.get("responseMimeType") != "application/json":
            return None
        schema = config.get("responseJsonSchema")
        return schema if isinstance(schema, dict) else {}
    if api == "chat":
        fmt = req.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            fmt = {"type": "json_schema", "schema": spec.get("schema") if isinstance(spec, dict) else None}
    elif api == "responses":
        text = req.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    else:
        config = req.get("output_config")
        fmt = config.get("format") if isinstance(config, dict) else None
        if fmt is None:
            fmt = req.get("output_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {}
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return schema if isinstance(schema, dict) else {}
    return None


def _converse_schema(req: dict[str, Any]) -> dict[str, Any] | None:
    config = req.get("outputConfig")
    text_format = config.get("textFormat") if isinstance(config, dict) else None
    if not isinstance(text_format, dict) or text_format.get("type") != "json_schema":
        return None
    structure = text_format.get("structure")
    definition = structure.get("jsonSchema") if isinstance(structure, dict) else None
    text = definition.get("schema") if isinstance(definition, dict) else None
    try:
        schema = orjson.loads(text) if isinstance(text, str) else {}
    except orjson.JSONDecodeError:
        return {}
    return schema if isinstance(schema, dict) else {}


def answer_text(schema: dict[str, Any], words: list[str]) -> str:
    """The answer's JSON text: a value of the schema, or for a schema-less request an object with
    the words the answer would have said."""
    if not schema:
        return orjson.dumps({"answer": "".join(words).strip()}).decode()
    return orjson.dumps(value_for(schema, schema)).decode()


def pieces(text: str) -> list[str]:
    """The JSON text in the pieces a streaming model sends."""
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] or [""]


def value_for(schema: Any, root: dict[str, Any], name: str = "value", depth: int = 0) -> Any:
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return value_for(_resolve(ref, root), root, name, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            real = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
            return value_for((real or branches)[0], root, name, depth + 1)
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for given in parts:
            part = _resolve(given["$ref"], root) if isinstance(given, dict) and "$ref" in given else given
            if isinstance(part, dict):
                merged.setdefault("properties", {}).update(part.get("properties") or {})
                merged["required"] = [*merged.get("required", []), *(part.get("required") or [])]
                for k, v in part.items():
                    merged.setdefault(k, v)
        return value_for(merged, root, name, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like: the first real type
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        return {key: value_for(spec, root, key, depth + 1) for key, spec in properties.items()}
    if kind == "array":
        low = schema.get("minItems")
        high = schema.get("maxItems")
        count = max(low if isinstance(low, int) else 1, 1)
        if isinstance(high, int):
            count = min(count, high)
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            return [value_for(p, root, name, depth + 1) for p in prefix]
        return [value_for(items, root, f"{name}{i}", depth + 1) for i in range(count)]
    if kind in ("number", "integer"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema, name)


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """A local reference (#/$defs/X, #/definitions/X, # itself) within the root schema."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    value: float = 1
    low, high = schema.get("minimum"), schema.get("maximum")
    xlow, xhigh = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(low, int | float) and not isinstance(low, bool):
        value = max(value, low)
    if isinstance(xlow, int | float) and not isinstance(xlow, bool) and value <= xlow:
        value = xlow + 1
    if isinstance(high, int | float) and not isinstance(high, bool):
        value = min(value, high)
    if isinstance(xhigh, int | float) and not isinstance(xhigh, bool) and value >= xhigh:
        value = xhigh - (1 if integer else 0.5)
    if integer:
        return int(value) if float(value).is_integer() else int(value) + 1
    return value


FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "sim@example.com",
    "uri": "https://example.com/sim",
    "url": "https://example.com/sim",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _string(schema: dict[str, Any], name: str) -> str:
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    text = WORDS[int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest()) % len(WORDS)]
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int):
        while len(text) < low:
            text += " " + text
    if isinstance(high, int) and high >= 0:
        text = text[:high]
    return text
