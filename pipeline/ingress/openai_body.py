"""OpenAI chat-completions request bodies -> the request document's `body` section."""

from __future__ import annotations

from typing import Any

from pipeline.contracts.request import ChatBody, ChatMessage


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
    )
