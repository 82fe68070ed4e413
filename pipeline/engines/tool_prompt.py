"""Tool calling for a model whose chat template knows no tools (SmolLM2's): the tools are described in
the system message, earlier calls and their results are written as text, and the answer is held to a
JSON Schema by vLLM's structured outputs, so that even a small model returns a well-formed call.

What the answer must be, by `tool_choice`:

- `none`, or no tools: free text; nothing is constrained.
- `auto`: {"answer": text} or {"tool_calls": [call, ...]}.
- `required`: {"tool_calls": [call, ...]}, at least one.
- a named function: {"tool_calls": [a call of that function]}.

A call is {"name": <one offered name>, "arguments": <that tool's parameters>}: one `anyOf` branch per
tool, so a name and its arguments always belong together. Strings and arrays the tool leaves unbounded
are bounded in the grammar (MAX_STRING characters, MAX_ITEMS items): a small model otherwise writes
one string until max_tokens (seen: an email body). The call still satisfies the tool's own schema.
Without `parallel_tool_calls`, one call.
`parse` reads the answer back and checks every call's arguments against its tool's schema: a call
that does not satisfy it is an error (`tool_call_invalid`), never repaired.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson

from pipeline.contracts.request import ChatBody

MAX_STRING = 120  # characters of an argument string whose schema sets no maxLength
MAX_ITEMS = 16  # items of an argument array whose schema sets no maxItems


class ToolCallInvalid(ValueError):
    """The model's answer is not a valid call of an offered tool."""


@dataclass(frozen=True)
class ToolSpec:
    """What the engine needs of the request's tools, as plain data (OpenAI's shapes)."""

    tools: tuple[dict[str, Any], ...]  # OpenAI function tools: {"type": "function", "function": {...}}
    choice: str = "auto"  # auto | none | required | the name of the one function to call
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def spec_for(body: ChatBody, kept: list[str] | None = None) -> ToolSpec | None:
    """A request body's tools as the engine takes them; `kept`: route's narrowing (None: all)."""
    if not body.tools:
        return None
    tools = tuple(t.model_dump(mode="json", exclude_none=True) for t in body.tools
                  if kept is None or t.function.name in kept)
    choice = body.tool_choice
    name = choice if isinstance(choice, str) else choice.name if choice is not None else "auto"
    return ToolSpec(tools, name, body.parallel_tool_calls)


def _fn(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"]


def system_text(spec: ToolSpec) -> str:
    lines = ["You can call these tools. To call tools, answer with JSON "
             '{"tool_calls": [{"name": ..., "arguments": {...}}]}; to answer the user, {"answer": "..."}.']
    for tool in spec.tools:
        f = _fn(tool)
        params = orjson.dumps(f.get("parameters") or {}).decode()
        lines.append(f"- {f['name']}: {f.get('description') or ''} Parameters: {params}")
    if spec.choice == "required":
        lines.append("You must call at least one tool.")
    elif spec.choice not in ("auto", "none"):
        lines.append(f"You must call {spec.choice}.")
    return "\n".join(lines)


def render(messages: list[dict[str, Any]], spec: ToolSpec) -> list[dict[str, str]]:
    """The conversation as plain role/content messages: the tools in the system message, an assistant's
    calls and a tool's result as JSON text."""
    out: list[dict[str, str]] = []
    for m in messages:
        content = m.get("content") or ""
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                     for c in m["tool_calls"]]
            content = orjson.dumps({"tool_calls": calls}).decode()
        elif m["role"] == "tool":
            content = orjson.dumps({"tool_result": content, "tool_call_id": m.get("tool_call_id")}).decode()
        out.append({"role": m["role"], "content": content})
    if not spec.active():
        return out
    tools = system_text(spec)
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{tools}"}, *out[1:]]
    return [{"role": "system", "content": tools}, *out]


def _arguments(text: Any) -> Any:
    try:
        return orjson.loads(text) if isinstance(text, str) else (text or {})
    except orjson.JSONDecodeError:
        return text  # the caller's own history: shown as it was sent


def bounded(schema: Any) -> Any:
    """`schema` with a maxLength on every string and a maxItems on every array that lack one."""
    if isinstance(schema, list):
        return [bounded(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("const", "enum", "default", "examples") else bounded(v)) for k, v in schema.items()}
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types and "maxLength" not in out and "enum" not in out and "const" not in out:
        out["maxLength"] = MAX_STRING
    if "array" in types and "maxItems" not in out:
        out["maxItems"] = MAX_ITEMS
    return out


def output_schema(spec: ToolSpec) -> dict[str, Any] | None:
    """The JSON Schema the answer must satisfy; None when the answer is free text."""
    if not spec.active():
        return None
    offered = spec.tools if spec.choice in ("auto", "required") else \
        tuple(t for t in spec.tools if _fn(t)["name"] == spec.choice)
    call = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                       "properties": {"name": {"const": _fn(t)["name"]},
                                      "arguments": bounded(_fn(t).get("parameters") or {"type": "object"})}}
                      for t in offered]}
    calls: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
    if not spec.parallel or spec.choice not in ("auto", "required"):
        calls["maxItems"] = 1
    wants_calls = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                   "properties": {"tool_calls": calls}}
    if spec.choice != "auto":
        return wants_calls
    answer = {"type": "object", "additionalProperties": False, "required": ["answer"],
              "properties": {"answer": {"type": "string"}}}
    return {"anyOf": [answer, wants_calls]}


def call_id(request_id: str, index: int) -> str:
    """A stable id per (request, call): a retried attempt names its calls the same."""
    return "call_" + hashlib.sha256(f"{request_id}:{index}".encode()).hexdigest()[:24]


def parse(text: str, spec: ToolSpec, request_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(answer text, OpenAI tool calls) from a constrained answer; ToolCallInvalid when it is not one."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ToolCallInvalid("the model's answer is not the JSON its tools require (cut off at max_tokens?)") \
            from None
    if isinstance(doc, dict) and isinstance(doc.get("answer"), str) and spec.choice == "auto":
        return doc["answer"], []
    raw = doc.get("tool_calls") if isinstance(doc, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ToolCallInvalid("the model's answer has no tool call")
    return None, check_calls([{"id": call_id(request_id, i), "type": "function",
                               "function": {"name": c.get("name") if isinstance(c, dict) else None,
                                            "arguments": orjson.dumps(c.get("arguments")).decode()
                                            if isinstance(c, dict) else "null"}}
                              for i, c in enumerate(raw)], spec)


def check_calls(calls: list[dict[str, Any]], spec: ToolSpec) -> list[dict[str, Any]]:
    """Every call names an offered tool (the one chosen, when one is) and its arguments satisfy that
    tool's parameters; ToolCallInvalid says which does not. Also for an engine that parsed the calls."""
    by_name = {_fn(t)["name"]: _fn(t) for t in spec.tools}
    if not spec.parallel and len(calls) > 1:
        raise ToolCallInvalid(f"{len(calls)} tool calls, and parallel_tool_calls is false")
    for c in calls:
        name = c["function"]["name"]
        fn = by_name.get(name)
        if fn is None:
            raise ToolCallInvalid(f"the model called {name!r}, which was not offered")
        if spec.choice not in ("auto", "required", "none") and name != spec.choice:
            raise ToolCallInvalid(f"the model called {name!r}, not the {spec.choice!r} tool_choice names")
        try:
            args = orjson.loads(c["function"]["arguments"])
        except orjson.JSONDecodeError:
            raise ToolCallInvalid(f"the arguments of {name!r} are not JSON") from None
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(fn.get("parameters") or {"type": "object"}).iter_errors(args))
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "(top)"
            # the rule and the place, never the message: it quotes the value, which may be personal data
            raise ToolCallInvalid(f"the arguments of {name!r} fail the parameters' {error.validator!r} rule "
                                  f"at {where}")
    return calls
