"""Answers that rest on tool results, in the cache (issue 39): by default a request with tools or
with tool results in its conversation bypasses the cache. A policy can opt in
(`cache_versioned_tool_results`) for answers that cannot be a call (no tools offered, or
`tool_choice: none`) whose every tool result carries a version in `context.tool_versions`, keyed by
its tool_call_id or its tool's name. The version stands for the result's data; what joins the
boundary (as part of `data_version`) is a digest of each result's tool name, its arguments and that
version, in conversation order, plus the offered tools' schemas: the same question over other
results, or under other tools, is another question.

Pure functions over the request; nothing here reads an index or a model.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import orjson

from pipeline.contracts import RequestDoc
from pipeline.contracts.request import ChatMessage, ToolCall

PLACEHOLDER = re.compile(r"<[A-Z_]+_\d+>")


def has_tool_exchange(doc: RequestDoc) -> bool:
    """Tools offered, or calls and their results in the conversation."""
    return bool(doc.body.tools) or any(m.role == "tool" or m.tool_calls for m in doc.body.messages)


def _results(doc: RequestDoc) -> Iterator[tuple[ChatMessage, ToolCall | None, str | None]]:
    """Each tool result in the conversation, with the call it answers and that result's declared
    version (by tool_call_id, else by tool name); None where either is missing."""
    calls = {c.id: c for m in doc.body.messages for c in (m.tool_calls or ())}
    versions = doc.context.tool_versions or {}
    for m in doc.body.messages:
        if m.role == "tool":
            call = calls.get(m.tool_call_id or "")
            yield m, call, None if call is None else versions.get(call.id) or versions.get(call.function.name)


def tool_bypass(doc: RequestDoc, opted_in: bool) -> str | None:
    """Why a request with a tool exchange may not use the cache (None: it may, as a versioned answer)."""
    if not opted_in:
        return "tools"  # the answer may be a call, or rest on a tool result no entry records the version of
    if doc.body.tools and doc.body.tool_choice != "none":
        return "tools"  # the answer may be a call: an entry is a text answer
    for m, call, version in _results(doc):
        if call is None or version is None:
            return "tool_result_unversioned"
        if PLACEHOLDER.search(call.function.arguments) or PLACEHOLDER.search(m.content):
            return "personal_entities"  # placeholders number entities per request: not one person's data
    return None


def tool_results_digest(doc: RequestDoc) -> str:
    """What the answer rests on besides the user's words: each result's (tool, arguments, version) and
    the offered tools. Arguments are compared as parsed JSON, so key order and spacing do not split."""
    parts: list[object] = [[t.model_dump(mode="json") for t in doc.body.tools]]
    for _, call, version in _results(doc):
        if call is not None:
            try:
                args: object = orjson.loads(call.function.arguments)
            except orjson.JSONDecodeError:
                args = call.function.arguments
            parts.append([call.function.name, args, version])
    return hashlib.sha256(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def conversation_turns(doc: RequestDoc) -> list[str]:
    """The roles of the conversation without its tool exchange (an assistant turn that only called
    tools, and the tools' results): what the cache's one-question rule looks at."""
    return [m.role for m in doc.body.messages
            if m.role != "tool" and not (m.role == "assistant" and m.tool_calls and not m.content.strip())]
