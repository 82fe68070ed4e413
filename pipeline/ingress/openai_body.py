"""OpenAI chat-completions request bodies -> the request document's `body` section."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pipeline.contracts.request import ChatBody, ChatMessage, ResponseFormat


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


def chat_body(body: dict[str, Any]) -> ChatBody:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BodyError("`messages` must be a non-empty list")
    images: list[str] = []
    msgs = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise BodyError("every message needs a `role`")
        msgs.append(ChatMessage(role=m["role"], content=_content(m.get("content", ""), images)))
    return ChatBody(
        messages=msgs,
        model=body.get("model"),
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        seed=body.get("seed"),
        images=images,
        logprobs=bool(body.get("logprobs", False)),
        response_format=response_format(body.get("response_format")),
    )
