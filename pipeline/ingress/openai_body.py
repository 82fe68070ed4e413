"""OpenAI chat-completions request bodies -> the request document's `body` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from pipeline.contracts.base import WireModel
from pipeline.contracts.request import (
    EPISODE_ID,
    ChatBody,
    ChatMessage,
    DeviceState,
    NamedToolChoice,
    RequestContext,
    ResponseFormat,
    Tool,
)


class BodyError(ValueError):
    pass


def _content(content: Any, images: list[str]) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text and image_url
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                url = part.get("image_url")
                images.append(url.get("url") if isinstance(url, dict) else str(url))
            else:
                raise BodyError(f"unsupported content part type {kind!r}")
        return "\n".join(texts)
    raise BodyError("message content must be a string or a list of content parts")


def response_format(value: Any) -> ResponseFormat | None:
    """OpenAI's response_format; `json_object` is the JSON Schema {"type": "object"}."""
    if value is None:
        return None
    if isinstance(value, dict) and value.get("type") == "json_object":
        return ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "json_object",
                                                                                     "schema": {"type": "object"}}})
    try:
        rf = ResponseFormat.model_validate(value)
    except ValidationError as exc:
        raise BodyError(f"invalid response_format: {exc.errors()[0]['msg']}") from None
    if rf.type == "json_schema" and rf.json_schema is None:
        raise BodyError("response_format of type json_schema needs a `json_schema` object")
    return rf


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def chat_body(body: dict[str, Any]) -> ChatBody:
    """The request's ChatBody; BodyError (or pydantic's ValidationError) says what is wrong."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BodyError("`messages` must be a non-empty list")
    n = body.get("n") or 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 8:
        raise BodyError("`n` must be an integer from 1 to 8")
    images: list[str] = []
    msgs = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise BodyError("every message needs a `role`")
        role = ROLES.get(m["role"])
        if role is None:
            raise BodyError(f"unsupported message role {m['role']!r}")
        msgs.append(ChatMessage(role=role, content=_content(m.get("content") or "", images),
                                tool_calls=m.get("tool_calls") or None, tool_call_id=m.get("tool_call_id")))
    return ChatBody(
        messages=msgs,
        model=body.get("model"),
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        seed=body.get("seed"),
        images=images,
        logprobs=bool(body.get("logprobs", False)),
        top_logprobs=_top_logprobs(body),
        response_format=response_format(body.get("response_format")),
        n=n,
        stop=_stop(body.get("stop")),
        presence_penalty=body.get("presence_penalty"),
        frequency_penalty=body.get("frequency_penalty"),
        logit_bias=_logit_bias(body.get("logit_bias")),
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
    )


def _top_logprobs(body: dict[str, Any]) -> int:
    k = body.get("top_logprobs")
    if k is None:
        return 0
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20:
        raise BodyError("`top_logprobs` must be an integer from 0 to 20")
    if k and body.get("logprobs") is not True:
        raise BodyError("`top_logprobs` needs `logprobs: true`")
    return k


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return value
    raise BodyError("`stop` must be a string or a list of strings")


def _logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BodyError("`logit_bias` must map token ids to biases")
    try:
        return {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise BodyError("`logit_bias` keys must be token ids and its values numbers") from None


def _tools(value: Any) -> list[Tool]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BodyError("`tools` must be a list of function tools")
    tools = []
    for i, t in enumerate(value):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise BodyError(f"tools[{i}]: only tools of type `function` are supported")
        try:
            tools.append(Tool.model_validate(t))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise BodyError(f"tools[{i}] {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return tools


def _tool_choice(value: Any) -> str | NamedToolChoice | None:
    if value is None or value in ("auto", "none", "required"):
        return value
    try:
        return NamedToolChoice.model_validate(value)
    except ValidationError:
        raise BodyError("`tool_choice` must be auto, none, required or {type: function, function: {name}}") from None


class Extension(WireModel):
    """The body's optional `llmpipe` object: what OpenAI's schema has no field for."""

    timeout_s: float | None = Field(None, gt=0, description="answer within this many seconds (the deadline)")
    context: RequestContext | None = None
    device_id: str | None = Field(None, max_length=128)
    device: DeviceState | None = None
    episode_id: str | None = Field(None, pattern=EPISODE_ID, description="the episode this request belongs to "
                                   "(also the `x-llmpipe-episode-id` header)")


@dataclass
class ChatRequest:
    body: ChatBody
    stream: bool
    include_usage: bool
    extension: Extension | None

    @property
    def timeout_s(self) -> float | None:
        return self.extension.timeout_s if self.extension else None


# OpenAI parameters the pipeline cannot honour: refused when set, never silently dropped
UNSUPPORTED = ("functions", "function_call", "audio", "prediction")


def chat_request(body: dict[str, Any]) -> ChatRequest:
    """A whole chat-completions request body. `user` is accepted and not kept: it may be PII, and
    the caller's identity comes from its API key."""
    for name in UNSUPPORTED:
        if body.get(name) not in (None, [], {}, 0, False):
            instead = " (use `tools` and `tool_choice`)" if name.startswith("function") else ""
            raise BodyError(f"`{name}` is not supported by this gateway{instead}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BodyError("`stream` must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BodyError("`stream_options` must be an object")
    ext = body.get("llmpipe")
    if stream and (body.get("n") or 1) != 1:
        raise BodyError("`stream` with `n` > 1 is not supported: stream one choice per request")
    if stream and body.get("top_logprobs"):  # deltas carry one logprob per token, not the alternatives
        raise BodyError("`top_logprobs` with `stream` is not supported: ask without streaming")
    return ChatRequest(body=chat_body(body), stream=stream, include_usage=bool(opts.get("include_usage", False)),
                       extension=Extension.model_validate(ext) if ext is not None else None)
