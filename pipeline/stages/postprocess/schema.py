"""Validating an answer against the caller's JSON Schema without letting the schema reach out or
stall the worker.

Two things jsonschema does by itself are refused here:
1. Retrieval: a non-local `$ref` would be fetched with urllib (no timeout, any address, `file://`
   too). The validator gets a `referencing.Registry` whose retrieve refuses every URI, so an
   unresolvable reference is a schema error, never a connection. (The contract already refuses
   non-local refs with a clear 422; this is the guarantee behind it.)
2. Unbounded regexes: `pattern`, `patternProperties` and the `additionalProperties` check run with
   Python's `re`, which backtracks catastrophically while holding the GIL (heartbeats stop, the
   group rebalances, the record is redelivered to the next worker). They run here with the `regex`
   module under one time budget per validation; running out is an answer (`schema_invalid`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import orjson
import regex
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

PATTERN_BUDGET_S = 0.2  # every regex of one validation together
PATTERN_CALL_S = 0.05  # any single search


class PatternBudgetExceeded(RuntimeError):
    pass


def _refuse(uri: str):
    raise NoSuchResource(ref=uri)


NO_RETRIEVAL = Registry(retrieve=_refuse)  # type: ignore[call-arg]


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def search(self, pattern: str, text: str) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PatternBudgetExceeded
        try:
            return regex.search(pattern, text, timeout=min(PATTERN_CALL_S, left)) is not None
        except TimeoutError:
            raise PatternBudgetExceeded from None


def _bounded_validator(cls: type, budget: _Budget) -> type:
    def pattern(validator, patrn: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and not budget.search(patrn, instance):
            yield ValidationError("does not match the pattern")  # never quote the value: it may be PII

    def pattern_properties(validator, patterns: dict, instance: Any, schema: dict) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for k, v in instance.items():
                if budget.search(patrn, k):
                    yield from validator.descend(v, subschema, path=k, schema_path=patrn)

    def additional_properties(validator, aP: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        known = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        extras = [k for k in instance if k not in known and not any(budget.search(p, k) for p in patterns)]
        if validator.is_type(aP, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], aP, path=extra)
        elif not aP and extras:
            yield ValidationError(f"{len(extras)} additional properties are not allowed")

    return jsonschema.validators.extend(cls, {"pattern": pattern, "patternProperties": pattern_properties,
                                              "additionalProperties": additional_properties})


def schema_violation(text: str, schema: dict[str, Any], budget_s: float = PATTERN_BUDGET_S) -> str | None:
    """Why `text` is not a JSON document satisfying `schema` (None: it is). The reason names the
    failing path and rule, never the offending value (it may quote the prompt)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return f"not JSON ({str(exc).split(':')[0]})"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"the requested schema is itself invalid ({exc.validator})"
    validator = _bounded_validator(cls, _Budget(budget_s))(schema, registry=NO_RETRIEVAL)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except Unresolvable as exc:
        return f"the requested schema has a reference that does not resolve locally ({exc.__class__.__name__})"
    except PatternBudgetExceeded:
        return f"the requested schema's patterns took longer than {budget_s * 1000:.0f} ms to evaluate"
    except RecursionError:
        return "the requested schema recurses without end"
    if error is None:
        return None
    path = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"at {path}: violates '{error.validator}'"
