"""Bounds on a caller's JSON Schema (`response_format`), checked wherever a request is decoded.

The schema is hostile input: it is validated by postprocess and compiled into a grammar by the
engine. Here it must be small, shallow, self-contained (every `$ref` local, so nothing is ever
retrieved) and its regexes must compile. Evaluating those regexes in bounded time is
postprocess's job (pipeline/stages/postprocess/schema.py); a leaf module cannot enforce time.
"""

from __future__ import annotations

from typing import Any

import orjson
import regex

MAX_SCHEMA_BYTES = 32 << 10
MAX_SCHEMA_DEPTH = 24
MAX_PATTERN_CHARS = 512
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _walk(node: Any, depth: int, problems: list[str]) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        problems.append(f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
        return
    if isinstance(node, list):
        for item in node:
            _walk(item, depth + 1, problems)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        # A property *named* "$ref" or "pattern" maps to a schema (a dict): only string values are keywords.
        if key in REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
            problems.append(f"{key} {value[:80]!r} is not local: only '#...' references are resolved")
        if key == "pattern" and isinstance(value, str):
            _check_pattern(value, problems)
        if key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                _check_pattern(pattern, problems)
            if "unevaluatedProperties" in node:  # jsonschema matches these with unbounded `re`
                problems.append("patternProperties together with unevaluatedProperties is not supported")
        _walk(value, depth + 1, problems)


def _check_pattern(pattern: str, problems: list[str]) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        problems.append(f"a pattern is longer than {MAX_PATTERN_CHARS} characters")
        return
    try:
        regex.compile(pattern)
    except regex.error as exc:
        problems.append(f"a pattern does not compile ({exc.msg})")


def caller_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why this caller schema is refused (None: within bounds)."""
    size = len(orjson.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        return f"the JSON schema is {size} bytes (at most {MAX_SCHEMA_BYTES})"
    problems: list[str] = []
    _walk(schema, 0, problems)
    return problems[0] if problems else None
